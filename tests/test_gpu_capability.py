"""The gpu-capability layer: compute capability (NVML, recorded on the H200) against the ds_config's
precision, and the arch lists against the GPUs and the real nvcc (its real `--list-gpu-arch`, a real build
for an architecture it no longer builds), with torch's own arch-list rules read from the real torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import dsenv
import pynvml
import pytest
from test_gpu_facts import facts_of, h200_cuda_stack, h200_nvml, h200_pyenv, read
from test_gpu_nvml import fake_h200, no_smi

from zdoctor.core.shape import facts_problems
from zdoctor.layers.gpu.probe_gpu import collect_nvml
from zdoctor.layers.gpu_capability import capability as cap
from zdoctor.layers.gpu_capability import fatbin
from zdoctor.layers.gpu_capability.check_gpucap import check_arch_list, check_precision
from zdoctor.layers.gpu_capability.probe_gpucap import collect_gpucap
from zdoctor.layers.offload.dsconfig import load_config, precision
from zdoctor.layers.python_env import dsrules as dsr
from zdoctor.symptoms.extract import from_text
from zdoctor.walk.doctor import layers_examined

NVCC = shutil.which("nvcc") or "/usr/local/bin/nvcc"
needs_nvcc = pytest.mark.skipif(not os.access(NVCC, os.X_OK), reason="no nvcc on this machine")
#: What torch on the H200 node said of its GPU (torch.cuda.get_device_capability, recorded with the capture).
H200_CC = json.loads(read("python.json"))["torch"]["device0"]["cc"]
KERNEL = "__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n"


def lab_python() -> Path:
    """The lab environment's python (built first when it is not there)."""
    python = dsenv.location() / "bin" / "python"
    return python if python.exists() else dsenv.ensure()


def _ds_config(tmp_path: Path, body: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, **body}, indent=2))
    return {"precision": precision(load_config(str(path)))}


def _symptoms(text: str) -> dict[str, Any]:
    return {"symptoms": [s.to_dict() for s in from_text(text, "log", "train.log")]}


def _nvml_with_cc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cc: tuple[int, int] | None,
                  name: str = "NVIDIA H200") -> dict[str, Any]:
    """The nvml facts of the recorded H200 through the real pynvml module, its capability answered as given."""
    over: dict[str, Any] = {"nvmlDeviceGetName": lambda h: name}
    unsupported: tuple[str, ...] = ()
    if cc is None:
        unsupported = ("nvmlDeviceGetCudaComputeCapability",)
    else:
        over["nvmlDeviceGetCudaComputeCapability"] = lambda h: cc
    fake_h200(monkeypatch, overrides=over, unsupported=unsupported)
    facts, _ev = collect_nvml(no_smi(tmp_path), nv=pynvml)
    return facts


def _gpucap(nv: dict[str, Any], *, ds: dict[str, Any] | None = None, env: dict[str, str] | None = None,
            jit: dict[str, Any] | None = None, dsrelease: dict[str, Any] | None = None,
            cuda_stack: dict[str, Any] | None = None, pyenv: dict[str, Any] | None = None) -> dict[str, Any]:
    stack = cuda_stack if cuda_stack is not None else {"nvcc": {"path": NVCC}}
    facts, _ev = collect_gpucap(env or {}, nv, stack, pyenv or {}, jit or {}, ds, dsrelease or {})
    facts = json.loads(json.dumps(facts))
    assert facts_problems("gpucap", facts) == []  # a snapshot of it replays
    return facts


# -- NVML: the compute capability per GPU ---------------------------------------------------------------------


def test_nvml_reads_the_compute_capability_and_says_unknown_without_it(monkeypatch, tmp_path):
    nv = _nvml_with_cc(monkeypatch, tmp_path, tuple(H200_CC))
    assert nv["gpus"][0]["compute_capability"] == "9.0"
    monkeypatch.undo()
    nv = _nvml_with_cc(monkeypatch, tmp_path, None)
    assert nv["gpus"][0]["compute_capability"] is None
    assert "compute_capability" in nv["gpus"][0]["not_supported"]
    f = _gpucap(nv)
    assert f["gpus"][0]["cc"] is None


