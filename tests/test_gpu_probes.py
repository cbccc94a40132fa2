"""The GPU probes against real files and real processes: toolkits built on disk with an nvcc that runs, the
machine's own nvcc, NCCL libraries compiled here with a real ld.so.cache from ldconfig, a torch package that
answers torch.cuda.nccl.version() in a real interpreter, and ulimits read from a real child shell."""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_facts import banners, facts_of, h200_all

from zdoctor.core.registry import PROBES, load_vocabulary
from zdoctor.host import LiveHost, ReplayHost, snapshot_document
from zdoctor.layers.gpu import nccl
from zdoctor.layers.gpu.check_cuda import check_host_compiler, check_toolkit
from zdoctor.layers.gpu.check_nccl import check_nccl
from zdoctor.layers.gpu.probe_gpu import collect_cuda, collect_limits, collect_nccl, torch_nccl_subprocess
from zdoctor.readers import hostlimits as limits

SYS_PATH = "/usr/bin:/bin"


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def toolkit(root: Path, release: str, *, gcc_max: int = 13, version_json: bool = True) -> Path:
    """A CUDA toolkit directory whose bin/nvcc really runs and prints a real banner for ``release``."""
    banner = banners()["nvcc"].replace("release 13.0, V13.0.88", f"release {release}, V{release}.99")
    executable(root / "bin" / "nvcc", "#!/bin/sh\ncat <<'EOF'\n" + banner + "\nEOF\n")
    (root / "include" / "crt").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("/* runtime */\n")
    (root / "include" / "crt" / "host_config.h").write_text(
        f"#if defined(__GNUC__)\n\n#if __GNUC__ > {gcc_max}\n\n#error -- unsupported GNU version! gcc versions "
        f"later than {gcc_max} are not supported! The nvcc flag '-allow-unsupported-compiler' can be used to "
        "override this version check\n\n#endif\n#endif\n")
    if version_json:
        (root / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": f"{release}.1"}}))
    return root


def test_cuda_home_from_nvcc_on_path_with_its_host_config(tmp_path):
    tk = toolkit(tmp_path / "cuda-12.4", "12.4")
    facts, ev = collect_cuda({"PATH": f"{tk}/bin:{SYS_PATH}"}, toolkit_roots=(str(tmp_path),))
    assert facts["cuda_home"] == {"path": str(tk), "source": f"nvcc on PATH ({tk}/bin/nvcc)",
                                  "nvcc": f"{tk}/bin/nvcc", "headers": True, "exists": True}
    assert facts["nvcc"]["release"] == "12.4" and facts["nvcc"]["build"] == "V12.4.99"
    assert facts["host_config"]["gcc_max"] == 13 and facts["host_config"]["path"].endswith("crt/host_config.h")
    assert facts["toolkits"] == [{"path": str(tk), "realpath": str(tk), "version": "12.4", "source": "version.json",
                                  "nvcc": f"{tk}/bin/nvcc", "headers": True}]
    assert ev[0].table.rows[0] == ["CUDA_HOME (as torch finds it)", str(tk), f"nvcc on PATH ({tk}/bin/nvcc)"]
    assert json.loads(json.dumps(facts)) == facts


def test_an_nvcc_wrapper_on_path_gives_a_cuda_home_without_headers(tmp_path):
    tk = toolkit(tmp_path / "tk" / "cuda-13.0", "13.0", gcc_max=15, version_json=False)
    wrap = executable(tmp_path / "wrap" / "bin" / "nvcc", f'#!/bin/sh\nexec {tk}/bin/nvcc "$@"\n')
    env = {"PATH": f"{wrap.parent}:{SYS_PATH}"}
    cs, _ = collect_cuda(env, toolkit_roots=(str(tmp_path / "tk"),))
    assert cs["cuda_home"]["path"] == str(tmp_path / "wrap") and cs["cuda_home"]["headers"] is False
    assert cs["nvcc"]["release"] == "13.0"  # the wrapper runs
    assert cs["toolkits"][0]["version"] == "13.0" and cs["toolkits"][0]["source"] == "nvcc --version"
    assert "no crt/host_config.h" in cs["host_config"]["error"]
    base = h200_all()
    py = base["pyenv"]
    py["deepspeed"] = {"installed": True, "version": "0.19.8", "prebuilt_ops": []}
    f = {x.id: x for x in check_toolkit(facts_of(cuda_stack=cs, pyenv=py))}
    home = f["gpu.toolkit.cuda-home"]
    assert home.status == "warn" and "cuda_runtime.h: No such file or directory" in home.detail
    assert home.remedies[0].commands == [f"export CUDA_HOME={tk}", f'export PATH={tk}/bin:"$PATH"']
    assert f["gpu.toolkit.nvcc-version"].status == "ok"
    # the host compiler limit then comes from NVIDIA's table for 13.0
    hc = check_host_compiler(facts_of(cuda_stack=cs, pyenv=py, toolchain=base["toolchain"]))[0]
    assert hc.status == "ok" and "NVIDIA's host-compiler table for CUDA 13.0" in hc.detail


def test_torch_order_cuda_home_then_cuda_path_and_runtime_only_installs(tmp_path):
    tk = toolkit(tmp_path / "cuda-12.8", "12.8")
    runtime_only = tmp_path / "runtime-only"
    (runtime_only / "lib64").mkdir(parents=True)
    cs, _ = collect_cuda({"PATH": SYS_PATH, "CUDA_HOME": "", "CUDA_PATH": str(tk)}, toolkit_roots=())
    assert cs["cuda_home"]["path"] == str(tk) and cs["cuda_home"]["source"] == "$CUDA_PATH"
    cs, _ = collect_cuda({"PATH": f"{tk}/bin:{SYS_PATH}", "CUDA_HOME": str(runtime_only)}, toolkit_roots=())
    assert cs["cuda_home"]["source"] == "$CUDA_HOME" and cs["nvcc"]["exists"] is False
    assert cs["nvcc"]["error"] == f"no nvcc at {runtime_only}/bin/nvcc"
    py = h200_all()["pyenv"]
    py["torch"]["cuda"] = "12.8"
    home = check_toolkit(facts_of(cuda_stack=cs, pyenv=py))[0]
    assert home.status == "warn" and f"Unable to run {runtime_only}/bin/nvcc" in home.detail


def test_the_nvcc_of_this_machine():
    """Real data: whatever nvcc this machine has on PATH is found and read the way DeepSpeed reads it."""
    env = dict(os.environ)
    facts, _ = collect_cuda(env)
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found is None:
        assert facts["nvcc_on_path"] == []
        return
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
    want = re.search(r"release (\d+\.\d+)", out).group(1)
    assert facts["nvcc_on_path"][0] == found
    if not env.get("CUDA_HOME") and not env.get("CUDA_PATH"):
        assert facts["cuda_home"]["path"] == os.path.dirname(os.path.dirname(found))
        assert facts["nvcc"]["release"] == want


# -- NCCL -----------------------------------------------------------------------------------------------


def build_lib(path: Path, version_code: int) -> Path:
    """A real shared library with SONAME libnccl.so.2 and an ncclGetVersion, built by gcc."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / "nccl.c"
    src.write_text(f"int ncclGetVersion(int *v) {{ *v = {version_code}; return 0; }}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), "-Wl,-soname,libnccl.so.2", str(src)], check=True)
    src.unlink()
    return path


def versioned(dirpath: Path, version: str, code: int) -> Path:
    real = build_lib(dirpath / f"libnccl.so.{version}", code)
    (dirpath / "libnccl.so.2").symlink_to(real.name)
    return dirpath / "libnccl.so.2"


def dist_info(site: Path, name: str, size: int) -> None:
    d = site / name
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\n")
    (d / "RECORD").write_text(f"nvidia/nccl/lib/libnccl.so.2,sha256=x,{size}\nnvidia/nccl/__init__.py,,\n")


@pytest.fixture
def nccl_node(tmp_path):
    """A venv with torch's NCCL wheel (and a stray -cu12 wheel), a system NCCL in a real ld.so.cache, and an
    older NCCL on LD_LIBRARY_PATH."""
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    lib = build_lib(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2", 22809)
    size = lib.stat().st_size
    dist_info(site, "nvidia_nccl_cu13-2.28.9.dist-info", size)
    dist_info(site, "nvidia_nccl_cu12-2.21.5.dist-info", size + 4096)
    (site / "torch").mkdir()
    meta = site / "torch-2.11.0+cu130.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Name: torch\nVersion: 2.11.0+cu130\nRequires-Dist: filelock\n"
                                   'Requires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == "Linux"\n')
    system = versioned(tmp_path / "sys" / "lib", "2.28.3", 22803)
    llp = versioned(tmp_path / "opt nccl" / "lib", "2.18.3", 21803)
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{system.parent}\n")
    cache = tmp_path / "ld.so.cache"
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    subprocess.run([ldconfig, "-X", "-C", str(cache), "-f", str(conf)], check=True, capture_output=True)
    pyenv = {"target": {"resolved": sys.executable}, "error": None,
             "python": {"executable": sys.executable, "sys_path": [str(tmp_path / "nowhere"), str(site)]},
             "torch": {"installed": True, "import": {"state": "ok"}, "version": "2.11.0+cu130", "cuda": "13.0",
                       "location": str(site / "torch"), "mapped_libs": [str(lib)],
                       "cuda_check": {"state": "ok", "nccl": [2, 28, 9]}}}
    env = {"PATH": SYS_PATH, "LD_LIBRARY_PATH": f"/usr/local/nvidia/lib64:{llp.parent}"}
    return {"site": site, "lib": lib, "system": system, "llp": llp, "cache": cache, "pyenv": pyenv, "env": env}


def test_nccl_providers_from_real_files(nccl_node):
    n = nccl_node
    facts, ev = collect_nccl(n["env"], n["pyenv"], ld_cache=str(n["cache"]), ask_torch=False)
    assert json.loads(json.dumps(facts)) == facts
    by_kind = {p["kind"]: p for p in facts["providers"]}
    pip = by_kind["pip"]
    assert (pip["path"], pip["version"], pip["dist"], pip["loaded"]) == (str(n["lib"]), "2.28.9",
                                                                         "nvidia-nccl-cu13", True)
    assert pip["version_source"] == "nvidia-nccl-cu13 dist-info"  # RECORD's size names the owner of the file
    assert by_kind["system"]["path"] == str(n["system"]) and by_kind["system"]["version"] == "2.28.3"
    assert by_kind["ld_library_path"]["version"] == "2.18.3"
    assert all(p["soname"] == "libnccl.so.2" and p["elf_error"] is None for p in facts["providers"])
    assert facts["torch_requires"]["dist"] == "nvidia-nccl-cu13" and facts["torch_requires"]["version"] == "2.28.9"
    assert sorted(w["dist"] for w in facts["wheels"]) == ["nvidia-nccl-cu12", "nvidia-nccl-cu13"]
    assert facts["torch_nccl"] == "2.28.9"
    assert ev[0].table.highlight == [next(i for i, p in enumerate(facts["providers"]) if p["loaded"])]
    a = nccl.analyze(facts)
    assert a["status"] == "warn" and {p["kind"] for p in a["problems"]} >= {"two_wheels", "ld_library_path"}
    f = check_nccl(facts_of(nccl=facts, pyenv=n["pyenv"]))[0]
    cmds = [c for r in f.remedies for c in r.commands]
    assert f"{sys.executable} -m pip uninstall -y nvidia-nccl-cu12" in cmds
    assert "export LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in cmds  # only the directory of the other NCCL goes


MAPPED_NCCL = (
    "import ctypes, sys\n"
    "ctypes.CDLL(sys.argv[1])\n"
    "path = next(l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if 'libnccl.so' in l)\n"
    "v = ctypes.c_int(); ctypes.CDLL(path).ncclGetVersion(ctypes.byref(v))\n"
    "print(path, v.value)\n")


def loads_nccl(stub: Path, env: dict[str, str], before: str = "") -> tuple[str, int]:
    """The libnccl.so.2 the real loader maps for ``stub`` (and its ncclGetVersion), after ``before`` lines."""
    script = f"{before}\n{shlex.join([sys.executable, '-c', MAPPED_NCCL, str(stub)])}"
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    path, code = out.rsplit(None, 1)
    return path, int(code)


def test_a_wheel_reinstall_is_not_offered_while_an_older_nccl_on_ld_library_path_loads_first(tmp_path):
    """torch's NCCL wheel holds 2.28.9, as torch requires; an older 2.18.3 sits on LD_LIBRARY_PATH. A stand-in
    for libtorch_cuda, linked with a RUNPATH to the wheel (as torch's is), gets the older copy from the real
    loader, since LD_LIBRARY_PATH comes before RUNPATH. Reinstalling the wheel would change nothing: it is
    named as not offered, and the fix offered (the directory off LD_LIBRARY_PATH) makes the loader map the
    wheel's copy."""
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    wheel = build_lib(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2", 22809)
    dist_info(site, "nvidia_nccl_cu13-2.28.9.dist-info", wheel.stat().st_size)
    (site / "torch").mkdir()
    meta = site / "torch-2.11.0+cu130.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Name: torch\nVersion: 2.11.0+cu130\n"
                                   'Requires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == "Linux"\n')
    old = versioned(tmp_path / "opt nccl" / "lib", "2.18.3", 21803)
    src = tmp_path / "stub.c"
    src.write_text("int ncclGetVersion(int *v);\nint stub_version(void) { int v = 0; ncclGetVersion(&v); return v; }\n")
    stub = site / "torch" / "lib" / "libtorch_cuda_stub.so"
    stub.parent.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stub), str(src), f"-L{wheel.parent}", "-l:libnccl.so.2",
                    f"-Wl,--enable-new-dtags,-rpath,{wheel.parent}"], check=True)
    env = {"PATH": SYS_PATH, "LD_LIBRARY_PATH": f"/usr/local/nvidia/lib64:{old.parent}"}
    mapped, code = loads_nccl(stub, env)
    assert (os.path.realpath(mapped), code) == (os.path.realpath(old), 21803)  # the real loader took the old copy
    assert loads_nccl(stub, {"PATH": SYS_PATH})[1] == 22809  # without it, the RUNPATH finds the wheel's

    conf, cache = tmp_path / "ld.so.conf", tmp_path / "ld.so.cache"
    conf.write_text("")
    subprocess.run([shutil.which("ldconfig") or "/sbin/ldconfig", "-X", "-C", str(cache), "-f", str(conf)],
                   check=True, capture_output=True)
    pyenv = {"target": {"resolved": sys.executable}, "error": None,
             "python": {"executable": sys.executable, "sys_path": [str(site)]},
             "torch": {"installed": True, "import": {"state": "ok"}, "version": "2.11.0+cu130", "cuda": "13.0",
                       "location": str(site / "torch"), "mapped_libs": [mapped],
                       "cuda_check": {"state": "ok", "nccl": [2, 18, 3]}}}
    facts, _ = collect_nccl(env, pyenv, ld_cache=str(cache), ask_torch=False)
    f = check_nccl(facts_of(nccl=facts, pyenv=pyenv))[0]
    assert f.status == "fail"
    assert not any(any("pip install" in c for c in r.commands) for r in f.remedies)
    assert (f"Not offered: reinstalling nvidia-nccl-cu13==2.28.9 alone, because {old} (NCCL 2.18.3, from ld "
            "library path) is the copy the loader mapped") in f.detail
    assert "(the wheel already holds NCCL 2.28.9)" in f.detail
    (fix,) = f.remedies
    assert fix.commands == ["export LD_LIBRARY_PATH=/usr/local/nvidia/lib64"]
    mapped_after, code_after = loads_nccl(stub, env, before="\n".join(fix.commands))
    assert (os.path.realpath(mapped_after), code_after) == (os.path.realpath(wheel), 22809)

    # a wheel that is itself older gets its reinstall too, as the step after the LD_LIBRARY_PATH fix
    for p in facts["providers"]:
        if p["kind"] == "pip":
            p["version"] = "2.21.5"
    (fix,) = check_nccl(facts_of(nccl=facts, pyenv=pyenv))[0].remedies
    assert fix.commands == ["export LD_LIBRARY_PATH=/usr/local/nvidia/lib64",
                            f"{sys.executable} -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.28.9"]


