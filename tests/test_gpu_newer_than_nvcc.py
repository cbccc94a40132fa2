"""A GPU newer than the installed CUDA toolkit: the recorded H200 (compute capability 9.0) against the
architectures of the CUDA 11.7 toolkit (recorded from its own ptxas 11.7.99: the 11.7 wheel ships no nvcc),
which stops at compute_87. zdoctor names the toolkit that builds compute_90 (CUDA 11.8), proposes an arch
list with PTX of the newest architecture 11.7 builds, and tries that list as a real compile where the
toolkit's nvcc is present (this machine's real nvcc); where it is not, it says so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from test_gpu_capability import H200_CC, NVCC, _gpucap, _nvml_with_cc, _symptoms, needs_nvcc
from test_gpu_facts import facts_of

from zdoctor.layers.gpu_capability import capability as cap
from zdoctor.layers.gpu_capability.check_gpucap import check_arch_list
from zdoctor.layers.gpu_capability.probe_archtrial import try_arch_list

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvcc"
#: What the 11.7 toolkit accepts, as its ptxas --help lists it ('compute_35', ... 'compute_87').
CUDA_11_7 = cap.parse_list_gpu_arch("\n".join(re.findall(r"'(compute_\d+)'",
                                                         (FIXTURES / "ptxas-11.7.99-gpu-name.txt").read_text())))
#: This machine's real nvcc, recorded: `nvcc --list-gpu-arch` of CUDA 13.0.
CUDA_13_0 = cap.parse_list_gpu_arch((FIXTURES / "nvcc-13.0.88-list-gpu-arch.txt").read_text())
NVCC_FATAL = "nvcc fatal   : Unsupported gpu architecture 'compute_90'"


def _h200_with_11_7(monkeypatch, tmp_path, nvcc: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The gpucap facts of the recorded H200 with the 11.7 toolkit's architectures as its nvcc's answer, that
    nvcc named ``nvcc`` (absent: the toolkit is not on this machine; this machine's real one: the trial runs it)."""
    nv = _nvml_with_cc(monkeypatch, tmp_path, tuple(H200_CC))
    facts = _gpucap(nv, env=env, cuda_stack={"nvcc": {"path": nvcc}})
    facts["nvcc"] = {"path": nvcc, "ran": True, "archs": CUDA_11_7, "error": None}  # the 11.7 toolkit's answer
    return facts


def test_the_recorded_toolkits_architectures():
    assert CUDA_11_7[0] == "compute_35" and CUDA_11_7[-1] == "compute_87" and "compute_90" not in CUDA_11_7
    assert "compute_90" in CUDA_13_0 and "compute_120" in CUDA_13_0 and "compute_70" not in CUDA_13_0
    assert cap.ptx_fallback((9, 0), CUDA_11_7) == "8.6+PTX"  # compute_87 is Orin's (Tegra): passed over
    assert cap.ptx_fallback((12, 0), CUDA_13_0) == "12.0+PTX"
    assert cap.ptx_fallback((6, 0), CUDA_13_0) is None  # nothing this old to fall back on
    assert cap.toolkit_for("compute_90") == "11.8" and cap.toolkit_for("compute_120") == "12.8"
    assert cap.toolkit_for("compute_75") is None
    assert cap.ptx_arch_list("8.0;9.0", ["9.0"], CUDA_11_7) == "8.0;8.6+PTX"
    assert cap.ptx_arch_list("9.0", ["9.0"], CUDA_13_0) is None  # 13.0 builds it: nothing to propose


def test_a_gpu_newer_than_the_toolkit_without_its_nvcc_here(monkeypatch, tmp_path):
    absent = str(tmp_path / "cuda-11.7" / "bin" / "nvcc")
    facts = _h200_with_11_7(monkeypatch, tmp_path, absent)
    trial, ev = try_arch_list(facts, {})
    assert trial == {"arch_list": "8.6+PTX", "nvcc": absent, "tried": False, "ok": None,
                     "flags": ["-gencode=arch=compute_86,code=compute_86", "-gencode=arch=compute_86,code=sm_86"],
                     "error": None,
                     "why": f"no nvcc here ({absent})"} and ev == []
    sym = _symptoms(NVCC_FATAL)
    found = {x.id: x for x in check_arch_list(facts_of(gpucap=facts, archtrial=trial, symptoms=sym))}
    arch = found["gpu.capability.arch-list"]
    assert arch.status == "fail" and "compute_90" in arch.title
    assert arch.explains == [sym["symptoms"][0]["id"]]
    assert "The GPUs themselves need it: GPU 0 (NVIDIA H200, compute capability 9.0)" in arch.detail
    toolkit, ptx = arch.remedies
    assert toolkit.title == "Build with CUDA 11.8 or newer, whose nvcc builds compute_90 (point CUDA_HOME at it)"
    assert toolkit.explanation == "compute_90: CUDA 11.8 or newer (NVIDIA CUDA 11.8 release notes (Ada and Hopper " \
                                  "support))"
    assert ptx.commands == ["export TORCH_CUDA_ARCH_LIST=8.6+PTX"]
    assert not ptx.tried and ptx.note == f"not tried, because no nvcc here ({absent})"


@needs_nvcc
def test_the_proposed_list_is_compiled_by_the_real_nvcc(monkeypatch, tmp_path):
    facts = _h200_with_11_7(monkeypatch, tmp_path, NVCC)
    trial, ev = try_arch_list(facts, {"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert trial["tried"] and trial["ok"], trial["error"]
    assert ev[0].argv is not None and "-gencode=arch=compute_86,code=compute_86" in ev[0].argv
    (arch,) = [x for x in check_arch_list(facts_of(gpucap=facts, archtrial=trial))
               if x.id == "gpu.capability.arch-list"]
    ptx = arch.remedies[1]
    assert ptx.tried and ptx.verified is True and ptx.note.startswith(f"tried: {NVCC} compiled a kernel")
    # a list the nvcc cannot build is reported as nvcc answered it: the real 13.0 dropped compute_60
    facts = _h200_with_11_7(monkeypatch, tmp_path, NVCC, env={"TORCH_CUDA_ARCH_LIST": "6.0;9.0"})
    trial, _ = try_arch_list(facts, {"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert trial["arch_list"] == "6.0;8.6+PTX" and trial["tried"] and trial["ok"] is False
    assert "Unsupported gpu architecture 'compute_60'" in trial["error"]
    (arch,) = [x for x in check_arch_list(facts_of(gpucap=facts, archtrial=trial))
               if x.id == "gpu.capability.arch-list"]
    assert arch.remedies[-1].verified is False and "did not compile it" in arch.remedies[-1].note


def test_the_glossary_explains_ptx():
    from zdoctor.core.glossary import find_term, load_glossary

    term = find_term(load_glossary(), "PTX")
    assert term is not None and "+PTX" in term.text
