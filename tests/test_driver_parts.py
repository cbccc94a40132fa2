"""The driver's parts (gpu.driver-parts): the loaded kernel module against the libraries the loader gives,
the package record and its last change against the boot, Fabric Manager on NVSwitch systems, and the
libcuda.so.1 the training process resolves (forward compatibility).

The node is never touched: each broken state is a private mount namespace (``unshare -m``) with a tmpfs over
/proc/driver and /sys/module holding the module's two files, another ld.so.cache built by the real
``ldconfig`` over real ELF libraries (gcc, with the driver's sonames and versioned file names), and another
dpkg status file and apt history; zdoctor's probe runs inside it. The GPUs come from the H200 capture through
the real pynvml with its entry points replaced (NVML's real error codes), as in test_gpu_nvml.
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from test_gpu_facts import facts_of, h200_all, h200_nvml
from test_gpu_nvml import _raise, fake_h200, no_smi
from test_gpu_verdicts import PROC_MODULES

import zdoctor
from zdoctor.layers.driver_parts import driverpkg, fabricmanager, fwcompat
from zdoctor.layers.driver_parts.check_driverparts import check_driver_parts
from zdoctor.layers.driver_parts.probe_driverparts import collect_history, collect_packages, driver_mounts
from zdoctor.layers.gpu import cuda
from zdoctor.layers.gpu.check_cuda import check_runtime
from zdoctor.layers.gpu.probe_gpu import collect_nvml
from zdoctor.readers import kmod
from zdoctor.walk.doctor import layers_examined

NEEDS_NS = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("gcc")
                              or not shutil.which("ldconfig"), reason="needs root, unshare, gcc and ldconfig")

OLD, NEW, COMPAT = "570.86.15", "580.95.05", "590.48.01"
PROC_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
                "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 16 02:21:52 UTC 2025\nGCC version:  gcc version 13.3.0\n")
TORCH = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
         "calling NumCudaDevices() that might have already set an error? Error {n}: {msg} (Triggered internally at "
         "/pytorch/c10/cuda/CUDAFunctions.cpp:119.)")
FM_LOG = ("nv-fabricmanager[3228]: fabric manager NVIDIA GPU driver interface version 570.86.15 don't match with "
          "driver version 580.95.05. Please update with matching NVIDIA driver package.")

PROBE = textwrap.dedent("""
    import json, sys
    from zdoctor.host import LiveHost
    from zdoctor.core.registry import load_vocabulary
    load_vocabulary()
    r = LiveHost(python=sys.executable, env=json.loads(sys.argv[1])).results(["driver_parts"]).get("driver_parts")
    print(json.dumps({"status": r.status, "facts": r.facts, "error": r.error}))
