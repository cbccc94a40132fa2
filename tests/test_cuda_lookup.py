"""The CUDA library lookup layer (probe ``cudalookup``, check ``cuda.lookup``) on real files: libraries built
with gcc (a driver libcuda.so.1, a toolkit stub, a CUDA 11 runtime and an extension that needs it), an
ld.so cache built by the real ldconfig and put over /etc/ld.so.cache in a private mount namespace, the real
linker and the real loader; the H200 node's recorded cache as the driver found in the cache."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zdoctor.core.model import ProbeResult
from zdoctor.core.nodelayers import layer_status
from zdoctor.core.registry import CHECKS, Facts
from zdoctor.layers.cuda_lookup import cudalookup as cl
from zdoctor.layers.cuda_lookup.check_cudalookup import check_cuda_lookup
from zdoctor.layers.cuda_lookup.cudafixes import link_plans
from zdoctor.layers.cuda_lookup.probe_cudalookup import collect_lookup, make_plans
from zdoctor.layers.libraries.audit import Target, static_audit
from zdoctor.readers.ldcache import format_ldconfig_p, read_ld_so_cache
from zdoctor.symptoms.extract import from_text
from zdoctor.trials.remedies import verify

H200 = Path(__file__).parent / "fixtures" / "gpu-node-h200"
ROOT = Path(__file__).resolve().parent.parent

#: One line each of the two generations of triton's libcuda lookup (enough for the rule reader).
TRITON3 = textwrap.dedent("""\
    libraries = ['cuda']
    def libcuda_dirs():
        env_libcuda_path = os.getenv("TRITON_LIBCUDA_PATH")
        locs = [line.split()[-1] for line in libs.splitlines() if "libcuda.so.1" in line]
        env_ld_library_path = os.getenv("LD_LIBRARY_PATH")
        assert any(os.path.exists(os.path.join(path, 'libcuda.so.1')) for path in dirs), msg
""")
TRITON2 = textwrap.dedent("""\
    def libcuda_dirs():
        locs = [line.split()[-1] for line in libs.splitlines() if "libcuda.so" in line]
        assert any(os.path.exists(os.path.join(path, 'libcuda.so')) for path in dirs), msg
    def _build(name, src, srcdir):
        cc_cmd = [cc, src, "-O3", "-shared", "-fPIC", "-lcuda", "-o", so]
