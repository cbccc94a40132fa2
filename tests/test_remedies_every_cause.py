"""Every named cause ends in a fix: with no libstdc++ on the node new enough for an op, the finding still
offers what can be done on this node (a rebuild with a compiler its libstdc++ serves), each saying whether
it was tried; and every playbook diagnosis that names a cause either has remedies or says why none can
exist on a node."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from test_forensics_e2e import PY, bash, check, env_with, findings

from zdoctor.core.model import Remedy
from zdoctor.core.present import verification_of, verification_text
from zdoctor.readers.gccver import glibcxx_for_gcc
from zdoctor.readers.versions import sort_key


def op_needing_gcc13(tmp_path: Path) -> Path:
    """op.so linked against a libstdc++.so.6 whose symbol zd_new_api is in GLIBCXX_3.4.31 (GCC 13's node):
    built as GCC 13 builds it, so the node's GCC 12 libstdc++ (up to GLIBCXX_3.4.30) fails it in ld.so."""
    built = tmp_path / "built-against"
    built.mkdir()
    (tmp_path / "stub.c").write_text("void zd_new_api(void) {}\n")
    (tmp_path / "stub.map").write_text("GLIBCXX_3.4.31 { global: zd_new_api; local: *; };\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "stub.c"),
                    f"-Wl,--version-script={tmp_path / 'stub.map'}",
                    "-Wl,-soname,libstdc++.so.6", "-o", str(built / "libstdc++.so.6")], check=True)
    (tmp_path / "op.c").write_text("void zd_new_api(void);\nvoid run_it(void) { zd_new_api(); }\n")
    op = tmp_path / "op.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "op.c"), f"-L{built}", "-l:libstdc++.so.6",
                    "-o", str(op)], check=True)
    shutil.rmtree(built)
    return op


def test_no_copy_new_enough_offers_a_rebuild_with_a_compiler_the_node_serves(tmp_path):
    op = op_needing_gcc13(tmp_path)
    cmd = shlex.join([PY, "-c", f"import ctypes; ctypes.CDLL({str(op)!r})"])
    env = env_with()
    real = bash(cmd, env)
    assert f"version `GLIBCXX_3.4.31' not found (required by {op})" in real.stderr

    rc, doc = check(["--python", PY, "--command", cmd], env)
    assert rc == 1
    (f,) = [x for x in findings(doc, "libs.glibcxx", "fail") if "op.so" in x["title"]]
    assert "GLIBCXX_3.4.31" in f["title"]
    assert "No libstdc++ copy zdoctor found defines every needed version" in f["detail"]
    assert f["remedies"], "a named cause with no remedy"
    # nothing on the node has the version, so nothing was 'fixed' by a re-run
    assert not [r for r in f["remedies"] if r["verified"]]
    rebuild = [r for r in f["remedies"] if r["title"].startswith("Rebuild op.so with ")]
    assert rebuild, [r["title"] for r in f["remedies"]]
    gxx = shutil.which("g++", path=env["PATH"])
    assert gxx and any(r["commands"] == [f"export CXX={gxx}"] for r in rebuild)
    for r in rebuild:  # each a compiler whose objects the loaded copy (GCC 12's, up to 3.4.30) serves
        v = verification_of(Remedy.from_dict(r))
        assert verification_text(v).startswith("not tried, because rebuilding the op needs its sources")
        assert "the loaded copy provides up to GLIBCXX_3.4.30" in r["explanation"]
        tool = r["commands"][-1].split("=", 1)[1]
        version = subprocess.run([tool, "-dumpfullversion"], capture_output=True, text=True).stdout.strip()
        assert sort_key(glibcxx_for_gcc(version) or "") <= sort_key("GLIBCXX_3.4.30")
        # the compiler really builds something the node's libstdc++ loads
        src = tmp_path / "probe.cpp"
        src.write_text("#include <string>\nint main() { std::string s(\"x\"); return s.size() - 1; }\n")
        subprocess.run([tool, str(src), "-o", str(tmp_path / "probe")], check=True)
        assert subprocess.run([str(tmp_path / "probe")]).returncode == 0
    # a Debian node: no RHEL gcc-toolset runtime sentence
    assert "gcc-toolset-N-runtime" not in f["detail"]


# --- the inventory: every named cause in the recorded scenarios ends in a fix -------------------------------

def recorded_snapshots() -> list[Path]:
    """Every recorded node: the practice scenarios' snapshots (made by tests/scenario_kit.py) and the
    snapshot fixtures."""
    from zdoctor.walk import practice

    fixtures = Path(__file__).parent / "fixtures"
    return [s.snapshot for s in practice.load_scenarios()] + sorted(fixtures.glob("snapshots/*.json"))