""")


def _so(path: Path, soname: str) -> None:
    src = path.with_suffix(".c")
    src.write_text("int zdoctor_driver_part(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path), str(src)], check=True)
    os.symlink(path.name, path.parent / soname)


def _dpkg_status(*pkgs: tuple[str, str]) -> str:
    return "\n".join(f"Package: {n}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {v}\n"
                     f"Description: {n}\n" for n, v in (("libc6", "2.39-0ubuntu8"), *pkgs)) + "\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """Real driver libraries of release NEW behind the loader's cache, a compat directory with a newer
    libcuda, and the files each namespace mounts."""
    root = tmp_path_factory.mktemp("zdh2-driver-parts")
    lib = root / "usr-lib-nvidia"
    lib.mkdir()
    _so(lib / f"libcuda.so.{NEW}", "libcuda.so.1")
    _so(lib / f"libnvidia-ml.so.{NEW}", "libnvidia-ml.so.1")
    compat = root / "cuda-12.9" / "compat"
    compat.mkdir(parents=True)
    _so(compat / f"libcuda.so.{COMPAT}", "libcuda.so.1")
    (root / "ld.so.conf").write_text(f"{lib}\n")
    # -X: no links updated anywhere; the cache is the only thing written
    subprocess.run(["ldconfig", "-X", "-C", str(root / "ld.so.cache"), "-f", str(root / "ld.so.conf")], check=True)
    return root


def in_namespace(node: Path, *, module: str, status: str, history: str | None = None, nvswitch: bool = False,
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the driver_parts probe in a private mount namespace holding this node's driver parts."""
    case = node / f"case-{module}-{int(nvswitch)}-{len(os.listdir(node))}"
    case.mkdir()
    (case / "proc-version").write_text(PROC_VERSION.format(v=module))
    (case / "sys-version").write_text(module + "\n")
    (case / "status").write_text(status)
    (case / "history.log").write_text(history or "")
    q = {k: shlex.quote(str(case / k)) for k in ("proc-version", "sys-version", "status", "history.log")}
    setup = " && ".join([
        "mount -t tmpfs zdh2-driver /proc/driver", "mkdir -p /proc/driver/nvidia",
        f"cp {q['proc-version']} /proc/driver/nvidia/version",
        *(["mkdir /proc/driver/nvidia-nvswitch"] if nvswitch else []),
        "mount -t tmpfs zdh2-sysmodule /sys/module", "mkdir -p /sys/module/nvidia",
        f"cp {q['sys-version']} /sys/module/nvidia/version",
        f"mount --bind {shlex.quote(str(node / 'ld.so.cache'))} /etc/ld.so.cache",
        f"mount --bind {q['status']} /var/lib/dpkg/status",
        "mkdir -p /var/log/apt", "mount -t tmpfs zdh2-apt /var/log/apt",
        f"cp {q['history.log']} /var/log/apt/history.log", 'exec "$@"'])
    code = str(Path(zdoctor.__file__).resolve().parent.parent)
    target_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TZ": "UTC", **(env or {})}
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", setup, "sh", sys.executable, "-c", PROBE,
            json.dumps(target_env)]
    res = subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=120,
                         env={**os.environ, "PYTHONPATH": code, "TZ": "UTC"})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["status"] == "ok", out
    return out["facts"]


def _apt_entry(when: float, line: str, commandline: str = "/usr/bin/unattended-upgrade") -> str:
    stamp = time.strftime("%Y-%m-%d  %H:%M:%S", time.gmtime(when))
    return f"\nStart-Date: {stamp}\nCommandline: {commandline}\n{line}\nEnd-Date: {stamp}\n"


def _symptoms(*texts: str) -> dict[str, Any]:
    from zdoctor.symptoms.extract import from_text

    out, n = [], 1
    for t in texts:
        found = from_text(t, "symptom", "--symptom", start=n)
        out += [s.to_dict() for s in found]
        n += len(found)
    return {"symptoms": out}


def _by_id(findings):
    return {f.id: f for f in findings}


# -- (a) a driver upgraded under a running kernel module --------------------------------------------------