""")


def _cc(args: list[str], cwd: Path) -> None:
    subprocess.run(["gcc", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> dict[str, Path]:
    """Real libraries: drv/libcuda.so.1 (cuInit returns 0), a toolkit stub (cuInit returns 34), a CUDA 11
    runtime libcudart.so.11.0, an extension that needs it, and an ld.so cache naming drv/."""
    if not shutil.which("gcc") or not os.path.exists("/sbin/ldconfig"):
        pytest.skip("needs gcc and /sbin/ldconfig")
    base = tmp_path_factory.mktemp("h4cudalookup")
    drv, stubs, cu11, ext = base / "drv", base / "toolkit/lib64/stubs", base / "cu11", base / "ext"
    for d in (drv, stubs, cu11, ext):
        d.mkdir(parents=True)
    (base / "cuda.c").write_text("int cuInit(unsigned f) { (void)f; return 0; }\n")
    (base / "stub.c").write_text("int cuInit(unsigned f) { (void)f; return 34; }\n")
    (base / "rt.c").write_text("int cudaRuntimeGetVersion(int *v) { *v = 11080; return 0; }\n")
    (base / "op.c").write_text("int cudaRuntimeGetVersion(int *);\nint op(void) { int v; return "
                               "cudaRuntimeGetVersion(&v); }\n")
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(drv / "libcuda.so.1"), "cuda.c"], base)
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so"), "stub.c"], base)
    os.symlink("libcuda.so", stubs / "libcuda.so.1")  # what images that run ldconfig on stubs/ end up with
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcudart.so.11.0", "-o", str(cu11 / "libcudart.so.11.0"), "rt.c"], base)
    _cc(["-shared", "-fPIC", "-o", str(ext / "op_cu11.so"), "op.c", f"-L{cu11}", "-l:libcudart.so.11.0"], base)
    (base / "ld.so.conf").write_text(f"{drv}\n")
    subprocess.run(["/sbin/ldconfig", "-X", "-C", str(base / "ld.so.cache"), "-f", str(base / "ld.so.conf")],
                   check=True, capture_output=True, timeout=60)
    return {"base": base, "drv": drv, "stubs": stubs, "cu11": cu11, "ext": ext / "op_cu11.so",
            "cache": base / "ld.so.cache", "toolkit": base / "toolkit"}


def h200_cudalookup() -> dict:
    """The cudalookup facts of the recorded H200 node: its ld.so cache and `ldconfig -p`, the libcuda.so.1 the
    LD_DEBUG record shows torch loading (through LD_LIBRARY_PATH), the CUDA sonames of torch's
    libtorch_cuda.so (its readelf record) and the CUDA 13 wheels that record loads them from."""
    import gzip
    import re

    entries = read_ld_so_cache(str(H200 / "ld.so.cache"))
    cached = cl.cache_libcuda(entries)
    lines = cl.parse_ldconfig_p((H200 / "ldconfig-p.txt").read_text())
    debug = gzip.decompress((H200 / "ld-debug-torch-cuda.txt.gz").read_bytes()).decode("utf-8", "replace")
    m = re.search(r"find library=libcuda\.so\.1 \[0\]; searching\n.*\(LD_LIBRARY_PATH\)\n.*trying file=(\S+)", debug)
    assert m is not None
    readelf = gzip.decompress((H200 / "readelf-libtorch_cuda.so.txt.gz").read_bytes()).decode()
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf)
    site = "/opt/torch/.venv/lib/python3.12/site-packages"
    wheels = {os.path.basename(p): os.path.normpath(p) for p in
              re.findall(r"file=(\S+/nvidia/[^/\s]+/lib/lib\S+\.so\.\d+)\b", debug)}
    needs = [n for n in map(cl.cuda_soname, needed) if n]
    for n in needs:
        n["found"] = True
    dirs = [{"dir": "/usr/local/nvidia/lib64", "files": {name: {"path": f"/usr/local/nvidia/lib64/{name}",
                                                               "exists": True, "link": None} for name in cached},
             "in_cache": True, "on_ld_library_path": True, "stubs": False}]
    return {"cache": {"path": "/etc/ld.so.cache", "error": None, "entries": len(entries), **cached},
            "ldconfig": {"argv": ["/sbin/ldconfig", "-p"], "ran": True, "error": None, "entries": len(lines),
                         "libcuda": [ln for ln in lines if "libcuda.so" in ln["name"]]},
            "driver_dirs": dirs, "toolkit_stubs": [],
            "loader": {"path": m.group(1), "realpath": m.group(1), "via": "LD_LIBRARY_PATH",
                       "label": "[LD_LIBRARY_PATH]", "error": None, "stub": False, "tried": []},
            "link": {"cc": None, "dirs": [], "error": None, "triton_dirs": [], "finds": None},
            "triton": {"installed": False, "version": None, "location": None},
            "torch": {"installed": True, "version": "2.11.0+cu130", "cuda": "13.0", "major": 13},
            "wheels": wheels,
            "extensions": [{"path": f"{site}/torch/lib/libtorch_cuda.so", "kind": "torch", "name": "libtorch_cuda.so",
                            "needs": needs, "error": None}],
            "libs_ran": True, "env": {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/usr/local/nvidia/lib"},
            "plans": {}}


def _facts(lookup: dict, symptoms_text: str = "") -> Facts:
    results = {"cudalookup": ProbeResult("cudalookup", facts=lookup)}
    if symptoms_text:
        found = from_text(symptoms_text, "command")
        results["symptoms"] = ProbeResult("symptoms", facts={"symptoms": [s.to_dict() for s in found]})
    return Facts(results)


def _pyenv(cuda: str | None = None, triton_dir: str | None = None) -> dict:
    py = {"python": {"executable": sys.executable},
          "torch": {"installed": True, "version": f"2.5.1+{'cu' + cuda.replace('.', '') if cuda else 'cpu'}",
                    "cuda": cuda, "location": None}}
    if triton_dir:
        py["packages"] = {"triton": {"installed": True, "version": "3.1.0", "location": triton_dir}}
    return py


def _by_id(findings) -> dict:
    return {f.id: f for f in findings}


# -------------------------------------------------------------------------------------------- rules
def test_triton_rule_is_read_from_the_installed_source_of_each_generation():
    new = cl.triton_rule({"backends/nvidia/driver.py": TRITON3})
    assert (new["search"], new["require"], new["link"], new["env_override"], new["ld_library_path"]) == \
        ("libcuda.so.1", "libcuda.so.1", "cuda", True, True)
    old = cl.triton_rule({"common/build.py": TRITON2})
    assert (old["search"], old["require"], old["link"], old["env_override"]) == ("libcuda.so", "libcuda.so", "cuda",
                                                                                 False)
    assert cl.triton_rule({"backends/nvidia/driver.py": "def other(): pass"})["state"] == "unknown"


def test_cuda_sonames_and_majors():
    assert cl.cuda_soname("libcudart.so.11.0") == {"soname": "libcudart.so.11.0", "family": "libcudart",
                                                   "major": 11, "is_cuda_major": True}
    assert cl.cuda_soname("libcufft.so.11")["is_cuda_major"] is False
    assert cl.cuda_soname("libstdc++.so.6") is None and cl.cuda_soname("libc.so.6") is None
    assert cl.cuda_major("12.4") == 12 and cl.cuda_major(None) is None and cl.cuda_major("garbage") is None


def test_h200_cache_has_the_driver_and_its_unversioned_link():
    entries = read_ld_so_cache(str(H200 / "ld.so.cache"))
    got = cl.cache_libcuda(entries)
    assert got["libcuda.so.1"] == ["/usr/local/nvidia/lib64/libcuda.so.1", "/lib/libcuda.so.1"]
    assert got["libcuda.so"] == ["/usr/local/nvidia/lib64/libcuda.so", "/lib/libcuda.so"]
    # the recorded `ldconfig -p` reads the same as the cache reader's lines: both generations of triton find it
    lines = cl.parse_ldconfig_p((H200 / "ldconfig-p.txt").read_text())
    assert [ln["line"] for ln in lines if "libcuda.so" in ln["name"]] == \
        [ln for ln in format_ldconfig_p(entries, "/etc/ld.so.cache")[1:] if ln.split()[0].startswith("libcuda.so")]
    for text in (TRITON3, TRITON2):
        rule = cl.triton_rule({"backends/nvidia/driver.py": text})
        locs = [ln["line"].split()[-1] for ln in lines if rule["search"] in ln["line"]]
        assert "/usr/local/nvidia/lib64/" + rule["require"] in locs
    lookup = {"cache": {"path": "/etc/ld.so.cache", **got}, "driver_dirs": [], "loader": {
        "path": "/usr/local/nvidia/lib64/libcuda.so.1", "label": "[ld.so.cache]", "stub": False},
        "triton": {"installed": False}, "libs_ran": True, "torch": {"installed": True, "version": "2.11.0+cu130",
                                                                    "cuda": "13.0", "major": 13}, "extensions": []}
    found = _by_id(check_cuda_lookup(_facts(lookup)))
    assert found["cuda.lookup.libcuda"].status == "ok"
    assert "/usr/local/nvidia/lib64/libcuda.so.1" in found["cuda.lookup.libcuda"].title


def test_h200_recorded_node_finds_every_cuda_library():
    """The H200's driver is in the cache and beside LD_LIBRARY_PATH; libtorch_cuda.so's CUDA 13 sonames
    (libcudart.so.13, libcublas.so.13 ...) fit torch's CUDA 13 and come from the cu13 wheels."""
    facts = h200_cudalookup()
    sonames = [n["soname"] for n in facts["extensions"][0]["needs"]]
    assert {"libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcudnn.so.9"} <= set(sonames)
    assert "libcudart.so.13" in facts["wheels"]
    found = _by_id(check_cuda_lookup(_facts(facts)))
    assert {f.status for f in found.values()} == {"ok"}, {f.id: f.title for f in found.values()}
    assert "fits torch's CUDA" in found["cuda.lookup.extensions"].title