def test_torch_nccl_version_from_a_real_interpreter(tmp_path, nccl_node):
    fake = tmp_path / "fake-torch"
    (fake / "torch" / "cuda").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("from . import cuda\n")
    (fake / "torch" / "cuda" / "__init__.py").write_text("from . import nccl\n")
    (fake / "torch" / "cuda" / "nccl.py").write_text("def version():\n    return (2, 21, 5)\n")
    env = {"PATH": SYS_PATH, "PYTHONPATH": str(fake)}
    v, err, ev = torch_nccl_subprocess(sys.executable, env)
    assert (v, err) == ("2.21.5", None) and ev.exit_code == 0
    n = nccl_node
    n["pyenv"]["torch"]["cuda_check"] = {"state": "ok", "nccl": None}
    facts, _ = collect_nccl({**n["env"], "PYTHONPATH": str(fake)}, n["pyenv"], ld_cache=str(n["cache"]))
    assert facts["torch_nccl"] == "2.21.5" and "subprocess" in facts["torch_nccl_source"]
    assert nccl.analyze(facts)["status"] == "fail"  # 2.21.5 runs where torch was built for 2.28.9
    v, err, _ = torch_nccl_subprocess(sys.executable, {"PATH": SYS_PATH, "PYTHONPATH": str(tmp_path / "none")})
    assert v is None and "exit code 1" in err