def test_recorded_capture_with_the_capability_torch_recorded():
    doc = json.loads(read("nvml.json"))
    doc["gpus"][0]["compute_capability"] = H200_CC
    from zdoctor.layers.gpu.nvml import from_capture
    assert from_capture(doc)["gpus"][0]["compute_capability"] == "9.0"
    assert h200_nvml()["gpus"][0]["compute_capability"] is None  # the dump itself did not record it


# -- precision -------------------------------------------------------------------------------------------------


def test_bf16_on_the_h200_is_ok(monkeypatch, tmp_path):
    nv = _nvml_with_cc(monkeypatch, tmp_path, tuple(H200_CC))
    ds = _ds_config(tmp_path, {"bf16": {"enabled": True}})
    [f] = check_precision(facts_of(gpucap=_gpucap(nv, ds=ds)))
    assert (f.id, f.status) == ("gpu.capability.precision", "ok")
    assert "ds_config.json:" in f.title and "9.0" in f.detail


def test_bf16_on_compute_capability_6_1_fails_and_explains_deepspeeds_error(monkeypatch, tmp_path):
    nv = _nvml_with_cc(monkeypatch, tmp_path, (6, 1), name="Tesla P40")
    ds = _ds_config(tmp_path, {"bfloat16": {"enabled": True}})  # DeepSpeed's older name for the section
    sym = _symptoms("Traceback (most recent call last):\nValueError: Type bf16 is not supported on your device.")
    [f] = check_precision(facts_of(gpucap=_gpucap(nv, ds=ds), symptoms=sym))
    assert f.status == "fail" and "6.1" in f.title and "Tesla P40" in f.title
    assert "bfloat16.enabled" not in f.title and ":" in f.title  # the position in the file is named
    assert f.explains == ["S1"] and "which this torch does is not known" in f.detail
    assert any("fp16" in r.title for r in f.remedies) and all(r.note.startswith("not tried") for r in f.remedies)
    # torch 2.13 (the real one) emulates bf16: DeepSpeed then starts, and the finding says so
    python = lab_python()
    where = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    torch_dir = subprocess.run([str(python), "-c", where], capture_output=True, text=True,
                               check=True).stdout.strip().splitlines()[-1]
    pyenv = {"torch": {"import": {"state": "ok"}, "location": torch_dir, "version": "2.13.0"}}
    [f] = check_precision(facts_of(gpucap=_gpucap(nv, ds=ds, pyenv=pyenv)))
    assert f.status == "fail" and "including_emulation" in f.detail and "DeepSpeed starts" in f.detail


def test_fp16_on_6_1_follows_the_installed_deepspeeds_rule(monkeypatch, tmp_path):
    python = lab_python()
    where = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('deepspeed').origin))"
    ds_dir = Path(subprocess.run([str(python), "-c", where], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1])
    rules = dsr.installed_rules(str(ds_dir), None)
    assert rules["fp16-compute-capability"]["state"] == "current"  # DeepSpeed 0.19.8 has DS_ALLOW_DEPRECATED_FP16
    nv = _nvml_with_cc(monkeypatch, tmp_path, (6, 1), name="Tesla P40")
    ds = _ds_config(tmp_path, {"fp16": {"enabled": True}})
    sym = _symptoms("ValueError: Type fp16 is not supported on your device.")
    [f] = check_precision(facts_of(gpucap=_gpucap(nv, ds=ds, dsrelease={"rules": rules}), symptoms=sym))
    assert f.status == "fail" and f.explains == ["S1"]
    assert f.remedies[0].commands == ["export DS_ALLOW_DEPRECATED_FP16=1"]
    [f] = check_precision(facts_of(gpucap=_gpucap(nv, ds=ds, dsrelease={"rules": rules},
                                                  env={"DS_ALLOW_DEPRECATED_FP16": "1"})))
    assert f.status == "warn"
    old = {"fp16-compute-capability": {"state": "old"}}
    [f] = check_precision(facts_of(gpucap=_gpucap(nv, ds=ds, dsrelease={"rules": old},
                                                  env={"DS_ALLOW_DEPRECATED_FP16": "1"})))
    assert f.status == "fail" and not any("DS_ALLOW" in " ".join(r.commands) for r in f.remedies)


