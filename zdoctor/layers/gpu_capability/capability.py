"""A GPU's compute capability against what the job asks of it: the precision in the ds_config and the
architectures the CUDA code is built for.

The rules, each with where it was read:

- **bf16** needs compute capability 8.0 or newer: ``torch.cuda.is_bf16_supported()`` answers True for a
  device whose major is 8 or more, else (``including_emulation``) only when a bf16 tensor can be created
  (torch/cuda/__init__.py); DeepSpeed's engine stops with "Type bf16 is not supported on your device." when
  it answers False (runtime/engine.py ``_do_sanity_check``), torch's autocast with "Current CUDA Device does
  not support bfloat16. Please switch dtype to float16." (torch/amp/autocast_mode.py).
- **fp16**: DeepSpeed's CUDA accelerator allows it from major 7 (tensor cores); 6.x only with
  ``DS_ALLOW_DEPRECATED_FP16=1`` in the releases that have that switch (accelerator/cuda_accelerator.py
  ``is_fp16_supported``; the rule ``fp16-compute-capability`` in :mod:`zdoctor.layers.python_env.dsrules`).
- **An arch list** (``TORCH_CUDA_ARCH_LIST``) is read as torch reads it (torch/utils/cpp_extension.py
  ``_get_cuda_arch_flags``): spaces count as ``;``, the names ``Ampere``, ``Hopper`` ... expand to their
  numbers, each entry must be one torch knows, else "Unknown CUDA arch (X) or GPU not supported"; an entry
  ``X.Y`` becomes ``-gencode=arch=compute_XY,code=sm_XY`` and ``+PTX`` adds ``code=compute_XY``.
- **nvcc** builds only the ``compute_XY`` it lists in ``nvcc --list-gpu-arch``; any other stops the build
  with "nvcc fatal : Unsupported gpu architecture 'compute_XY'".
- **A kernel runs** on a GPU of capability X.Y when the binary holds a cubin ``sm_XZ`` with Z <= Y (same
  major), or PTX ``compute_AB`` with AB <= XY that the driver compiles at load; an arch-specific ``sm_90a``
  runs on 9.0 alone (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"). Else
  CUDA fails with "no kernel image is available for execution on the device".
"""

from __future__ import annotations

import re
from typing import Any

#: torch's names for arch groups (torch 2.13, torch/utils/cpp_extension.py ``named_arches``), combined
#: names first, as torch replaces them in this order.
NAMED_ARCHES: tuple[tuple[str, str], ...] = (
    ("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"), ("Maxwell", "5.0;5.2+PTX"),
    ("Pascal", "6.0;6.1+PTX"), ("Volta+Tegra", "7.2"), ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"),
    ("Ampere+Tegra", "8.7"), ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"), ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"), ("Blackwell", "10.0;10.3;12.0;12.1+PTX"),
)
#: The entries torch accepts (torch 2.13 ``supported_arches``), each also with ``+PTX``.
TORCH_SUPPORTED = ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7",
                   "8.9", "9.0", "9.0a", "10.0", "10.0a", "11.0", "11.0a", "10.3", "10.3a", "12.0", "12.0a", "12.1",
                   "12.1a")
BF16_MIN = (8, 0)
FP16_MIN = (7, 0)

_GENCODE = re.compile(r"(?:-gencode[= ]|--generate-code[= ])['\"]?arch=(compute_\d+[a-z]?),code=\[?([\w,]+)\]?")
_CONFIG_FLAGS = re.compile(r"NVCC architecture flags:\s*(\S+)")
_ARCH_WORD = re.compile(r"^(compute|sm)_(\d+)([a-z]?)$")