def test_nccl_probe_skips_without_a_cuda_torch(nccl_node):
    py = dict(nccl_node["pyenv"])
    py["torch"] = {**py["torch"], "cuda": None, "version": "2.13.0+cpu"}
    facts, ev = collect_nccl({"PATH": SYS_PATH}, py)
    assert facts["skipped"] == "torch 2.13.0+cpu is a CPU build (torch.version.cuda is None): it uses no NCCL"
    facts, _ = collect_nccl({"PATH": SYS_PATH}, {**py, "torch": {"installed": False}})
    assert facts["skipped"].startswith("torch is not installed in ")
    facts, _ = collect_nccl({"PATH": SYS_PATH}, {"error": "python3: not found on the target PATH"})
    assert "could not be probed: python3: not found" in facts["skipped"]


# -- limits ---------------------------------------------------------------------------------------------


def test_ulimits_are_read_from_a_child_of_the_training_environment():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = min(soft, 1000)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard))
    try:
        facts, ev = collect_limits({"PATH": SYS_PATH})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    t = facts["target"]
    assert t["nofile_soft"] == lower and t["error"] is None
    ml = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    assert t["memlock_soft_kb"] == ("unlimited" if ml == resource.RLIM_INFINITY else ml // 1024)
    assert ev[1].argv == ["/bin/sh", "-c", limits.ULIMIT_SCRIPT]
    assert facts["shm"]["total"] is None or facts["shm"]["total"] > 0
    assert json.loads(json.dumps(facts)) == facts


def test_shm_and_container_clues(tmp_path):
    info = limits.shm_info(str(tmp_path), mounts_text=f"tmpfs {tmp_path} tmpfs rw,size=65536k 0 0\n")
    assert info["total"] > 0 and info["fstype"] == "tmpfs" and info["options"] == "rw,size=65536k"
    assert limits.shm_info(str(tmp_path / "missing"))["error"].endswith("does not exist")
    (tmp_path / ".dockerenv").write_text("")
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/kubepods/besteffort/pod1\n")
    c = limits.container_info({}, root=str(tmp_path))
    assert c["in_container"] and c["kind"] == "docker" and "/proc/1/cgroup mentions kubepods" in c["clues"]
    assert limits.human(64 * 1024 ** 2) == "64 MiB" and limits.human(1.5 * 1024 ** 3) == "1.5 GiB"


# -- the probes through a live host, and replay ---------------------------------------------------------


def test_gpu_probes_on_this_machine_replay_identically():
    load_vocabulary()
    env = {**os.environ, "NCCL_ASYNC_ERROR_HANDLING": "1", "CUDA_VISIBLE_DEVICES": "0"}
    host = LiveHost(env=env, options={"gpus_per_node": 2})
    names = ["nvml", "cuda_stack", "gpu_env", "host_limits"]
    live = host.results(names)
    for n in names:
        assert live[n].status in ("ok", "skip"), (n, live[n].error)
        assert PROBES[n].timeout >= live[n].duration_s
    assert live["gpu_env"].facts["vars"]["NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert live["gpu_env"].facts["gpus_per_node"] == 2 and live["host_limits"].facts["gpus_per_node"] == 2
    doc = json.loads(json.dumps(snapshot_document(host)))
    replayed = ReplayHost(doc).results(names)
    for n in names:
        assert replayed[n].facts == live[n].facts and replayed[n].status == live[n].status
    if live["nvml"].status == "skip":
        assert live["nvml"].error == live["nvml"].facts["skipped"]