def test_unknown_capability_and_auto_precision_are_not_judged(monkeypatch, tmp_path):
    ds = _ds_config(tmp_path, {"bf16": {"enabled": True}})
    f = _gpucap({"skipped": "no usable NVIDIA driver: NVML did not initialise"}, ds=ds)
    [x] = check_precision(facts_of(gpucap=f))
    assert x.id == "gpu.capability.precision.not-checked" and "no usable NVIDIA driver" in x.detail
    nv = _nvml_with_cc(monkeypatch, tmp_path, None)
    [x] = check_precision(facts_of(gpucap=_gpucap(nv, ds=ds)))
    assert x.status == "skip" and "unknown" in x.detail
    nv = _nvml_with_cc(monkeypatch, tmp_path, (6, 1))
    auto = _ds_config(tmp_path, {"bf16": {"enabled": "auto"}})
    [x] = check_precision(facts_of(gpucap=_gpucap(nv, ds=auto)))
    assert x.status == "skip" and "auto" in x.detail


# -- arch lists: torch's rules, read from the real torch ------------------------------------------------------

TORCH_FLAGS = ("import json, os, sys\nfrom torch.utils.cpp_extension import _get_cuda_arch_flags\nout = {}\n"
               "for arch in sys.argv[1:]:\n    os.environ['TORCH_CUDA_ARCH_LIST'] = arch\n    try:\n"
               "        out[arch] = _get_cuda_arch_flags()\n    except ValueError as exc:\n"
               "        out[arch] = str(exc)\nprint(json.dumps(out))\n")


def test_arch_list_parsing_matches_the_real_torch():
    python = lab_python()
    lists = ["6.0;7.0", "8.0 8.6+PTX", "Ampere;Hopper", "Pascal+PTX", "9.0a", "7.5;foo", "8.0;"]
    got = json.loads(subprocess.run([str(python), "-c", TORCH_FLAGS, *lists], capture_output=True, text=True,
                                    check=True, timeout=240).stdout)
    for arch in lists:
        parsed = cap.expand_arch_list(arch)
        if isinstance(got[arch], str):
            assert parsed["unknown"] and f"({parsed['unknown'][0]})" in got[arch], arch
        else:
            assert not parsed["unknown"], arch
            ours = [f"-gencode=arch={a},code={c}" for a, c in cap.gencode_of_entries(parsed["entries"])]
            assert ours == got[arch], arch