def cc_tuple(cc: Any) -> tuple[int, int] | None:
    """``"9.0"`` -> ``(9, 0)``; None when unknown or malformed."""
    m = re.fullmatch(r"(\d+)\.(\d+)", str(cc or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def arch_number(cc: tuple[int, int]) -> str:
    """``(9, 0)`` -> ``"90"``, as nvcc names it in ``compute_90``."""
    return f"{cc[0]}{cc[1]}"


def _word_cc(word: str) -> tuple[tuple[int, int], str] | None:
    """``"sm_90a"`` -> ``((9, 0), "a")``; ``"compute_100"`` -> ``((10, 0), "")``."""
    m = _ARCH_WORD.match(word)
    if not m:
        return None
    num = m.group(2)
    return (int(num[:-1]), int(num[-1])), m.group(3)


def expand_arch_list(text: str) -> dict[str, Any]:
    """An arch list as torch reads it: ``{entries: [{text, cc, suffix, ptx}], unknown: [entries torch
    refuses]}`` (``cc`` "8.6"; ``suffix`` "a" for an arch-specific entry)."""
    s = text.replace(" ", ";")
    for name, value in NAMED_ARCHES:
        s = s.replace(name, value)
    entries, unknown = [], []
    for item in s.split(";"):
        base = item[:-4] if item.endswith("+PTX") else item
        if base not in TORCH_SUPPORTED:
            unknown.append(item)
            continue
        m = re.fullmatch(r"(\d+\.\d+)([a-z]?)", base)
        if m:
            entries.append({"text": item, "cc": m.group(1), "suffix": m.group(2), "ptx": item.endswith("+PTX")})
    return {"entries": entries, "unknown": unknown}


def named_entries(arch_list: str) -> list[str]:
    """The entries of an arch list that are not numbers (``Hopper``, ``Ampere+PTX``)."""
    items = [c.strip() for c in arch_list.replace(" ", ";").split(";") if c.strip()]
    return [c for c in items if not re.fullmatch(r"\d+\.\d+[a-z]?(?:\+PTX)?", c)]


def gencode_of_entries(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The (arch, code) pairs torch emits for expanded entries, sorted as its set of flags."""
    out: set[tuple[str, str]] = set()
    for e in entries:
        cc = cc_tuple(e["cc"])
        if cc is None:
            continue
        num = arch_number(cc) + e.get("suffix", "")
        out.add((f"compute_{num}", f"sm_{num}"))
        if e.get("ptx"):
            out.add((f"compute_{num}", f"compute_{num}"))
    return sorted(out)


def gencode_pairs(text: str) -> list[tuple[str, str]]:
    """Every (arch, code) pair of the ``-gencode`` flags in ``text`` (a build.ninja, torch's build config);
    ``code=[sm_80,compute_80]`` gives one pair per code."""
    out: list[tuple[str, str]] = []
    for arch, codes in _GENCODE.findall(text or ""):
        for code in codes.split(","):
            if code and (arch, code) not in out:
                out.append((arch, code))
    return out


def torch_build_pairs(config: str | None) -> list[tuple[str, str]] | None:
    """The arch flags torch itself was built with, from ``torch.__config__.show()`` ("NVCC architecture
    flags: -gencode;arch=compute_75,code=sm_75;..."); None when the text does not say."""
    m = _CONFIG_FLAGS.search(config or "")
    if not m:
        return None
    return gencode_pairs(m.group(1).replace(";arch=", " arch=").replace("-gencode arch=", "-gencode=arch="))


def parse_list_gpu_arch(stdout: str) -> list[str]:
    """``nvcc --list-gpu-arch`` -> ``["compute_75", "compute_80", ...]``."""
    return [w for w in (stdout or "").split() if _ARCH_WORD.match(w) and w.startswith("compute_")]


def runs_on(cc: tuple[int, int], pairs: list[tuple[str, str]]) -> str | None:
    """How a binary built with ``pairs`` runs on a GPU of capability ``cc``: ``"sm_86 cubin"``,
    ``"compute_80 PTX (compiled by the driver at load)"``, or None (no kernel image for it)."""
    for _arch, code in pairs:
        got = _word_cc(code)
        if got and code.startswith("sm_"):
            have, suffix = got
            if (suffix and have == cc) or (not suffix and have[0] == cc[0] and have[1] <= cc[1]):
                return f"{code} cubin"
    for _arch, code in pairs:
        got = _word_cc(code)
        if got and code.startswith("compute_") and not got[1] and got[0] <= cc:
            return f"{code} PTX (compiled by the driver at load)"
    return None


def unbuildable(pairs: list[tuple[str, str]], nvcc_archs: list[str]) -> list[str]:
    """The ``compute_XY`` of ``pairs`` that an nvcc listing ``nvcc_archs`` cannot build (its order kept)."""
    have = set(nvcc_archs)
    out: list[str] = []
    for arch, _code in pairs:
        base = re.sub(r"[a-z]$", "", arch)  # nvcc lists compute_90, and builds compute_90a with it
        if arch not in have and base not in have and arch not in out:
            out.append(arch)
    return out


def deepspeed_jit_list(env_list: str | None, gpu_ccs: list[Any]) -> tuple[str | None, str]:
    """The arch list DeepSpeed's JIT build of an op uses (op_builder/builder.py ``compute_capability_args``,
    jit mode): ``TORCH_CUDA_ARCH_LIST`` when set, else the visible GPUs' capabilities; ``+PTX`` is added to
    the highest when no entry has it. (list, where it came from); the list is None when it is not known."""
    if env_list and env_list.strip():
        items = [c.strip() for c in env_list.strip().replace(" ", ";").split(";") if c.strip()]
        source = "TORCH_CUDA_ARCH_LIST"
    else:
        if not gpu_ccs or any(cc_tuple(c) is None for c in gpu_ccs):
            return None, "the GPUs' compute capabilities (not known here)"
        items = sorted(set(gpu_ccs), key=lambda c: cc_tuple(c) or (0, 0))
        source = "the visible GPUs' compute capabilities (TORCH_CUDA_ARCH_LIST is not set)"
    if items and not any("+PTX" in c for c in items):
        items[-1] += "+PTX"
    return ";".join(items), source


#: The first CUDA release whose nvcc builds each architecture a GPU newer than an older toolkit has (NVIDIA's
#: CUDA 11.8 release notes: Ada sm_89 and Hopper sm_90; the Blackwell Compatibility Guide, "Building
#: Applications Using CUDA Toolkit 12.8": sm_100, sm_101 and sm_120 need 12.8). Others are not listed: the
#: remedy then names the architecture alone.
FIRST_TOOLKIT: dict[str, str] = {"compute_89": "11.8", "compute_90": "11.8", "compute_100": "12.8",
                                 "compute_101": "12.8", "compute_120": "12.8"}
#: Where each release in :data:`FIRST_TOOLKIT` is documented to build them.
TOOLKIT_SOURCES: dict[str, str] = {"11.8": "NVIDIA CUDA 11.8 release notes (Ada and Hopper support)",
                                   "12.8": "NVIDIA Blackwell Compatibility Guide (building with CUDA Toolkit 12.8)"}
#: Architectures of NVIDIA's embedded (Tegra) chips, passed over for a PTX fallback on a data-centre GPU.
TEGRA = {53, 62, 72, 87, 101, 110, 121}


def _arch_int(arch: str) -> int | None:
    m = re.fullmatch(r"compute_(\d+)", arch)
    return int(m.group(1)) if m else None


def ptx_fallback(cc: tuple[int, int], nvcc_archs: list[str]) -> str | None:
    """The arch-list entry that lets an nvcc listing ``nvcc_archs`` build for a GPU of capability ``cc`` it
    does not know: PTX of the newest architecture it lists that is not newer than the GPU (``"8.6+PTX"``),
    which the driver compiles for the GPU at load (CUDA C++ Programming Guide, "PTX Compatibility"); None
    when it lists none."""
    own = cc[0] * 10 + cc[1]
    found = sorted((n for n in (_arch_int(a) for a in nvcc_archs) if n is not None and n <= own and n not in TEGRA),
                   reverse=True)
    return f"{found[0] // 10}.{found[0] % 10}+PTX" if found else None


def toolkit_for(arch: str) -> str | None:
    """The first CUDA release whose nvcc builds ``arch`` (``compute_90`` -> ``"11.8"``), when known."""
    return FIRST_TOOLKIT.get(re.sub(r"[a-z]$", "", arch))


def ptx_arch_list(listed: str, gpu_ccs: list[Any], nvcc_archs: list[str]) -> str | None:
    """For an arch list ``listed`` that asks an nvcc listing ``nvcc_archs`` for a GPU's own architecture it
    cannot build: the list with what it can build kept and, for each such GPU, :func:`ptx_fallback`
    (``"8.0;9.0"`` with CUDA 11.7 -> ``"8.0;8.6+PTX"``); None when no GPU here needs what it cannot build."""
    entries = expand_arch_list(listed)["entries"]
    bad = set(unbuildable(gencode_of_entries(entries), nvcc_archs))
    own = [t for t in (cc_tuple(c) for c in gpu_ccs) if t and f"compute_{arch_number(t)}" in bad]
    if not own:
        return None
    keep = [e["text"] for e in entries if not unbuildable(gencode_of_entries([e]), nvcc_archs)]
    extra = [p for p in (ptx_fallback(t, nvcc_archs) for t in own) if p]
    if not extra:
        return None
    out = list(dict.fromkeys(keep + extra))
    return ";".join(sorted(out, key=lambda e: cc_tuple(e.split("+")[0]) or (0, 0)))