@NEEDS_NS
def test_a_driver_upgraded_after_boot_under_the_old_module_says_reboot_or_reload(node, monkeypatch, tmp_path):
    boot = driverpkg.boot_time(Path("/proc/stat").read_text())
    assert boot and boot < time.time() - 120
    rev = f"{NEW}-0ubuntu0.24.04.1"
    history = (_apt_entry(boot - 86400, "Install: htop:amd64 (3.3.0-4build1)", "apt-get install htop")
               + _apt_entry(time.time() - 60, f"Upgrade: libnvidia-compute-570:amd64 ({OLD}-0ubuntu1, {rev}), "
                            f"nvidia-driver-570:amd64 ({OLD}-0ubuntu1, {rev})"))
    dp = in_namespace(node, module=OLD, history=history, status=_dpkg_status(
        ("nvidia-driver-570", f"{NEW}-0ubuntu0.24.04.1"), ("libnvidia-compute-570", f"{NEW}-0ubuntu0.24.04.1")))
    assert dp["module"]["sys_release"] == OLD and dp["module"]["proc_release"] == OLD
    assert dp["libraries"]["nvml"]["release"] == NEW and dp["libraries"]["libcuda"]["release"] == NEW
    assert dp["libraries"]["libcuda"]["via"] == "ld.so.cache"
    assert dp["packages"] == {"manager": "dpkg", "source": "/var/lib/dpkg/status", "release": NEW, "error": None,
                              "installed": dp["packages"]["installed"]}
    assert dp["history"]["last_change"]["commandline"] == "/usr/bin/unattended-upgrade"
    # NVML as it answers then: its real error code through the real pynvml
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    nv, _ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert nv["library"]["error_kind"] == "driver_mismatch"
    sym = _symptoms("Failed to initialize NVML: Driver/library version mismatch",
                    TORCH.format(n=803, msg="system has unsupported display driver / cuda driver combination"))
    found = _by_id(check_driver_parts(facts_of(driver_parts=dp, nvml=nv, symptoms=sym)))
    m = found["gpu.driver-parts.module"]
    assert m.status == "fail"
    assert m.title == f"Kernel module {OLD} is still in memory, the installed driver is {NEW}: upgraded after this " \
                      "boot, reboot or reload"
    assert f"The driver package changed to libnvidia-compute-570 {NEW}-0ubuntu0.24.04.1" in m.detail
    assert f"after this boot at {time.strftime('%Y-%m-%d', time.localtime(boot))}" in m.detail
    assert f"and the module still in memory is {OLD}: reboot or reload the modules" in m.detail
    assert "CUDA error 803 (cudaErrorSystemDriverMismatch" in m.detail
    assert m.explains == ["S1", "S2"]
    assert [r.title for r in m.remedies] == ["Drain the node and reboot it"]  # no /proc/modules here: no reload
    # an unattended upgrade did it: holding the packages keeps the next one off (apt: the node is dpkg)
    assert "after the reboot, `apt-mark hold libnvidia-compute-570 nvidia-driver-570` keeps" in m.detail
    # libcuda is the libraries' release, newer than the module and not a compat library: 803 too
    lc = found["gpu.driver-parts.libcuda"]
    assert lc.status == "fail" and "CUDA error 803" in lc.title and "not a forward-compatibility" in lc.detail
    # the playbook stops at the driver step with this diagnosis
    assert _walk(nvml=nv, driver_parts=dp)[-2:] == ["driver", "diag-driver-upgraded"]


def test_the_reload_follows_proc_modules_and_a_change_before_boot_blames_the_module_package():
    dp = _facts_a()
    mods = kmod.parse_proc_modules(PROC_MODULES)
    dp["module"].update(modules=mods, unload_order=kmod.unload_order(mods))
    m = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.module"]
    reload = m.remedies[0]
    unload = next(c for c in reload.commands if c.startswith("modprobe -r")).split()[2:]
    assert unload[-1] == "nvidia" and unload.index("nvidia_drm") < unload.index("nvidia_modeset")
    dp.update(packages={**dp["packages"], "manager": "rpm"})  # an rpm node: dnf's versionlock
    m = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.module"]
    assert "`dnf versionlock add libnvidia-compute-570`" in m.detail
    dp["history"]["last_change"]["when"] = dp["boot_time"] - 3600
    m = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.module"]
    assert m.status == "fail" and "after this boot" not in m.title
    assert "was before this boot" in m.detail and "modinfo -F version nvidia" in m.detail
    # every part one release: ok, and it says where each came from
    dp["module"].update(release=NEW, sys_release=NEW, proc_release=NEW)
    m = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.module"]
    assert m.status == "ok" and f"libnvidia-ml.so.1 {NEW}, the package record {NEW}" in m.detail


