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

from zdoctor.forensics.gccver import glibcxx_for_gcc
from zdoctor.forensics.versions import sort_key
from zdoctor.model import Remedy
from zdoctor.present import verification_of, verification_text


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