# -------------------------------------------------------------------------------------------- real runs
_IN_NS = textwrap.dedent("""\
    import json, sys
    from zdoctor.layers.cuda_lookup.probe_cudalookup import collect_lookup
    env = json.loads(sys.argv[1]); pyenv = json.loads(sys.argv[2])
    facts, _ = collect_lookup(env, pyenv, {"targets": []}, dirs=json.loads(sys.argv[3]))
    print(json.dumps(facts))
""")


@pytest.mark.needs_root
def test_private_cache_read_by_the_probe_and_ldconfig(node, tmp_path):
    """The cache the real ldconfig built, bind-mounted over /etc/ld.so.cache for one process: the probe's
    reader, the real `/sbin/ldconfig -p` triton runs and the loader emulation all see drv/libcuda.so.1; triton
    3's lookup passes, its -lcuda link would not (only libcuda.so.1 there), triton 2's lookup fails."""
    if not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs root and unshare")
    for gen, text in (("3", TRITON3), ("2", TRITON2)):
        tdir = tmp_path / f"triton{gen}"
        (tdir / "backends/nvidia").mkdir(parents=True)
        (tdir / "backends/nvidia/driver.py").write_text(text)
    pyenv3, pyenv2 = _pyenv("12.4", str(tmp_path / "triton3")), _pyenv("12.4", str(tmp_path / "triton2"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    script = ("mount --bind \"$1\" /etc/ld.so.cache && shift && "
              "for p in \"$@\"; do PYTHONPATH=$ROOT \"$PY\" -c \"$SCRIPT\" \"$ENVJ\" \"$p\" \"$DIRS\"; done")
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(node["cache"]),
         json.dumps(pyenv3), json.dumps(pyenv2)],
        env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "ROOT": str(ROOT), "PY": sys.executable, "SCRIPT": _IN_NS,
             "ENVJ": json.dumps(env), "DIRS": json.dumps([])},
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    new, old = (json.loads(line) for line in out.stdout.splitlines())
    drv_lib = str(node["drv"] / "libcuda.so.1")
    assert new["cache"]["libcuda.so.1"] == [drv_lib] and new["cache"]["libcuda.so"] == []
    assert new["ldconfig"]["ran"] and [x["path"] for x in new["ldconfig"]["libcuda"]] == [drv_lib]
    assert new["loader"]["path"] == drv_lib and new["loader"]["via"] == "ld.so.cache"
    assert new["triton"]["lookup"]["error"] is None and new["triton"]["lookup"]["dirs"] == [str(node["drv"])]
    assert new["link"]["finds"] is None  # -L drv -lcuda: drv has only libcuda.so.1
    assert cl.lookup_problems(new)["link"] and not cl.lookup_problems(new)["triton"]
    assert old["triton"]["lookup"]["error"].startswith("libcuda.so cannot found!\nPossible files are located at "
                                                       f"['{drv_lib}']")
    # outside the namespace the node's own cache is untouched
    assert all(e.path != drv_lib for e in read_ld_so_cache("/etc/ld.so.cache"))
    # the check on those facts: the link fails, explaining ld's message; triton 2's lookup fails, explaining its
    found = _by_id(check_cuda_lookup(_facts(new, "/usr/bin/ld: cannot find -lcuda: No such file or directory\n")))
    assert found["cuda.lookup.libcuda"].status == "ok" and found["cuda.lookup.triton"].status == "ok"
    assert found["cuda.lookup.link"].status == "fail" and found["cuda.lookup.link"].explains
    assert "libcuda.so.1 is there" in found["cuda.lookup.link"].title
    found = _by_id(check_cuda_lookup(_facts(old, "AssertionError: libcuda.so cannot found!\n")))
    assert found["cuda.lookup.triton"].status == "fail" and found["cuda.lookup.triton"].explains