def _facts_a() -> dict[str, Any]:
    """Recorded driver_parts facts of case (a), for the fast variations."""
    now = time.time()
    return {"module": {"loaded": True, "release": OLD, "sys_release": OLD, "proc_release": OLD, "modules": None,
                       "unload_order": None, "modules_error": "/proc/modules could not be read"},
            "packages": {"manager": "dpkg", "source": "/var/lib/dpkg/status", "release": NEW, "error": None,
                         "installed": [{"name": "libnvidia-compute-570", "version": f"{NEW}-0ubuntu1",
                                        "release": NEW}]},
            "distro": {"id": "ubuntu", "id_like": ["debian"], "version_id": "24.04"}, "boot_time": int(now - 7200),
            "libraries": {"nvml": {"path": "/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "release": NEW,
                                   "realpath": f"/lib/x86_64-linux-gnu/libnvidia-ml.so.{NEW}"},
                          "libcuda": {"path": "/lib/x86_64-linux-gnu/libcuda.so.1", "release": NEW, "process": "py",
                                      "realpath": f"/lib/x86_64-linux-gnu/libcuda.so.{NEW}", "via": "ld.so.cache",
                                      "label": "[ld.so.cache]"}, "env": {}},
            "mounted": [], "fabric": {"nvswitch": []},
            "history": {"read": ["/var/log/apt/history.log"], "last_change": {
                "start": "x", "when": now - 60, "commandline": "/usr/bin/unattended-upgrade",
                "changes": [{"action": "upgrade", "name": "libnvidia-compute-570", "old": f"{OLD}-0ubuntu1",
                             "new": f"{NEW}-0ubuntu1"}]}}}


# -- (b) a forward-compatibility libcuda on a GPU that does not support it -----------------------------------


@NEEDS_NS
def test_b_a_compat_libcuda_first_on_ld_library_path_on_a_geforce_is_cuda_error_804(node, monkeypatch, tmp_path):
    compat = str(node / "cuda-12.9" / "compat")
    dp = in_namespace(node, module=NEW, env={"LD_LIBRARY_PATH": f"{compat}:/opt/elsewhere"},
                      status=_dpkg_status(("libnvidia-compute-580", f"{NEW}-0ubuntu1")))
    lc = dp["libraries"]["libcuda"]
    assert (lc["via"], lc["dir"], lc["release"]) == ("LD_LIBRARY_PATH", compat, COMPAT), lc
    assert lc["realpath"] == f"{compat}/libcuda.so.{COMPAT}"
    assert lc["owner"]["manager"] == "unknown"  # built here: no package's file list names it
    # the GPU: the H200's NVML answers, as a GeForce board (its name and brand)
    fake_h200(monkeypatch, overrides={"nvmlDeviceGetName": lambda h: "NVIDIA GeForce RTX 4090",
                                      "nvmlDeviceGetBrand": lambda h: pynvml.NVML_BRAND_GEFORCE_RTX})
    nv, _ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert nv["gpus"][0]["brand"] == "GEFORCE_RTX"
    sym = _symptoms(TORCH.format(n=804, msg="forward compatibility was attempted on non supported HW"),
                    "RuntimeError: CUDA error: forward compatibility was attempted on non supported HW")
    found = _by_id(check_driver_parts(facts_of(driver_parts=dp, nvml=nv, symptoms=sym)))
    assert found["gpu.driver-parts.module"].status == "ok"  # the module and the driver's own libraries agree
    f = found["gpu.driver-parts.forward-compat"]
    assert f.status == "fail"
    assert f.title == f"Forward-compatibility libcuda {COMPAT} on GPU 0: NVIDIA GeForce RTX 4090: CUDA error 804"
    assert "CUDA error 804 (cudaErrorCompatNotSupportedOnDevice, 'forward compatibility was attempted on non " \
           "supported HW')" in f.detail and "Data Center GPUs" in f.detail
    assert f.explains == ["S1", "S2"]
    assert f.remedies[0].commands == ["export LD_LIBRARY_PATH=/opt/elsewhere"]
    # the same libraries on the H200, a data centre GPU: forward compatibility is what it is for
    fake_h200(monkeypatch)
    (tmp_path / "h200").mkdir()
    nv, _ev = collect_nvml(no_smi(tmp_path / "h200"), nv=pynvml)
    ok = _by_id(check_driver_parts(facts_of(driver_parts=dp, nvml=nv)))["gpu.driver-parts.forward-compat"]
    assert ok.status == "ok" and "on data centre GPUs" in ok.title
    # unknown GPUs: not a verdict either way
    unknown = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.forward-compat"]
    assert unknown.status == "warn" and "unknown" in unknown.title
    # the walk ends at the forward-compatibility diagnosis
    geforce = h200_nvml()
    geforce["gpus"][0].update(name="NVIDIA GeForce RTX 4090", brand="GEFORCE_RTX")
    assert _walk(nvml=geforce, driver_parts=dp)[-2:] == ["parts", "diag-forward-compat"]