def cause_findings_without_remedy(snapshot: Path) -> list[str]:
    """In ``snapshot``'s replay, walked by every playbook: the failing findings that carry no remedy while
    their check does not say why none can exist (``no_remedy=`` of its registration), and the walks that end
    in a diagnosis naming a cause (not healthy, elsewhere, not_checked or unexplained) with no fix among the
    failing findings of the checks it shows."""
    from zdoctor.core.registry import CHECKS, owner_check
    from zdoctor.host import ReplayHost
    from zdoctor.walk.doctor import check as run_check
    from zdoctor.walk.doctor import select_playbooks
    from zdoctor.walk.playbook import load_all

    books = load_all()
    report = run_check(ReplayHost.load(str(snapshot)), playbooks=select_playbooks(list(books)))

    def declared(fid: str) -> bool:
        owner = owner_check(fid, CHECKS)
        return owner is not None and bool(CHECKS[owner].no_remedy)

    failing = [f for f in report.findings if f.status == "fail" and not f.id.startswith("symptom.")]
    out = [f"{snapshot.name}: {f.id}: {f.title}" for f in failing if not f.remedies and not declared(f.id)]
    for run in report.playbooks:
        pb = books[run.id]
        node = pb.nodes.get(str(run.diagnosis)) if run.diagnosis else None
        if node is None or node.kind != "diagnosis" or node.healthy or node.elsewhere or \
                node.id in (pb.not_checked, pb.unexplained):
            continue
        shown = [f for f in failing if owner_check(f.id, CHECKS) in node.checks]
        if shown and not any(f.remedies for f in shown) and not all(declared(f.id) for f in shown):
            out.append(f"{snapshot.name}: walk {pb.id} ends in {node.id} with no fix among "
                       + ", ".join(f.id for f in shown))
    return out


def test_every_named_cause_in_the_recorded_scenarios_ends_in_a_fix_or_says_why_none_can():
    gaps = [gap for snap in recorded_snapshots() for gap in cause_findings_without_remedy(snap)]
    assert not gaps, "\n".join(gaps)


def test_a_check_that_declares_no_remedy_says_why():
    from zdoctor.core.registry import CHECKS, load_vocabulary

    load_vocabulary()
    declared = {name: spec.no_remedy for name, spec in CHECKS.items() if spec.no_remedy}
    assert "libs.live" in declared
    for name, why in declared.items():
        assert len(why.split()) >= 8, (name, why)  # a reason, not a flag


def test_which_compilers_the_loaded_libstdcxx_serves_and_the_rebuild_of_a_jit_op():
    """GCC 12 objects need up to GLIBCXX_3.4.30, GCC 13's 3.4.31; a gcc-toolset g++ (recorded on a RHEL node)
    links the newer parts statically, so any system libstdc++ serves it. A JIT-built op's rebuild removes
    its folder first."""
    from zdoctor.layers.libraries.rebuildop import jit_dir_of, rebuild_remedy, serving_compilers

    gcc12 = {"name": "g++", "path": "/usr/bin/g++", "realpath": "/usr/bin/x86_64-linux-gnu-g++-12",
             "family": "gcc", "version": "12.2.0"}
    gcc13 = {"name": "g++", "path": "/opt/gcc13/bin/g++", "realpath": "/opt/gcc13/bin/g++", "family": "gcc",
             "version": "13.2.0"}
    toolset = {"name": "g++", "path": "/opt/rh/gcc-toolset-13/root/usr/bin/g++",
               "realpath": "/opt/rh/gcc-toolset-13/root/usr/bin/g++", "family": "gcc", "version": "13.1.1"}
    clang = {"name": "c++", "path": "/usr/bin/c++", "realpath": "/usr/bin/clang++", "family": "clang",
             "version": "16.0.6"}
    assert [c["path"] for c in serving_compilers([gcc12, gcc13, toolset, clang], "GLIBCXX_3.4.30")] == [
        "/usr/bin/g++", "/opt/rh/gcc-toolset-13/root/usr/bin/g++"]
    assert [c["path"] for c in serving_compilers([gcc12, gcc13], "GLIBCXX_3.4.28")] == []  # GCC 10's copy
    assert serving_compilers([gcc12], None) == []  # what the loaded copy has is unknown: no claim
    op = "/home/u/.cache/torch_extensions/py311_cu121/cpu_adam/cpu_adam.so"
    targets = [{"target": {"kind": "jit-op", "path": op, "name": "cpu_adam.so"}}]
    jit = jit_dir_of(op, targets)
    assert jit == "/home/u/.cache/torch_extensions/py311_cu121/cpu_adam"
    r = rebuild_remedy(op, jit, toolset, "GLIBCXX_3.4.25")
    assert r.commands == [f"rm -rf -- {jit}", "export CXX=/opt/rh/gcc-toolset-13/root/usr/bin/g++"]
    assert "gcc-toolset-13's g++ links the C++ parts newer" in r.explanation
    assert verification_of(r).state == "not_tried"
    assert jit_dir_of("/elsewhere/op.so", targets) is None


