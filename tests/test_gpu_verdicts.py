"""GPU verdicts that must not say more than their facts: a GPU NVML has no handle for, a kernel module that
is another release than the driver's libraries, a CUDA that cannot start although the versions fit. NVML's
real error codes come through the real pynvml module (its entry points replaced, as in test_gpu_nvml)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pynvml
from test_gpu_facts import facts_of
from test_gpu_nvml import _raise, fake_h200, no_smi

from zdoctor.layers.gpu.check_cuda import check_runtime
from zdoctor.layers.gpu.check_gpu import check_driver, check_health
from zdoctor.layers.gpu.probe_gpu import collect_nvml
from zdoctor.readers import kmod
from zdoctor.walk.doctor import CheckReport

#: /proc/modules of a GPU node with a display stack and GPUDirect RDMA loaded (the kernel's format).
PROC_MODULES = """\
nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
nvidia_uvm 2076672 4 - Live 0x0000000000000000 (POE)
nvidia_drm 122880 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1716224 1 nvidia_drm, Live 0x0000000000000000 (POE)
nvidia 108183552 35 nvidia_peermem,nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)
ib_core 479232 9 nvidia_peermem,rdma_ucm,ib_uverbs, Live 0x0000000000000000
video 77824 1 nvidia_modeset, Live 0x0000000000000000
"""


def _lost_second_gpu(monkeypatch) -> dict[str, Any]:
    def handle(i: int) -> Any:
        if i == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return ("h", i)

    fake_h200(monkeypatch, count=2, overrides={"nvmlDeviceGetHandleByIndex": handle})
    return {}


def test_a_gpu_without_an_nvml_handle_fails_driver_and_health(monkeypatch, tmp_path):
    _lost_second_gpu(monkeypatch)
    facts, _ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert facts["gpus"][1]["errors"] == {"handle": "GPU is lost"}
    drv = check_driver(facts_of(nvml=facts))[0]
    assert drv.status == "fail"
    assert drv.title.startswith("GPU 1 cannot be reached through the driver")
    assert "2 GPUs: 1x NVIDIA H200, 1 unreachable" in drv.title
    assert "GPU 1: handle: GPU is lost" in drv.detail
    assert any("nvidia-smi -r -i 1" in c for r in drv.remedies for c in r.commands)
    health = {f.id: f for f in check_health(facts_of(nvml=facts))}
    assert health["gpu.health.reachable"].status == "fail"
    assert "GPU 1 unreachable" in health["gpu.health.reachable"].title
    # the ECC table covers only the GPU NVML could read: no "no errors" row for the lost one
    assert [r[0] for r in health["gpu.health.ecc"].evidence[0].table.rows] == ["0"]
    assert CheckReport(host={}, findings=[drv]).exit_code == 1


def test_a_gpu_lost_after_its_handle_is_unreachable_too(monkeypatch, tmp_path):
    fake_h200(monkeypatch, count=1, overrides={
        "nvmlDeviceGetMemoryInfo": _raise(pynvml.NVML_ERROR_GPU_IS_LOST),
        "nvmlDeviceGetTemperature": _raise(pynvml.NVML_ERROR_GPU_IS_LOST)})
    facts, _ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    assert [f.status for f in check_driver(facts_of(nvml=facts))] == ["fail"]
    assert [f.id for f in check_health(facts_of(nvml=facts))] == ["gpu.health.reachable"]


def _mismatch_smi(tmp_path: Path) -> dict[str, str]:
    """nvidia-smi as it answers on a node whose kernel module is older than its libraries."""
    bindir = tmp_path / "smi-bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\n"
                      "echo 'NVML library version: 580.159'\nexit 18\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bindir}:/usr/bin:/bin"}


def _kmod_files(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "modules").write_text(PROC_MODULES)
    (tmp_path / "sys-version").write_text("570.86.15\n")
    lib = tmp_path / "libnvidia-ml.so.580.159.04"
    lib.write_bytes(b"\x7fELF")
    os.symlink(lib.name, tmp_path / "libnvidia-ml.so.1")
    return {"proc_modules": str(tmp_path / "modules"), "sys_version": str(tmp_path / "sys-version"),
            "proc_version": str(tmp_path / "absent"), "nvml_libs": [str(tmp_path / "libnvidia-ml.so.1")]}


def test_driver_library_mismatch_is_a_failure_with_the_reload_in_order(monkeypatch, tmp_path):
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    facts, _ev = collect_nvml(_mismatch_smi(tmp_path), nv=pynvml, kmod_paths=_kmod_files(tmp_path))
    assert facts["library"]["error_kind"] == "driver_mismatch"
    km = facts["kernel_module"]
    assert km["kernel_version"] == "570.86.15" and km["library_version"] == "580.159.04"
    found = check_driver(facts_of(nvml=facts))
    assert [f.status for f in found] == ["fail"]
    f = found[0]
    assert "Driver/library version mismatch (kernel module 570.86.15, libraries 580.159.04)" in f.title
    reload, reboot = f.remedies
    unload = next(c for c in reload.commands if c.startswith("modprobe -r"))
    # users before what they use: peermem, uvm and modeset before nvidia; drm before modeset
    order = unload.split()[2:]
    assert set(order) == {"nvidia_peermem", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia"}
    assert order.index("nvidia_drm") < order.index("nvidia_modeset") < order.index("nvidia")
    assert order[-1] == "nvidia"
    assert reload.commands[-2:] == ["modprobe nvidia", "nvidia-smi"]
    assert reboot.commands == ["systemctl reboot"] and reboot.requires_root
    assert CheckReport(host={}, findings=found).exit_code == 1


def test_mismatch_seen_only_by_nvidia_smi_still_fails(monkeypatch, tmp_path):
    # the pynvml module itself missing: nvidia-smi's own message names the mismatch
    facts, _ev = collect_nvml(_mismatch_smi(tmp_path), nv=_NoNvml(),
                              kmod_paths={**_kmod_files(tmp_path), "sys_version": str(tmp_path / "none")})
    f = check_driver(facts_of(nvml=facts))[0]
    assert f.status == "fail" and "libraries 580.159.04" not in f.title  # the module's version is unknown
    assert "Driver/library version mismatch" in f.title


class _NoNvml:
    """An NVML whose library does not load (the stand-in keeps pynvml's error class)."""

    NVMLError = pynvml.NVMLError

    def nvmlInit(self) -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")


def test_unload_order_of_proc_modules():
    mods = kmod.parse_proc_modules(PROC_MODULES)
    assert "ib_core" not in mods and mods["nvidia_modeset"] == ["nvidia_drm"]
    order = kmod.unload_order(mods)
    assert order.index("nvidia_drm") < order.index("nvidia_modeset") and order[-1] == "nvidia"
    assert kmod.kernel_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22 2025", None) \
        == "570.86.15"


# -- CUDA that does not start although the versions fit ---------------------------------------------------

#: torch's own texts (c10/cuda/CUDAFunctions.cpp device_count_impl, wrapped by TORCH_WARN "CUDA initialization: ")
TORCH_802 = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
             "before calling NumCudaDevices() that might have already set an error? Error 802: system not yet "
             "initialized (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)")