def test_gpu_runtime_names_the_layer_of_802_803_804_and_999():
    from test_gpu_verdicts import TORCH_999, _facts_with

    for n, msg, layer, finding in ((802, "system not yet initialized", "driver-parts", "fabric-manager"),
                                   (803, "system has unsupported display driver / cuda driver combination",
                                    "driver-parts", "gpu.driver-parts.module"),
                                   (804, "forward compatibility was attempted on non supported HW", "driver-parts",
                                    "gpu.driver-parts.forward-compat")):
        err = cuda.cuda_init_error(TORCH.format(n=n, msg=msg))
        assert err["code"] == n and err["layer"]["layer"] == layer and finding in err["layer"]["finding"]
        f = _by_id(check_runtime(_facts_with({"available": False, "init_error": TORCH.format(n=n, msg=msg)})))
        assert "It comes from the layer 'The driver's parts' (driver-parts)" in f["gpu.runtime"].detail
        assert "Source: CUDA Runtime API" in f["gpu.runtime"].detail
    f = _by_id(check_runtime(_facts_with({"available": False, "init_error": TORCH_999})))["gpu.runtime"]
    assert "(kernel-log)" in f.detail and "NVRM and Xid" in f.detail


def test_which_gpus_forward_compatibility_is_for():
    assert fwcompat.datacenter_gpu("NVIDIA H200", "NVIDIA") is True
    assert fwcompat.datacenter_gpu("Tesla V100-SXM2-32GB") is True
    assert fwcompat.datacenter_gpu("NVIDIA A100-SXM4-80GB", None) is True
    assert fwcompat.datacenter_gpu("NVIDIA GeForce RTX 4090", "GEFORCE_RTX") is False
    assert fwcompat.datacenter_gpu("NVIDIA RTX A6000", "NVIDIA_RTX") is False
    assert fwcompat.datacenter_gpu("Quadro RTX 8000") is False
    assert fwcompat.datacenter_gpu("Some New Board") is None
    assert fwcompat.datacenter_gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA_RTX") is None
    assert fwcompat.in_compat_dir("/usr/local/cuda-12.8/compat/libcuda.so.570.124.06")
    assert not fwcompat.in_compat_dir("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05")
    older = fwcompat.libcuda_verdict("/opt/old/libcuda.so.535.54.03", NEW, [])
    assert (older["verdict"], older["code"]) == ("older", 803)
    assert fwcompat.libcuda_verdict("/x/libcuda.so.1", NEW, [])["verdict"] == "unknown"


# -- (c) a Fabric Manager of another release on an NVSwitch system --------------------------------------------