# -- arch lists against the real nvcc ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unsupported_build(tmp_path_factory) -> subprocess.CompletedProcess[str]:
    """A real nvcc build for compute_60, as TORCH_CUDA_ARCH_LIST="6.0;..." makes torch ask."""
    d = tmp_path_factory.mktemp("nvcc60")
    (d / "k.cu").write_text(KERNEL)
    return subprocess.run([NVCC, "-gencode=arch=compute_60,code=sm_60", "-c", str(d / "k.cu"), "-o", str(d / "k.o")],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def remedy_build(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A real nvcc build of a shared library with the flags torch emits for TORCH_CUDA_ARCH_LIST=8.0+PTX."""
    d = tmp_path_factory.mktemp("nvcc80")
    (d / "k.cu").write_text(KERNEL)
    flags = [f"-gencode=arch={a},code={c}" for a, c in
             cap.gencode_of_entries(cap.expand_arch_list("8.0+PTX")["entries"])]
    so = d / "k_op.cpython-311-x86_64-linux-gnu.so"
    run = subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, str(d / "k.cu"), "-o", str(so)],
                         capture_output=True, text=True, timeout=300)
    return run, so


@needs_nvcc
def test_the_arch_list_nvcc_cannot_build_explains_the_real_nvcc_error(unsupported_build, remedy_build):
    assert unsupported_build.returncode != 0
    sym = _symptoms(unsupported_build.stderr)
    assert sym["symptoms"] and sym["symptoms"][0]["fields"] == {"arch": "compute_60"}
    f = _gpucap({"skipped": "no usable NVIDIA driver"}, env={"TORCH_CUDA_ARCH_LIST": "6.0;7.0;8.0"})
    assert "compute_75" in f["nvcc"]["archs"] and "compute_60" not in f["nvcc"]["archs"]  # nvcc 13 dropped < 7.5
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=f, symptoms=sym))}
    assert found["gpu.capability.nvcc-archs"].status == "ok"
    arch = found["gpu.capability.arch-list"]
    assert arch.status == "fail" and "compute_60, compute_70" in arch.title
    assert arch.explains == [sym["symptoms"][0]["id"]]
    fix = arch.remedies[0].commands
    assert fix == ["export TORCH_CUDA_ARCH_LIST=8.0+PTX"]  # DeepSpeed's JIT adds +PTX to the highest
    # the remedy's list builds with the same nvcc
    run, _so = remedy_build
    assert run.returncode == 0, run.stderr


@needs_nvcc
def test_the_architectures_a_built_library_carries_are_read_from_its_fatbin(remedy_build, monkeypatch, tmp_path):
    _run, so = remedy_build
    assert fatbin.read_archs(str(so)) == {"pairs": [["compute_80", "compute_80"], ["compute_80", "sm_80"]],
                                          "cuda": True, "error": None}
    assert fatbin.read_archs("/bin/sh")["cuda"] is False
    jit = {"deepspeed": {"prebuilt_ops": [str(so)]}}
    nv = _nvml_with_cc(monkeypatch, tmp_path, tuple(H200_CC))
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=_gpucap(nv, jit=jit)))}
    assert found["gpu.capability.kernel-image.k_op"].status == "ok"  # the compute_80 PTX is JIT-compiled for 9.0
    assert "PTX" in found["gpu.capability.kernel-image.k_op"].detail
    monkeypatch.undo()
    t4 = _nvml_with_cc(monkeypatch, tmp_path, (7, 5), name="Tesla T4")
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=_gpucap(t4, jit=jit)))}
    assert found["gpu.capability.kernel-image.k_op"].status == "fail"


@needs_nvcc
def test_no_gpu_here_the_nvcc_part_is_examined_and_the_gpu_part_is_not(tmp_path):
    ds = _ds_config(tmp_path, {"bf16": {"enabled": True}})
    f = _gpucap({"skipped": "no usable NVIDIA driver: NVML did not initialise"}, ds=ds)
    findings = check_precision(facts_of(gpucap=f)) + check_arch_list(facts_of(gpucap=f))
    by_id = {x.id: x for x in findings}
    assert by_id["gpu.capability.precision.not-checked"].status == "skip"
    assert by_id["gpu.capability.nvcc-archs"].status == "ok"
    assert by_id["gpu.capability.arch-list"].status == "skip"  # the list the build uses follows the GPUs
    layer = next(x for x in layers_examined(findings) if x["id"] == "gpu-capability")
    # nvcc's part looked; the precision's could not (no GPU): the layer is examined in part, and says which
    assert layer["status"] == "partly examined" and layer["checks"] == ["gpu.capability.arch-list"]
    assert [m["check"] for m in layer["not_examined"]] == ["gpu.capability.precision"]
    assert "no usable NVIDIA driver" in layer["not_examined"][0]["why"]


def test_deepspeed_builds_for_the_gpus_when_the_list_is_unset(monkeypatch, tmp_path):
    """A Pascal GPU and nvcc 13: DeepSpeed's JIT asks for compute_61, which nvcc 13 does not build."""
    nv = _nvml_with_cc(monkeypatch, tmp_path, (6, 1), name="Tesla P40")
    f = _gpucap(nv)
    f["nvcc"] = {"path": NVCC, "ran": True, "archs": cap.parse_list_gpu_arch("compute_75 compute_80 compute_90"),
                 "error": None}
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=f))}
    arch = found["gpu.capability.arch-list"]
    assert arch.status == "fail" and "'6.1+PTX'" in arch.title and "compute_61" in arch.title
    assert "GPU 0 (Tesla P40" in arch.detail and len(arch.remedies) == 1  # no list without the GPU's own arch