def test_real_linker_fails_on_libcuda_so_1_alone_and_the_link_remedy_fixes_it(node, tmp_path):
    """`ld: cannot find -lcuda` beside a libcuda.so.1, from the real linker, as triton links its launcher
    (-L TRITON_LIBCUDA_PATH or the lookup's directory, -lcuda); the private-link remedy, tried by re-running
    that link, makes it succeed without touching the driver's directory."""
    (tmp_path / "launcher.c").write_text("int cuInit(unsigned);\nint launch(void) { return cuInit(0); }\n")
    link = (f'cd {tmp_path} && gcc -shared -fPIC -o launcher.so launcher.c '
            f'-L"${{TRITON_LIBCUDA_PATH:-{node["drv"]}}}" -lcuda')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    first = subprocess.run(["/bin/sh", "-c", link], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode != 0 and "cannot find -lcuda" in first.stderr
    symptoms = from_text(first.stderr, "command")
    assert any(s.kind == "link-library-missing" and s.fields.get("library") == "cuda" for s in symptoms)
    facts = {"loader": {"path": str(node["drv"] / "libcuda.so.1"), "stub": False}, "toolkit_stubs": [],
             "driver_dirs": cl.driver_dirs([str(node["drv"])], {}, {})}
    plans = {p.key: p for p in link_plans(facts, env, ["ld: cannot find -lcuda"])}
    plan = plans["triton-libcuda-link-dir"]
    assert not plans["libcuda-dev-link"].verifiable and plans["libcuda-dev-link"].requires_root
    verify(plan, ["/bin/sh", "-c", link], env, timeout=60)
    assert plan.tried and plan.verified, plan.verification
    assert not os.path.exists(node["drv"] / "libcuda.so")  # the driver's directory is unchanged
    remedy = plan.to_remedy()
    assert remedy.verified and any("TRITON_LIBCUDA_PATH" in c for c in remedy.commands)
    # the toolkit's stubs directory serves -lcuda too, through LIBRARY_PATH
    stub_plans = {p.key: p for p in link_plans({**facts, "toolkit_stubs": [str(node["stubs"])]}, env, [])}
    lp = stub_plans["library-path-stubs"]
    verify(lp, ["/bin/sh", "-c", link], env, timeout=60)
    assert lp.verified, lp.verification


def test_extension_needing_cudart_11_in_a_cuda_12_environment(node):
    """The real loader fails on libcudart.so.11.0; the emulated static audit sees the same, and the check says
    to rebuild the op against this torch, explaining the loader's message."""
    real = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(node['ext'])!r})"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert real.returncode != 0 and "libcudart.so.11.0: cannot open shared object file" in real.stderr
    env = {"PATH": "/usr/bin:/bin"}
    audit = static_audit(sys.executable, env, [Target(str(node["ext"]), "ext", "op_cu11.so")])
    facts, _ = collect_lookup(env, _pyenv("12.4"), {"targets": audit["targets"]}, dirs=[])
    ext = facts["extensions"]
    assert ext and ext[0]["needs"][0]["soname"] == "libcudart.so.11.0" and ext[0]["needs"][0]["found"] is False
    found = _by_id(check_cuda_lookup(_facts(facts, real.stderr)))
    f = found["cuda.lookup.extensions"]
    assert f.status == "fail" and "rebuild the op against this torch" in f.title
    assert "CUDA 11, torch's is 12" in f.detail and f.explains
    # the same op found by the loader (its CUDA 11 runtime on LD_LIBRARY_PATH) still does not fit CUDA 12
    env11 = {**env, "LD_LIBRARY_PATH": str(node["cu11"])}
    audit = static_audit(sys.executable, env11, [Target(str(node["ext"]), "ext", "op_cu11.so")])
    facts, _ = collect_lookup(env11, _pyenv("12.4"), {"targets": audit["targets"]}, dirs=[])
    assert facts["extensions"][0]["needs"][0]["found"] is True
    assert _by_id(check_cuda_lookup(_facts(facts)))["cuda.lookup.extensions"].status == "fail"
    # with a CPU torch the check says torch has no CUDA major
    facts, _ = collect_lookup(env11, _pyenv(None), {"targets": audit["targets"]}, dirs=[])
    f = _by_id(check_cuda_lookup(_facts(facts)))["cuda.lookup.extensions"]
    assert f.status == "warn" and "no CUDA major" in f.detail