@NEEDS_NS
def test_c_an_nvswitch_system_whose_fabric_manager_is_another_release_is_cuda_error_802(node):
    dp = in_namespace(node, module=NEW, nvswitch=True, status=_dpkg_status(
        ("libnvidia-compute-580", f"{NEW}-0ubuntu1"), ("nvidia-driver-580", f"{NEW}-0ubuntu1"),
        ("nvidia-fabricmanager-570", f"{OLD}-1")))
    fab = dp["fabric"]
    assert fab["nvswitch"] == ["/proc/driver/nvidia-nvswitch"]
    assert fab["version"] == OLD and fab["version_source"] == f"package nvidia-fabricmanager-570 {OLD}-1"
    # no systemd here: systemctl runs and says why it cannot answer
    assert fab["unit"] is None and fab["unit_error"], fab
    sym = _symptoms(TORCH.format(n=802, msg="system not yet initialized"), FM_LOG)
    f = _by_id(check_driver_parts(facts_of(driver_parts=dp, symptoms=sym)))["gpu.driver-parts.fabric-manager"]
    assert f.status == "fail"
    assert f.title == f"Fabric Manager {OLD} is not the driver's release {NEW}: CUDA error 802 (system not yet " \
                      "initialized)"
    assert "CUDA error 802 (cudaErrorSystemNotReady, 'system not yet initialized')" in f.detail
    assert f.explains == ["S1", "S2"]
    (apt,) = f.remedies  # Ubuntu: apt only, the driver package's own version pinned
    assert apt.commands[1] == f"apt-get install -y nvidia-fabricmanager-580={NEW}-0ubuntu1"
    assert apt.commands[2:] == ["systemctl restart nvidia-fabricmanager", "systemctl is-active nvidia-fabricmanager"]
    assert _walk(driver_parts=dp)[-2:] == ["parts", "diag-fabric-manager"]


def test_fabric_manager_state_from_recorded_systemctl_and_journal_output():
    # `systemctl show nvidia-fabricmanager -p LoadState,ActiveState,SubState,ExecMainStatus,...` of a failed unit
    failed = ("LoadState=loaded\nActiveState=failed\nSubState=failed\nExecMainStatus=1\n"
              "ExecMainStartTimestamp=Fri 2026-01-30 11:58:43 UTC\n")
    unit = fabricmanager.unit_state(fabricmanager.parse_systemctl_show(failed))
    assert unit == {"load": "loaded", "active": "failed", "sub": "failed", "status": 1, "running": False}
    running = fabricmanager.unit_state(fabricmanager.parse_systemctl_show(
        "LoadState=loaded\nActiveState=active\nSubState=running\nExecMainStatus=0\n"))
    assert running["running"] is True
    assert fabricmanager.unit_state({"LoadState": "not-found", "ActiveState": "inactive"})["running"] is None
    assert fabricmanager.log_mismatch(f"Starting NVIDIA fabric manager service...\n{FM_LOG}\n") == {
        "line": FM_LOG, "fm": OLD, "driver": NEW}
    newer = FM_LOG.replace("don't", "doesn't")
    assert fabricmanager.log_mismatch(newer)["fm"] == OLD
    assert fabricmanager.parse_version_output("Fabric Manager version is : 580.95.05") == NEW
    # a failed unit of the right release: 802, restart it
    dp = _facts_a()
    dp["module"].update(release=NEW, sys_release=NEW, proc_release=NEW)
    dp["fabric"] = {"nvswitch": ["/dev/nvidia-nvswitch0"], "unit": unit, "unit_error": None, "version": NEW,
                    "version_source": "package nvidia-fabricmanager-580", "log_mismatch": None}
    f = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.fabric-manager"]
    assert f.status == "fail" and "is failed/failed (exit status 1)" in f.title
    assert f.remedies[0].commands[0] == "systemctl enable --now nvidia-fabricmanager"
    dp["fabric"]["unit"] = running
    f = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.fabric-manager"]
    assert f.status == "ok" and f.title == f"Fabric Manager {NEW} runs, the driver's release"
    # RHEL: dnf, with RHEL's package name
    dp["distro"] = {"id": "rocky", "id_like": ["rhel", "centos", "fedora"], "version_id": "9.4"}
    dp["fabric"]["version"] = OLD
    (dnf,) = _by_id(check_driver_parts(facts_of(driver_parts=dp)))["gpu.driver-parts.fabric-manager"].remedies
    assert dnf.commands[0] == f"dnf install -y nvidia-fabric-manager-{NEW}"