TORCH_999 = ("CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. "
             "changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be "
             "zero. (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)")

FAKE_TORCH_CUDA_WARNS = '''
import warnings
__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
    hip = None
    git_version = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
class cuda:
    @staticmethod
    def is_available():
        warnings.warn(%r, UserWarning)
        return False
'''

FAKE_TORCH_CUDA_SILENT = '''
__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
    hip = None
    git_version = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
class cuda:
    @staticmethod
    def is_available():
        return False
    @staticmethod
    def init():
        raise RuntimeError(%r)
'''


def _probe_cuda_record(tmp_path: Path, body: str) -> dict[str, Any]:
    """Run the real probe script against a torch package whose CUDA start fails as torch's does."""
    from test_probe_script import PY38, make_pkg, run_script

    make_pkg(tmp_path, "torch", body, "2.11.0")
    python = PY38 if os.path.exists(PY38) else sys.executable
    proc, parsed = run_script(python, tmp_path)
    assert "torch_cuda" in parsed["records"], proc.stderr
    return parsed["records"]["torch_cuda"]


def _facts_with(record: dict[str, Any], nvml_changes: dict[str, Any] | None = None, torch_cuda: str = "13.0"):
    from test_gpu_facts import h200, h200_nvml, h200_pyenv

    py = h200_pyenv()
    py["torch"]["cuda"] = torch_cuda
    py["torch"]["cuda_check"] = {"state": "ok", **{k: v for k, v in record.items() if k != "t"}}
    nv = h200_nvml()
    nv.update(nvml_changes or {})
    return h200(nvml=nv, pyenv=py)