def test_stub_on_ld_library_path_shadows_the_driver_and_dropping_it_is_tried(node):
    """A toolkit's stubs directory first on LD_LIBRARY_PATH: the loader emulation picks the stub; the real
    process gets error 34 from it; the remedy that drops the entry is re-run and fixes it."""
    llp = f"{node['stubs']}:{node['drv']}"
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": llp}
    facts, _ = collect_lookup(env, _pyenv("12.4"), {"targets": []}, dirs=[])
    assert facts["loader"]["stub"] and facts["loader"]["via"] == "LD_LIBRARY_PATH"
    plans = make_plans(facts, env)
    run = [sys.executable, "-c", "import ctypes, sys; sys.exit(ctypes.CDLL('libcuda.so.1').cuInit(0))"]
    assert subprocess.run(run, env=env, timeout=60).returncode == 34  # the stub answered
    drop = plans["stub"][0]
    verify(drop, run, env, timeout=60)
    assert drop.verified and drop.env_changes == {"LD_LIBRARY_PATH": str(node["drv"])}
    facts["plans"] = {k: [p.to_dict() for p in v] for k, v in plans.items()}
    found = _by_id(check_cuda_lookup(_facts(facts, "RuntimeError: Unexpected error from cudaGetDeviceCount(). "
                                                   "Error 34: CUDA driver is a stub library\n")))
    stub = found["cuda.lookup.stub"]
    assert stub.status == "fail" and stub.explains and stub.remedies[0].verified


def test_driver_in_a_directory_the_cache_does_not_name(node):
    facts, _ = collect_lookup({"PATH": "/usr/bin:/bin"}, _pyenv("12.4"), {"targets": []}, dirs=[str(node["drv"])])
    assert cl.uncached_driver_dirs(facts) == [str(node["drv"])]
    plans = make_plans(facts, {})
    assert [p.key for p in plans["uncached"]] == ["driver-dir-ld-library-path"]
    facts["plans"] = {k: [p.to_dict() for p in v] for k, v in plans.items()}
    f = _by_id(check_cuda_lookup(_facts(facts)))["cuda.lookup.libcuda"]
    assert f.status == "fail" and str(node["drv"]) in f.title
    env_fix, create, rebuild = f.remedies
    assert "LD_LIBRARY_PATH" in env_fix.commands[0] and not env_fix.requires_root
    # the drop-in goes through the core's careful create under a free name; ldconfig is the second step
    assert create.action["kind"] == "file-create" and create.action["path"].startswith("/etc/ld.so.conf.d/")
    assert create.action["text"] == f"{node['drv']}\n" and create.step and create.requires_root
    assert rebuild.commands == ["ldconfig"] and rebuild.step and not rebuild.tried