def test_a_rhel_node_is_told_a_gcc_toolset_runtime_ships_no_newer_libstdcxx():
    from zdoctor.core.model import ProbeResult
    from zdoctor.core.registry import Facts
    from zdoctor.layers.libraries.check_libs import _no_newer_runtime_lines

    def said(distro: dict) -> str:
        return " ".join(_no_newer_runtime_lines(Facts({"toolchain": ProbeResult("toolchain",
                                                                               facts={"distro": distro})})))

    assert "ships no newer libstdc++.so.6" in said({"id": "rocky", "id_like": ["rhel", "fedora"], "version_id": "9"})
    assert said({"id": "ubuntu", "id_like": ["debian"], "version_id": "22.04"}) == ""
    assert said({"id": None, "id_like": [], "version_id": None}) == ""  # unknown: no claim either way


def test_a_conda_interpreter_with_no_copy_new_enough_is_offered_its_envs_runtime(tmp_path):
    """The training python is a conda env's (DT_RPATH $ORIGIN/../lib, no libstdc++ of its own there) and no
    copy on the node has GLIBCXX_3.4.31: conda-forge's libstdcxx-ng of GCC 13 into that env is offered (not
    tried: it needs the network), beside the rebuild."""
    from envkit import make_conda_like_python

    op = op_needing_gcc13(tmp_path)
    prefix = tmp_path / "conda"
    py = make_conda_like_python(prefix)
    (prefix / "conda-meta").mkdir()
    cmd = shlex.join([str(py), "-c", f"import ctypes; ctypes.CDLL({str(op)!r})"])
    env = env_with()
    assert "version `GLIBCXX_3.4.31' not found" in bash(cmd, env).stderr
    rc, doc = check(["--python", str(py), "--command", cmd], env)
    assert rc == 1
    (f,) = [x for x in findings(doc, "libs.glibcxx", "fail") if "op.so" in x["title"]]
    conda = [r for r in f["remedies"] if "libstdcxx-ng" in " ".join(r["commands"])]
    assert conda, [r["title"] for r in f["remedies"]]
    assert "libstdcxx-ng>=13" in conda[0]["commands"][0] and f"-p {prefix}" in conda[0]["commands"][0]
    assert "-c conda-forge" in conda[0]["commands"][0]
    assert conda[0]["verification"] == {"state": "not_tried",
                                        "reason": "it needs the network (the conda-forge channel) and changes the env"}
    assert [r for r in f["remedies"] if r["title"].startswith("Rebuild op.so with ")]


def test_the_tool_starts_is_said_by_every_renderer_and_never_as_fixed(state_home: Path):
    """A remedy tried only by starting ninja reads "tried: the tool starts" in the terminal report and the
    Markdown and HTML exports of a recorded session, and is never recommended as the one that fixed it."""
    import io

    from zdoctor.core.model import Finding
    from zdoctor.report.export import render
    from zdoctor.report.terminal import print_report
    from zdoctor.walk.doctor import CheckReport
    from zdoctor.walk.session import SessionLog, load_events

    host = {"hostname": "gpu-node-7", "os": "Ubuntu 22.04.4 LTS", "kind": "live"}
    drop = Remedy("Drop /opt/old/lib from LD_LIBRARY_PATH", ["unset LD_LIBRARY_PATH"], tried=True,
                  tool_started=True, note="`ninja --version` without it printed 1.11.1; the failing command "
                                          "itself was not re-run")
    f = Finding("toolchain.jit-prereq.ninja", "fail", "ninja cannot start", remedies=[drop])
    log = SessionLog.create("check", ["check"], host)
    log.record("finding", {"finding": f.to_dict()})
    log.close(1)
    events = load_events(log.id)
    md, html = render(events, "md"), render(events, "html")
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host=host, findings=[f]), buf, verbose=True)
    buf.seek(0)
    terminal = buf.read()
    for text in (terminal, md.replace("\\", ""), html.replace("&#x27;", "'")):
        assert "tried: the tool starts" in text
        assert "tried: fixed" not in text and "tried and fixed the failing command" not in text