def test_ops_and_torch_without_a_kernel_for_the_gpu(monkeypatch, tmp_path):
    nv = _nvml_with_cc(monkeypatch, tmp_path, tuple(H200_CC))
    op = tmp_path / "fused_adam"
    op.mkdir()
    (op / "build.ninja").write_text(
        "ninja_required_version = 1.3\ncxx = c++\nnvcc = /usr/local/cuda/bin/nvcc\n"
        "cuda_post_cflags = -D__CUDA_NO_HALF_OPERATORS__ -gencode=arch=compute_70,code=sm_70 "
        "-gencode=arch=compute_80,code=sm_80 --compiler-options '-fPIC'\n")
    jit = {"ops": [{"name": "fused_adam", "dir": str(op), "in_use": True}]}
    sym = _symptoms("RuntimeError: CUDA error: no kernel image is available for execution on the device")
    f = _gpucap(nv, jit=jit, pyenv=h200_pyenv(), cuda_stack=h200_cuda_stack())
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=f, symptoms=sym))}
    opf = found["gpu.capability.kernel-image.fused_adam"]
    assert opf.status == "fail" and "sm_70 sm_80" in opf.detail and opf.explains == ["S1"]
    assert found["gpu.capability.kernel-image.torch"].status == "ok"  # the cu130 wheel has sm_90
    monkeypatch.undo()
    p40 = _nvml_with_cc(monkeypatch, tmp_path, (6, 1), name="Tesla P40")
    f = _gpucap(p40, pyenv=h200_pyenv(), cuda_stack=h200_cuda_stack())
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=f))}
    assert found["gpu.capability.kernel-image.torch"].status == "fail"  # the cu130 wheel starts at sm_75


def test_kernel_compatibility_rules():
    pairs = [("compute_80", "sm_80"), ("compute_86", "compute_86")]
    assert cap.runs_on((8, 6), pairs) == "sm_80 cubin"          # same major, older minor
    assert cap.runs_on((8, 9), pairs) == "sm_80 cubin"
    assert cap.runs_on((9, 0), pairs).startswith("compute_86 PTX")  # PTX of an older arch is JIT-compiled
    assert cap.runs_on((7, 5), pairs) is None
    assert cap.runs_on((9, 0), [("compute_90a", "sm_90a")]) == "sm_90a cubin"
    assert cap.runs_on((10, 0), [("compute_90a", "sm_90a")]) is None


@needs_nvcc
def test_an_arch_list_nvcc_builds_for_the_h200_is_ok_and_a_name_is_deepspeeds_error(monkeypatch, tmp_path):
    nv = _nvml_with_cc(monkeypatch, tmp_path, tuple(H200_CC))
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=_gpucap(nv, env={"TORCH_CUDA_ARCH_LIST": "9.0"})))}
    arch = found["gpu.capability.arch-list"]
    assert arch.status == "ok" and "'9.0+PTX'" in arch.title and "covers every GPU here" in arch.title
    assert "-gencode=arch=compute_90,code=sm_90" in arch.detail
    # a name torch expands, but the installed DeepSpeed's JIT reads as numbers: its real error, then the fix
    python = lab_python()
    where = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('deepspeed').origin))"
    ds_dir = subprocess.run([str(python), "-c", where], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    rules = dsr.installed_rules(ds_dir, None)
    assert rules["jit-arch-list-numbers"]["state"] == "current"
    f = _gpucap(nv, env={"TORCH_CUDA_ARCH_LIST": "Hopper"}, dsrelease={"rules": rules})
    arch = {x.id: x for x in check_arch_list(facts_of(gpucap=f))}["gpu.capability.arch-list"]
    assert arch.status == "fail" and "invalid literal for int() with base 10: 'Hopper'" in arch.title
    assert arch.remedies[0].commands == ["export TORCH_CUDA_ARCH_LIST=9.0+PTX"]