def test_this_node_without_a_driver_is_not_examined_for_libcuda_but_the_extensions_are():
    """No NVIDIA driver here and a CPU torch: the libcuda part says why it was not examined, the extension
    part is a real verdict, so the layer counts as examined."""
    facts, _ = collect_lookup({"PATH": "/usr/bin:/bin"}, _pyenv(None), {"targets": []})
    if cl.has_driver(facts):
        pytest.skip("this node has an NVIDIA driver library")
    findings = check_cuda_lookup(_facts(facts))
    found = _by_id(findings)
    assert found["cuda.lookup.libcuda"].status == "skip" and "no NVIDIA driver library" in found[
        "cuda.lookup.libcuda"].title
    assert found["cuda.lookup.extensions"].status == "ok" and "CPU build" in found["cuda.lookup.extensions"].detail
    status = {x["id"]: x for x in layer_status({"cuda.lookup": CHECKS["cuda.lookup"].layer}, findings,
                                               lambda fid: "cuda.lookup")}
    assert status["cuda-lookup"]["status"] == "examined"
    none = check_cuda_lookup(Facts({}))
    assert [f.id for f in none] == ["cuda.lookup.not-checked"]


def test_a_triton_without_triton_libcuda_path_gets_only_the_fixes_it_reads():
    """triton 2.1 has no TRITON_LIBCUDA_PATH and stops in its lookup before any link: neither that variable nor
    LIBRARY_PATH can help, only the unversioned link beside the driver (root, shown, not tried)."""
    drv = {"dir": "/usr/lib/x86_64-linux-gnu", "owner_uid": 0}
    facts = {"loader": {"path": "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "stub": False},
             "toolkit_stubs": ["/usr/local/cuda/lib64/stubs"], "driver_dirs": [drv]}
    keys = [p.key for p in link_plans(facts, {}, [], triton_env=False, lookup_fails=True)]
    assert keys == ["libcuda-dev-link"]
    keys = [p.key for p in link_plans(facts, {}, [], triton_env=True, lookup_fails=True)]
    assert keys == ["triton-libcuda-link-dir", "triton-libcuda-stubs", "libcuda-dev-link"]
    # a driver directory a user owns gets no root command that writes into it
    drv["owner_uid"] = 1000
    assert [p.key for p in link_plans(facts, {}, [], triton_env=False, lookup_fails=True)] == []


def test_the_probe_tries_environment_fixes_only_on_a_failing_command(node):
    """The probe's trial step: with a failing --command each environment-only plan is re-run; without one,
    or when it did not fail, each plan says why it was not tried; root plans are never run."""
    from zdoctor.layers.cuda_lookup.probe_cudalookup import try_lookup_plans

    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": f"{node['stubs']}:{node['drv']}"}
    facts, _ = collect_lookup(env, _pyenv("12.4"), {"targets": []}, dirs=[])
    run = [sys.executable, "-c", "import ctypes, sys; sys.exit(ctypes.CDLL('libcuda.so.1').cuInit(0))"]
    plans = make_plans(facts, env)
    evidence = try_lookup_plans(plans, {"command": "python train.py", "ok": False, "argv": run}, env, 60)
    assert len(evidence) == 1 and plans["stub"][0].verified
    for live, said in (({}, "no failing --command"), ({"command": "x", "ok": True, "argv": run}, "did not fail")):
        plans = make_plans(facts, env)
        assert try_lookup_plans(plans, live, env, 60) == []
        assert not plans["stub"][0].tried and said in plans["stub"][0].verification


def test_hostile_inputs_give_facts_not_tracebacks(tmp_path):
    """A FIFO where triton's driver.py should be, a garbage ld.so.cache, an ldconfig that is not there."""
    tdir = tmp_path / "triton"
    (tdir / "backends/nvidia").mkdir(parents=True)
    os.mkfifo(tdir / "backends/nvidia/driver.py")
    assert cl.read_triton_sources(str(tdir)) == {}
    bad = tmp_path / "ld.so.cache"
    bad.write_bytes(b"glibc-ld.so.cache1.1" + b"\xff" * 10)
    facts, _ = collect_lookup({"PATH": "/usr/bin:/bin"}, _pyenv(None, str(tdir)), {"targets": []},
                              cache_path=str(bad), dirs=[], ldconfig=str(tmp_path / "no-ldconfig"))
    assert facts["cache"]["error"] and facts["cache"]["libcuda.so.1"] == []
    assert facts["ldconfig"]["ran"] is False and facts["ldconfig"]["error"]
    assert facts["triton"]["rule"]["state"] == "unknown"
    found = _by_id(check_cuda_lookup(_facts(facts)))
    assert found["cuda.lookup.triton"].status == "skip"


def test_the_gpu_stack_walk_ends_at_each_lookup_diagnosis():
    """The H200's recorded walk, with one lookup fact changed each time, ends at that problem's diagnosis."""
    from test_gpu_playbook import walk

    base = h200_cudalookup()
    stub = {**base, "loader": {**base["loader"], "path": "/usr/local/cuda/lib64/stubs/libcuda.so.1", "stub": True}}
    assert walk(cudalookup=stub)[-2:] == ["cuda-lookup", "diag-cuda-stub"]
    ext = copy.deepcopy(base)
    ext["extensions"].append({"path": "/opt/ops/op_cu11.so", "kind": "ext", "name": "op_cu11.so", "error": None,
                              "needs": [{**cl.cuda_soname("libcudart.so.11.0"), "found": False}]})
    assert walk(cudalookup=ext)[-1] == "diag-op-cuda-major"
    lcuda = copy.deepcopy(base)
    lcuda["triton"] = {"installed": True, "version": "3.1.0", "location": "/x/triton",
                       "rule": cl.triton_rule({"backends/nvidia/driver.py": TRITON3}),
                       "lookup": {"dirs": ["/usr/local/nvidia/lib64"], "error": None, "via": "ldconfig -p", "locs": []}}
    lcuda["link"] = {"cc": "/usr/bin/gcc", "dirs": ["/usr/lib/x86_64-linux-gnu"], "error": None,
                     "triton_dirs": ["/usr/local/nvidia/lib64"], "finds": None,
                     "searched": [{"dir": "/usr/local/nvidia/lib64", "dev": False, "so1": True}]}
    assert walk(cudalookup=lcuda)[-1] == "diag-lcuda"


def test_a_stale_cache_entry_for_the_driver_is_not_called_found(node, tmp_path):
    """The cache names a libcuda.so.1 that is gone (a driver upgrade without ldconfig): the loader finds
    nothing, and the finding says so instead of calling the driver found."""
    gone = tmp_path / "gone"
    shutil.copytree(node["drv"], gone)
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{gone}\n")
    cache = tmp_path / "ld.so.cache"
    subprocess.run(["/sbin/ldconfig", "-X", "-C", str(cache), "-f", str(conf)], check=True, capture_output=True,
                   timeout=60)
    shutil.rmtree(gone)
    facts, _ = collect_lookup({"PATH": "/usr/bin:/bin"}, _pyenv("12.4"), {"targets": []}, cache_path=str(cache),
                              dirs=[])
    assert facts["cache"]["libcuda.so.1"] == [str(gone / "libcuda.so.1")] and facts["loader"]["path"] is None
    f = _by_id(check_cuda_lookup(_facts(facts)))["cuda.lookup.libcuda"]
    assert f.status == "fail" and "stale" in f.detail


def test_a_stubs_directory_in_the_cache_is_found_and_its_fix_needs_root(node, tmp_path):
    """ldconfig run over a toolkit's stubs directory (named in ld.so.conf) puts the stub in the cache: the
    loader takes it from there, and the fix is the loader configuration's (root, shown, never tried)."""
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{node['stubs']}\n")
    cache = tmp_path / "ld.so.cache"
    subprocess.run(["/sbin/ldconfig", "-X", "-C", str(cache), "-f", str(conf)], check=True, capture_output=True,
                   timeout=60)
    facts, _ = collect_lookup({"PATH": "/usr/bin:/bin"}, _pyenv("12.4"), {"targets": []}, cache_path=str(cache),
                              dirs=[])
    assert facts["loader"]["via"] == "ld.so.cache" and facts["loader"]["stub"]
    assert not cl.has_driver(facts)  # a stub is no driver
    plans = make_plans(facts, {})
    assert [p.key for p in plans["stub"]] == ["drop-stubs-ld-cache"]
    assert plans["stub"][0].requires_root and not plans["stub"][0].verifiable
    found = _by_id(check_cuda_lookup(_facts(facts)))
    assert found["cuda.lookup.stub"].status == "fail" and found["cuda.lookup.libcuda"].status == "skip"


def test_cuda_12_needs_served_by_the_nvidia_wheels_fit_a_cuda_12_torch(node, tmp_path):
    """An op and torch's own library needing CUDA 12 sonames that pip's nvidia-* wheels ship, with a CUDA 12
    torch: every need fits, and the table names the wheel file that provides each."""
    site = tmp_path / "site-packages"
    rt, blas, tlib = site / "nvidia/cuda_runtime/lib", site / "nvidia/cublas/lib", site / "torch/lib"
    for d in (rt, blas, tlib):
        d.mkdir(parents=True)
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o", str(rt / "libcudart.so.12"), "rt.c"], node["base"])
    (tmp_path / "b.c").write_text("int cublasCreate_v2(void **h) { (void)h; return 0; }\n")
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcublas.so.12", "-o", str(blas / "libcublas.so.12"), "b.c"], tmp_path)
    _cc(["-shared", "-fPIC", "-o", str(tlib / "libtorch_cuda.so"), str(node["base"] / "op.c"), "-Wl,--no-as-needed",
         f"-L{rt}", "-l:libcudart.so.12", f"-L{blas}", "-l:libcublas.so.12"], tmp_path)
    op = tmp_path / "op_cu12.so"
    _cc(["-shared", "-fPIC", "-o", str(op), str(node["base"] / "op.c"), f"-L{rt}", "-l:libcudart.so.12",
         f"-Wl,-rpath,{rt}"], tmp_path)
    env = {"PATH": "/usr/bin:/bin"}
    audit = static_audit(sys.executable, env, [Target(str(op), "ext", "op_cu12.so")])
    pyenv = _pyenv("12.1")
    pyenv["torch"]["location"] = str(site / "torch")
    facts, _ = collect_lookup(env, pyenv, {"targets": audit["targets"]}, dirs=[])
    assert facts["wheels"]["libcudart.so.12"] == str(rt / "libcudart.so.12")
    assert {n["soname"] for e in facts["extensions"] for n in e["needs"]} == {"libcudart.so.12", "libcublas.so.12"}
    f = _by_id(check_cuda_lookup(_facts(facts)))["cuda.lookup.extensions"]
    assert f.status == "ok" and "fits torch's CUDA" in f.title
    rows = f.evidence[0].table.rows
    assert any(r[2] == "libcudart.so.12" and r[3] == str(rt / "libcudart.so.12") for r in rows)


def test_a_build_that_links_lcuda_beside_a_libcuda_so_1_is_fixed_by_a_tried_library_path(node, tmp_path):
    """Not triton's link: an op's own gcc line with -lcuda, on a node whose driver dir has only libcuda.so.1.
    The real linker fails; the probe's plans from that failing run put a private libcuda.so link first on
    LIBRARY_PATH, the re-run links, and the finding explains ld's message with that tried remedy."""
    from zdoctor.layers.cuda_lookup.probe_cudalookup import try_lookup_plans

    (tmp_path / "op.c").write_text("int cuInit(unsigned);\nint op(void) { return cuInit(0); }\n")
    build = f"cd {tmp_path} && gcc -shared -fPIC -o op.so op.c -lcuda"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "LIBRARY_PATH": "/nonexistent"}
    argv = ["/bin/sh", "-c", build]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode != 0 and "cannot find -lcuda" in first.stderr
    facts, _ = collect_lookup(env, _pyenv("12.4"), {"targets": []}, dirs=[str(node["drv"])])
    live = {"command": build, "ok": False, "argv": argv, "stderr_tail": first.stderr}
    plans = make_plans(facts, env, live)
    assert plans["link"][0].key == "library-path-link-dir"
    try_lookup_plans(plans, live, env, 60)
    assert plans["link"][0].verified, plans["link"][0].verification
    assert not os.path.exists(tmp_path / "home")  # tried in a private temp dir, nothing made for real
    facts["plans"] = {k: [p.to_dict() for p in v] for k, v in plans.items()}
    found = _by_id(check_cuda_lookup(_facts(facts, first.stderr)))
    link = found["cuda.lookup.link"]
    assert link.status == "fail" and link.explains and link.remedies[0].verified
    assert any(c.startswith("export LIBRARY_PATH=") and "/nonexistent" in c for c in link.remedies[0].commands)