def test_cuda_802_with_fitting_versions_says_the_cause_is_elsewhere(tmp_path):
    from test_gpu_checks import branch

    rec = _probe_cuda_record(tmp_path, FAKE_TORCH_CUDA_WARNS % TORCH_802)
    assert rec["available"] is False and "Error 802: system not yet initialized" in rec["init_error"]
    facts = _facts_with(rec)
    f = {x.id: x for x in check_runtime(facts)}["gpu.runtime"]
    assert f.status == "fail"
    assert "newer than" not in f.title
    assert f.title == ("CUDA cannot start on driver 580.159.04 (CUDA error 802); torch's CUDA 13.0 fits the "
                       "driver's CUDA 13.0")
    assert "the cause is elsewhere" in f.detail and "nvidia-fabricmanager" in f.detail
    assert "cudaErrorSystemNotReady" in f.detail
    assert f.remedies == []  # no torch or driver swap: neither is the cause
    table = f.evidence[-1].table.rows
    assert table[1] == ["CUDA error number", "802"]
    assert branch("diag-cuda-start", facts)


def test_cuda_999_comes_from_torchs_sentence_and_init_text_is_read_when_no_warning(tmp_path):
    rec = _probe_cuda_record(tmp_path, FAKE_TORCH_CUDA_WARNS % TORCH_999)
    f = {x.id: x for x in check_runtime(_facts_with(rec))}["gpu.runtime"]
    assert "(CUDA error 999)" in f.title and "nvidia_uvm" in f.detail
    silent = "CUDA error: forward compatibility was attempted on non supported HW"
    rec = _probe_cuda_record(tmp_path / "silent", FAKE_TORCH_CUDA_SILENT % silent)
    assert rec["init_error"] == f"RuntimeError: {silent}"
    f = {x.id: x for x in check_runtime(_facts_with(rec))}["gpu.runtime"]
    assert "(CUDA error 804)" in f.title and "cuda-compat" in f.detail


def test_versions_compare_as_versions_not_text():
    rec = {"available": False, "init_error": None}
    # driver CUDA 12.10 is newer than torch's 12.9: the runtime fits, CUDA's failure is not the versions
    facts = _facts_with(rec, {"cuda_driver": 12100, "cuda_driver_version": "12.10"}, torch_cuda="12.9")
    f = {x.id: x for x in check_runtime(facts)}["gpu.runtime"]
    assert f.title.startswith("CUDA cannot start") and "newer than" not in f.title
    assert "CUDA error unknown" in f.title and "number is unknown" in f.detail
    # torch's 12.10 on a driver of CUDA 12.9 is the newer side
    facts = _facts_with({"available": True}, {"cuda_driver": 12090, "cuda_driver_version": "12.9"},
                        torch_cuda="12.10")
    f = {x.id: x for x in check_runtime(facts)}["gpu.runtime"]
    assert f.title == "torch's CUDA 12.10 is newer than the driver's CUDA 12.9"


# -- which of the user's symptoms these findings explain -----------------------------------------------------


def _symptoms(text: str) -> dict[str, Any]:
    from zdoctor.symptoms.extract import from_text

    return {"symptoms": [s.to_dict() for s in from_text(text, "symptom", "--symptom")]}


def test_the_findings_explain_the_messages_they_are_about(tmp_path, monkeypatch):
    from test_gpu_facts import h200_all

    from zdoctor.core.registry import Facts

    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH))
    nv, _ev = collect_nvml(_mismatch_smi(tmp_path), nv=pynvml, kmod_paths=_kmod_files(tmp_path))
    sym = _symptoms("Failed to initialize NVML: Driver/library version mismatch")
    assert check_driver(facts_of(nvml=nv, symptoms=sym))[0].explains == ["S1"]

    rec = _probe_cuda_record(tmp_path / "cuda", FAKE_TORCH_CUDA_WARNS % TORCH_802)
    facts = _facts_with(rec)
    both = {**{n: facts.get(n) for n in h200_all()}}
    both["symptoms"] = facts_of(symptoms=_symptoms(TORCH_802)).get("symptoms")
    f = {x.id: x for x in check_runtime(Facts(both))}["gpu.runtime"]
    assert f.explains == ["S1"]
    other = facts_of(symptoms=_symptoms(TORCH_802.replace("802: system not yet", "803: system has unsupported")))
    both["symptoms"] = other.get("symptoms")
    assert {x.id: x for x in check_runtime(Facts(both))}["gpu.runtime"].explains == []


def test_wheel_tags_read_as_versions():
    from zdoctor.layers.gpu.check_cuda import wheel_tag_cuda

    assert [wheel_tag_cuda(t) for t in ("cu92", "cu118", "cu130", "cu1210")] == ["9.2", "11.8", "13.0", "12.10"]