def test_driver_libraries_a_container_runtime_mounted(tmp_path):
    # mountinfo of a container the NVIDIA runtime started: the host's libraries bind-mounted one by one
    (tmp_path / "mountinfo").write_text(
        "1001 950 0:52 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
        f"1020 1001 259:1 /usr/lib/x86_64-linux-gnu/libcuda.so.{NEW} /usr/lib/x86_64-linux-gnu/libcuda.so.{NEW} "
        "ro,nosuid,nodev,relatime master:1 - ext4 /dev/nvme0n1p1 rw\n"
        f"1021 1001 259:1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{NEW} "
        f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{NEW} ro,nosuid,nodev,relatime master:1 - ext4 /dev/nvme0n1p1 rw\n"
        "1030 1001 0:60 / /dev/shm rw - tmpfs shm rw\n")
    assert [m["point"] for m in driver_mounts(str(tmp_path / "mountinfo"))] == [
        f"/usr/lib/x86_64-linux-gnu/libcuda.so.{NEW}", f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{NEW}"]


def test_nvidia_smi_gives_the_fabric_state_nvml_facts_keep(monkeypatch, tmp_path):
    # the H200's nvidia-smi -q -x (fabric state N/A: no NVSwitch) beside NVML through the stand-in
    import stat as st

    from test_gpu_facts import read

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "q.xml").write_text(read("nvidia-smi-q.xml"))
    smi = bindir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat {shlex.quote(str(tmp_path / 'q.xml'))}\n")
    smi.chmod(smi.stat().st_mode | st.S_IXUSR)
    fake_h200(monkeypatch)
    nv, _ev = collect_nvml({"PATH": f"{bindir}:/usr/bin:/bin"}, nv=pynvml)
    assert nv["source"] == "nvml" and nv["gpus"][0]["fabric_state"] == "N/A" and nv["gpus"][0]["brand"] == "NVIDIA"
    assert fabricmanager.fabric_state_from_smi(nv["gpus"]) == []


def test_nvswitch_found_by_its_pci_class(tmp_path):
    for dev, vendor, cls in (("0000:05:00.0", "0x10de", "0x068000"), ("0000:18:00.0", "0x10de", "0x030200"),
                             ("0000:00:1f.0", "0x8086", "0x068000")):
        (tmp_path / dev).mkdir()
        (tmp_path / dev / "vendor").write_text(vendor + "\n")
        (tmp_path / dev / "class").write_text(cls + "\n")
    found = fabricmanager.nvswitch_evidence(dev_glob=str(tmp_path / "none*"), proc_dir=str(tmp_path / "none"),
                                            pci_root=str(tmp_path))
    assert found == ["PCI 0000:05:00.0 (10de, class 0x0680)"]


# -- the package record and its history -------------------------------------------------------------------


def test_apt_history_with_rotated_logs_and_dnf_rpm_log(tmp_path):
    apt = tmp_path / "history.log"
    apt.write_text(_apt_entry(1_700_000_000, "Install: htop:amd64 (3.3.0-4build1)", "apt install htop"))
    rotated = _apt_entry(1_690_000_000, f"Upgrade: nvidia-driver-570:amd64 (570.124.06-0ubuntu1, {OLD}-0ubuntu1)")
    (tmp_path / "history.log.2.gz").write_bytes(gzip.compress(rotated.encode()))
    (tmp_path / "history.log.3.gz").write_bytes(b"not gzip")
    h = collect_history(str(apt), str(tmp_path / "no-dnf.rpm.log"))
    assert h["read"] == [str(apt), str(tmp_path / "history.log.2.gz")]
    assert any("not a readable gzip file" in e for e in h["errors"])
    last = h["last_change"]
    assert last["changes"] == [{"action": "upgrade", "name": "nvidia-driver-570", "old": "570.124.06-0ubuntu1",
                                "new": f"{OLD}-0ubuntu1"}]
    dnf = tmp_path / "dnf.rpm.log"
    dnf.write_text(f"2026-01-12T06:25:11+0000 SUBDEBUG Upgrade: nvidia-driver-3:{NEW}-1.el9.x86_64\n"
                   f"2026-01-12T06:25:11+0000 SUBDEBUG Upgraded: nvidia-driver-3:{OLD}-1.el9.x86_64\n"
                   "2026-01-12T06:25:12+0000 INFO --- logging initialized ---\n")
    h = collect_history(str(tmp_path / "no-apt"), str(dnf))
    assert h["last_change"]["when"] == 1768199111.0
    assert h["last_change"]["changes"] == [{"action": "upgrade", "name": "nvidia-driver", "old": f"{OLD}-1.el9",
                                            "new": f"{NEW}-1.el9"}]