def test_a_stubs_directory_with_only_libcuda_so_shadows_the_unversioned_name(node, tmp_path):
    """A real toolkit's stubs directory holds only libcuda.so: on LD_LIBRARY_PATH it leaves libcuda.so.1 to
    the driver but gives a dlopen of libcuda.so the stub (the real process gets 34 from it): a warning."""
    stubs = tmp_path / "cuda/lib64/stubs"
    stubs.mkdir(parents=True)
    shutil.copy(node["stubs"] / "libcuda.so", stubs / "libcuda.so")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": f"{stubs}:{node['drv']}"}
    run = [sys.executable, "-c", "import ctypes, sys; sys.exit(ctypes.CDLL('libcuda.so').cuInit(0))"]
    assert subprocess.run(run, env=env, timeout=60).returncode == 34
    facts, _ = collect_lookup(env, _pyenv("12.4"), {"targets": []}, dirs=[])
    assert not facts["loader"]["stub"] and facts["loader_dev"]["stub"]
    plans = make_plans(facts, env)
    assert plans["stub"][0].env_changes == {"LD_LIBRARY_PATH": str(node["drv"])}
    facts["plans"] = {k: [p.to_dict() for p in v] for k, v in plans.items()}
    stub = _by_id(check_cuda_lookup(_facts(facts)))["cuda.lookup.stub"]
    assert stub.status == "warn" and "unversioned libcuda.so" in stub.title


def test_without_torch_the_extension_part_is_not_checked():
    facts, _ = collect_lookup({"PATH": "/usr/bin:/bin"}, {"python": {"executable": sys.executable}}, {"targets": []},
                              dirs=[])
    f = _by_id(check_cuda_lookup(_facts(facts)))["cuda.lookup.extensions"]
    assert f.status == "skip" and "torch is not installed" in f.detail
