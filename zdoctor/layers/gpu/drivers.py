"""NVIDIA driver rules as data: the minimum driver of each CUDA release before CUDA 11 (no minor-version
compatibility then), and the last driver branch that supports each GPU architecture.

Sources: NVIDIA CUDA Toolkit release notes, table "CUDA Toolkit and Corresponding Driver Versions" (Linux
x86_64); NVIDIA's Unix driver feature deprecation schedule ("The release 580 series will be the last to
support GPUs based on the Maxwell, Pascal, and Volta architectures"; R470 the last for Kepler, R390 the
last for Fermi); the CUDA/architecture support matrix (Kepler 3.0: last toolkit CUDA 10.2; Kepler 3.5/3.7:
CUDA 11.x).
"""

from __future__ import annotations

import re
from typing import Any

#: CUDA release -> minimum Linux x86_64 driver (GA release of that CUDA). Before CUDA 11 a runtime needs
#: at least this driver: there is no minor-version compatibility.
MIN_DRIVER_PRE_CUDA11 = {"10.2": "440.33", "10.1": "418.39", "10.0": "410.48", "9.2": "396.26", "9.1": "390.46",
                         "9.0": "384.81", "8.0": "367.48", "7.5": "352.31", "7.0": "346.46"}
#: The first CUDA major with minor-version compatibility (CUDA Compatibility guide).
MINOR_COMPAT_FROM = 11

#: Architecture -> the last driver branch that supports it (None: still supported by current branches).
ARCH_LAST_BRANCH: dict[str, int | None] = {"Fermi": 390, "Kepler": 470, "Maxwell": 580, "Pascal": 580,
                                            "Volta": 580, "Turing": None, "Ampere": None, "Ada": None,
                                            "Hopper": None, "Blackwell": None}
#: Driver branch -> the newest CUDA it supports (from the table above: 390.46 is CUDA 9.1's minimum and
#: 9.2 needs 396; 470.42.01 is CUDA 11.4's and 11.5 needs 495; R580 runs CUDA 13.0).
BRANCH_MAX_CUDA = {390: "9.1", 470: "11.4", 580: "13.0"}

#: GPU name patterns -> architecture (NVML's product names), most specific first.
_ARCH_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bGTX 75\d\b|\bGTX 9\d0\b|\bTesla M\d+|\bQuadro M\d+|\bTITAN X\b(?!p)", "Maxwell"),
    (r"\bTesla K\d+|\bGTX 6\d0\b|\bGTX 7[0-46-9]0\b|\bGTX 780\b|\bGTX TITAN\b(?! X)|\bQuadro K\d+", "Kepler"),
    (r"\bTesla [CM]20\d0|\bGTX [45]\d0\b|\bQuadro [46]000\b", "Fermi"),
    (r"\bTesla P\d+|\bGTX 10\d0\b|\bQuadro P\d+|\bTITAN Xp\b|\bTITAN X \(Pascal\)|\bP100\b|\bP40\b", "Pascal"),
    (r"\bV100\b|\bTITAN V\b|\bQuadro GV100\b", "Volta"),
    (r"\bT4\b|\bRTX 20\d0\b|\bGTX 16\d0\b|\bQuadro RTX\b|\bTITAN RTX\b", "Turing"),
    (r"\bA100\b|\bA10G?\b|\bA30\b|\bA40\b|\bRTX 30\d0\b|\bRTX A\d+", "Ampere"),
    (r"\bL4\b|\bL40S?\b|\bRTX 40\d0\b|\bRTX \d+ Ada\b", "Ada"),
    (r"\bH100\b|\bH200\b|\bH800\b|\bGH200\b", "Hopper"),
    (r"\bB100\b|\bB200\b|\bGB200\b|\bRTX 50\d0\b|\bRTX PRO \d+ Blackwell", "Blackwell"),
)


def arch_of(name: str | None) -> str | None:
    """The architecture of a GPU from its product name; None when the name is not known."""
    for pattern, arch in _ARCH_NAMES:
        if name and re.search(pattern, name):
            return arch
    return None


def driver_ceiling(gpu_names: list[str]) -> dict[str, Any]:
    """The newest driver branch every installed GPU still runs on: ``branch`` (None: no limit known),
    ``arch`` that sets it, ``max_cuda`` that branch supports, and ``unknown`` GPU names."""
    ceiling, who = None, None
    unknown = []
    for n in gpu_names:
        arch = arch_of(n)
        if arch is None:
            unknown.append(n)
            continue
        last = ARCH_LAST_BRANCH.get(arch)
        if last is not None and (ceiling is None or last < ceiling):
            ceiling, who = last, arch
    return {"branch": ceiling, "arch": who, "max_cuda": BRANCH_MAX_CUDA.get(ceiling) if ceiling else None,
            "unknown": unknown}


def min_driver_pre11(cuda: str | None) -> str | None:
    """The minimum driver of a CUDA release before 11 (``"10.2"`` -> ``"440.33"``), else None."""
    return MIN_DRIVER_PRE_CUDA11.get(cuda or "")