def test_package_records_of_dpkg_and_rpm(tmp_path):
    status = tmp_path / "status"
    status.write_text(_dpkg_status(("nvidia-driver-580", f"{NEW}-0ubuntu1"), ("libnvidia-compute-580",
                                   f"{NEW}-0ubuntu1"), ("nvidia-fabricmanager-580", f"{NEW}-1"))
                      + "Package: libnvidia-compute-570\nStatus: deinstall ok config-files\nVersion: 570.86.15-1\n")
    pk, _ev = collect_packages({}, str(status))
    assert [p["name"] for p in pk["installed"]] == ["nvidia-driver-580", "libnvidia-compute-580",
                                                    "nvidia-fabricmanager-580"]
    assert pk["release"] == NEW and driverpkg.fabric_manager_package(pk["installed"])["release"] == NEW
    rpm = driverpkg.parse_rpm_query(f"nvidia-driver-cuda-libs {NEW}-1.el9\nnvidia-fabric-manager {OLD}-1\n"
                                    "glibc 2.34-100.el9\n")
    assert driverpkg.installed_release(rpm) == NEW and driverpkg.fabric_manager_package(rpm)["release"] == OLD


# -- (d) this machine as it is ----------------------------------------------------------------------------------


def test_d_this_machine_as_it_is():
    from zdoctor.core.registry import load_vocabulary
    from zdoctor.host import LiveHost

    load_vocabulary()
    facts = LiveHost(env=dict(os.environ)).results(["driver_parts"])
    res = facts.get("driver_parts")
    if os.path.exists("/proc/driver/nvidia/version"):  # a GPU node: the module is read
        assert res.status == "ok" and res.facts["module"]["loaded"]
        return
    assert res.status == "skip"
    assert res.facts["skipped"].startswith("no NVIDIA kernel module loaded (/proc/driver/nvidia/version absent)")
    (f,) = check_driver_parts(facts)
    assert f.id == "gpu.driver-parts.not-checked" and f.status == "skip"
    (layer,) = [x for x in layers_examined([f]) if x["id"] == "driver-parts"]
    assert layer["status"] == "not examined"
    # the layer's other checks (the kernel's module tree, the state after a resume) were not run here
    assert "gpu.driver-parts: no NVIDIA kernel module loaded (/proc/driver/nvidia/version absent)" in layer["why"]


def test_the_h200_capture_reads_as_its_parts_are_known():
    found = _by_id(check_driver_parts(facts_of(**h200_all())))
    assert found["gpu.driver-parts.module"].status == "skip"  # nothing recorded to compare the module with
    assert "Kernel module 580.159.04 (NVML nvmlSystemGetDriverVersion)" in found["gpu.driver-parts.module"].title
    assert found["gpu.driver-parts.fabric-manager"].status == "ok"
    lc = found["gpu.driver-parts.libcuda"]
    assert lc.status == "skip" and "/usr/local/nvidia/lib64/libcuda.so.1 [LD_LIBRARY_PATH]" in lc.detail
    rows = lc.evidence[0].table.rows
    assert ["libcuda's file system", "squashfs /dev/vdb",
            "mounted at /usr/local/nvidia (a container runtime's or the host's mount)"] in rows


def _walk(**changes: dict[str, Any]) -> list[str]:
    from test_gpu_playbook import walk

    return walk(**changes)

