"""Which libcuda.so.1 a process takes against the loaded kernel module, and CUDA forward compatibility.

libcuda.so.1 is the user-space half of the driver: it must be the kernel module's release, except for
NVIDIA's forward-compatibility libraries (the ``cuda-compat-<major>-<minor>`` package, installed under
``/usr/local/cuda-X.Y/compat``; CUDA containers carry them in ``/usr/local/cuda/compat``), a newer libcuda
that runs on an older kernel module. NVIDIA's CUDA Compatibility guide ("Forward Compatibility"): it "is
applicable only for systems with NVIDIA Data Center GPUs, select NGC Server Ready SKUs of RTX cards, and
Jetson boards"; on any other GPU CUDA stops with error 804 (``cudaErrorCompatNotSupportedOnDevice``,
"forward compatibility was attempted on non supported HW"). A libcuda of another release without that
(an old copy on LD_LIBRARY_PATH, a compat library older than the module) is error 803
(``cudaErrorSystemDriverMismatch``). Pure functions over facts.
"""

from __future__ import annotations

import os
import re
from typing import Any

SOURCE = ("NVIDIA CUDA Compatibility guide, Forward Compatibility (docs.nvidia.com/deploy/cuda-compatibility/"
          "forward-compatibility.html): applicable only to NVIDIA Data Center GPUs, select NGC Server Ready "
          "SKUs of RTX cards and Jetson boards")
_LIB_VERSION = re.compile(r"^lib(?:cuda|nvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)$")
#: NVML brands of boards forward compatibility is not for (nvmlBrandType: GeForce, TITAN, Quadro, NVS,
#: NVIDIA RTX workstation boards).
CONSUMER_BRANDS = {"GEFORCE", "GEFORCE_RTX", "TITAN", "TITAN_RTX", "QUADRO", "QUADRO_RTX", "NVIDIA_RTX", "NVS"}
#: NVML brands of data centre boards (Tesla, and "NVIDIA" for current data centre products such as H200).
DATACENTER_BRANDS = {"TESLA", "NVIDIA"}
#: Product names of data centre GPUs (NVML's names): Tesla and the A/H/B/L series.
_DATACENTER_NAME = re.compile(
    r"\bTesla\b|\b(?:A100|A800|A40|A30|A16|A10G?|A2|H100|H200|H800|H20|GH200|B100|B200|B300|GB200|GB300|L40S?|L20|"
    r"L4|L2|T4|V100|P100|P40|P4)\b")
_CONSUMER_NAME = re.compile(r"\bGeForce\b|\bTITAN\b|\bQuadro\b|\bRTX\b|\bNVS\b")


def library_release(path: str | None) -> str | None:
    """``/usr/local/cuda-12.8/compat/libcuda.so.570.124.06`` -> ``570.124.06``."""
    m = _LIB_VERSION.match(os.path.basename(path or ""))
    return m.group(1) if m else None


def in_compat_dir(path: str | None) -> bool:
    """Whether a library lives in a forward-compatibility directory (a ``compat`` path component)."""
    return "compat" in (path or "").split("/")[:-1] or bool(re.search(r"/cuda-compat[^/]*/", path or ""))


def version_key(version: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version or ""))


def datacenter_gpu(name: str | None, brand: str | None = None) -> bool | None:
    """Whether forward compatibility is for this GPU: True for a data centre GPU, False for GeForce, TITAN,
    Quadro and RTX workstation boards, None when neither the brand nor the name says, and for RTX server
    SKUs (NVIDIA supports select "NGC Server Ready" ones, which the name does not tell apart)."""
    if name and re.search(r"\bServer Edition\b|\bNGC\b", name):
        return None  # an RTX server SKU: some are "NGC Server Ready", which the name alone does not tell
    if brand and brand.upper() in CONSUMER_BRANDS:
        return False
    if name and _CONSUMER_NAME.search(name) and not _DATACENTER_NAME.search(name):
        return False
    if name and _DATACENTER_NAME.search(name):
        return True
    if brand and brand.upper() == "TESLA":
        return True
    return None


def libcuda_verdict(libcuda: str | None, module: str | None, gpus: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The resolved libcuda.so.1's release against the kernel module's.

    ``verdict``: same (the module's release), forward (a newer compat libcuda on data centre GPUs only),
    forward-unsupported (a newer compat libcuda with a GPU it is not for: error 804), forward-unknown (the
    GPUs are not known), newer (a newer libcuda outside a compat directory: a driver upgraded under the
    module), older (an older libcuda: error 803), unknown. ``code`` is the CUDA error it gives, ``gpus``
    the GPUs it is not supported on."""
    lib = library_release(libcuda)
    out: dict[str, Any] = {"library": lib, "module": module, "compat": in_compat_dir(libcuda), "code": None,
                           "unsupported": [], "unknown_gpus": []}
    if lib is None or module is None:
        return {**out, "verdict": "unknown"}
    if version_key(lib) == version_key(module):
        return {**out, "verdict": "same"}
    if version_key(lib) < version_key(module):
        return {**out, "verdict": "older", "code": 803}
    if not out["compat"]:
        return {**out, "verdict": "newer", "code": 803}
    if gpus is None:
        return {**out, "verdict": "forward-unknown"}
    kinds = [(g, datacenter_gpu(g.get("name"), g.get("brand"))) for g in gpus]
    bad = [g for g, k in kinds if k is False]
    unknown = [g for g, k in kinds if k is None]
    out.update(unsupported=[f"GPU {g.get('index')}: {g.get('name')}" for g in bad],
               unknown_gpus=[f"GPU {g.get('index')}: {g.get('name')}" for g in unknown])
    if bad:
        return {**out, "verdict": "forward-unsupported", "code": 804}
    if unknown or not gpus:
        return {**out, "verdict": "forward-unknown"}
    return {**out, "verdict": "forward"}
