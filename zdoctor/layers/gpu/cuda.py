"""CUDA versions and the rules torch, DeepSpeed and nvcc apply to them.

- ``find_cuda_home``: CUDA_HOME exactly as ``torch.utils.cpp_extension._find_cuda_home`` finds it.
- ``deepspeed_nvcc_rule`` / ``torch_nvcc_rule``: what DeepSpeed's op builder
  (``op_builder/builder.py: assert_no_cuda_mismatch``) and torch's JIT (``_check_cuda_version``) decide
  for an nvcc release next to ``torch.version.cuda``, with their exact messages.
- ``NVCC_GCC_MAX`` / ``parse_host_config``: the newest GCC major nvcc accepts as host compiler, from
  NVIDIA's ``include/crt/host_config.h`` (``#if __GNUC__ > N`` -> ``#error -- unsupported GNU version!``).
- ``driver_runtime_verdict``: a CUDA runtime against the CUDA version the driver supports.
- ``wheel_variant`` / ``toolkit_install``: the torch wheel index and toolkit package that fit.
- ``parse_collect_env``: the output of ``python -m torch.utils.collect_env``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from zdoctor.core import packages
from zdoctor.proc.runner import which_all

# -- versions --------------------------------------------------------------------------------------

_MAJOR_MINOR = re.compile(r"(\d+)\.(\d+)")


def parse_cuda(text: str | int | None) -> tuple[int, int] | None:
    """``"12.4"`` / ``"12.4.131"`` / ``12040`` (the driver API's integer) -> ``(12, 4)``; None otherwise."""
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, int):
        if text <= 0:
            return None
        return text // 1000, (text % 1000) // 10
    m = _MAJOR_MINOR.search(str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def cuda_str(version: tuple[int, int] | str | int | None) -> str | None:
    """``(12, 4)`` / ``12040`` / ``"12.4.1"`` -> ``"12.4"``."""
    ver = version if isinstance(version, tuple) else parse_cuda(version)
    return f"{ver[0]}.{ver[1]}" if ver else None


def parse_nvcc_version(text: str) -> dict[str, Any]:
    """Read ``nvcc --version`` as DeepSpeed does: the token after ``release``, cut to major.minor.

    Returns ``release`` ("13.0" or None), ``build`` ("V13.0.88" or None) and ``error``.
    """
    tokens = (text or "").split()
    out: dict[str, Any] = {"release": None, "build": None, "error": None}
    if "release" not in tokens or tokens.index("release") + 1 >= len(tokens):
        out["error"] = "no 'release X.Y' in the output of nvcc --version"
        return out
    release = tokens[tokens.index("release") + 1].replace(",", "").split(".")
    if len(release) < 2 or not all(p.isdigit() for p in release[:2]):
        out["error"] = f"unexpected release token {tokens[tokens.index('release') + 1]!r}"
        return out
    out["release"] = f"{int(release[0])}.{int(release[1])}"
    build = re.search(r"\bV(\d+(?:\.\d+)+)", text)
    out["build"] = f"V{build.group(1)}" if build else None
    return out


# -- CUDA_HOME as torch finds it ---------------------------------------------------------------------


def find_cuda_home(env: Mapping[str, str], *, exists: Callable[[str], bool] = os.path.exists,
                   which: Callable[[str, str | None], list[str]] | None = None) -> dict[str, Any]:
    """CUDA_HOME as torch's ``_find_cuda_home`` picks it, for the environment ``env``.

    Order: ``$CUDA_HOME``, else ``$CUDA_PATH`` (``os.environ.get(...) or os.environ.get(...)``: an empty
    CUDA_HOME falls through to CUDA_PATH), else two directories up from the first ``nvcc`` on PATH, else
    ``/usr/local/cuda`` when it exists. Returns ``path`` (None when torch finds none), ``source`` and
    ``nvcc`` (``path/bin/nvcc``, the compiler DeepSpeed and torch run).
    """
    if which is None:

        which = which_all
    value = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    source = "$CUDA_HOME" if env.get("CUDA_HOME") else "$CUDA_PATH" if env.get("CUDA_PATH") else None
    if value is None:
        found = which("nvcc", env.get("PATH"))
        if found:
            value, source = os.path.dirname(os.path.dirname(found[0])), f"nvcc on PATH ({found[0]})"
        elif exists("/usr/local/cuda"):
            value, source = "/usr/local/cuda", "/usr/local/cuda"
    elif not value:  # set, but empty: torch keeps the empty string and treats it as "no CUDA"
        source = "$CUDA_HOME / $CUDA_PATH set to an empty string"
    home = value or None
    return {"path": home, "source": source, "nvcc": os.path.join(home, "bin", "nvcc") if home else None}


# -- DeepSpeed's and torch's nvcc rules --------------------------------------------------------------

#: DeepSpeed op_builder/builder.py ``cuda_minor_mismatch_ok``: minors of one major it accepts together.
DS_MINOR_MISMATCH_OK: dict[int, tuple[str, ...]] = {
    10: ("10.0", "10.1", "10.2"),
    11: ("11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8"),
    12: ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9"),
}
DS_MISSING_CUDA = "CUDA_HOME does not exist, unable to compile CUDA op(s)"


def ds_mismatch_message(sys_cuda: str, torch_cuda: str) -> str:
    """DeepSpeed's CUDAMismatchException text for an nvcc release ``sys_cuda`` and ``torch.version.cuda``."""
    return (f">- DeepSpeed Op Builder: Installed CUDA version {sys_cuda} does not match the version torch was "
            f"compiled with {torch_cuda}, unable to compile cuda/cpp extensions without a matching cuda version.")


def deepspeed_nvcc_rule(nvcc_release: str, torch_cuda: str, env: Mapping[str, str],
                        installed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """DeepSpeed's ``assert_no_cuda_mismatch``: ``verdict`` match | compatible | skipped | mismatch.

    Same major.minor: match. Different, but same major and both minors listed in
    ``cuda_minor_mismatch_ok``: accepted with a notice. Otherwise ``DS_SKIP_CUDA_CHECK=1`` lets it pass with
    a warning, else the op build raises with ``message``. ``installed`` is the rule read from the installed
    release (zdoctor/layers/python_env/dsrules.py): its own table, or ``state`` old (no table: releases before
    DeepSpeed PR 1139 accept only nvcc 11.1 with torch 11.0 besides an exact match), and whether it knows
    DS_SKIP_CUDA_CHECK (PR 3436). ``rule`` in the result says which rule was applied.
    """
    sys_ver = parse_cuda(nvcc_release)
    torch_mm = ".".join(str(torch_cuda).split(".")[:2])
    if sys_ver is None:
        return {"verdict": "unknown", "message": f"cannot read nvcc's release {nvcc_release!r}"}
    sys_cuda = f"{sys_ver[0]}.{sys_ver[1]}"
    if sys_cuda == torch_mm:
        return {"verdict": "match", "message": None}
    table: Mapping[int, Any] = DS_MINOR_MISMATCH_OK
    rule = "current"
    if installed is not None and installed.get("state") == "old":
        table, rule = ({11: ("11.0", "11.1")} if installed.get("exception_11_1") else {}), "old"
    elif installed is not None and installed.get("table"):
        table, rule = {int(k): tuple(v) for k, v in installed["table"].items()}, "installed"
    ok = table.get(sys_ver[0], ())
    if rule == "old" and (sys_cuda, torch_mm) != ("11.1", "11.0"):
        ok = ()
    if sys_cuda in ok and torch_mm in ok:
        return {"verdict": "compatible", "rule": rule,
                "message": f"Installed CUDA version {sys_cuda} does not match the version torch was compiled "
                           f"with {torch_cuda} but since the APIs are compatible, accepting this combination"}
    skip_known = installed is None or installed.get("skip_env", True)
    if skip_known and env.get("DS_SKIP_CUDA_CHECK", "0") == "1":
        return {"verdict": "skipped", "rule": rule,
                "message": f"DeepSpeed Op Builder: Installed CUDA version {sys_cuda} does not match the version "
                           f"torch was compiled with {torch_cuda}.Detected `DS_SKIP_CUDA_CHECK=1`: Allowing this "
                           "combination of CUDA, but it may result in unexpected behavior."}
    return {"verdict": "mismatch", "rule": rule, "message": ds_mismatch_message(sys_cuda, str(torch_cuda))}


def torch_nvcc_rule(nvcc_release: str, torch_cuda: str) -> dict[str, Any]:
    """torch.utils.cpp_extension ``_check_cuda_version``: another major raises, another minor warns."""
    sys_ver, torch_ver = parse_cuda(nvcc_release), parse_cuda(torch_cuda)
    if sys_ver is None or torch_ver is None:
        return {"verdict": "unknown", "message": None}
    if sys_ver == torch_ver:
        return {"verdict": "match", "message": None}
    if sys_ver[0] != torch_ver[0]:
        # torch concatenates two literals without a space: "compile" "PyTorch" -> "compilePyTorch".
        return {"verdict": "mismatch",
                "message": f"The detected CUDA version ({cuda_str(sys_ver)}) mismatches the version that was used "
                           f"to compilePyTorch ({torch_cuda}). Please make sure to use the same CUDA versions."}
    return {"verdict": "minor",
            "message": f"The detected CUDA version ({cuda_str(sys_ver)}) has a minor version mismatch with the "
                       f"version that was used to compile PyTorch ({torch_cuda}). Most likely this shouldn't be a "
                       "problem."}


# -- nvcc's host compiler ------------------------------------------------------------------------------

#: Newest GCC major nvcc accepts (``#if __GNUC__ > N`` in NVIDIA's include/crt/host_config.h; the CUDA
#: installation guide's host-compiler table). Used when the toolkit's own header cannot be read.
NVCC_GCC_MAX: dict[tuple[int, int], int] = {
    (10, 0): 7, (10, 1): 8, (10, 2): 8,
    (11, 0): 9, (11, 1): 10, (11, 2): 10, (11, 3): 10, (11, 4): 11, (11, 5): 11, (11, 6): 11, (11, 7): 11,
    (11, 8): 11,
    (12, 0): 12, (12, 1): 12, (12, 2): 12, (12, 3): 12, (12, 4): 13, (12, 5): 13, (12, 6): 13, (12, 8): 14,
    (12, 9): 14,
    (13, 0): 15,
}
#: torch.utils.cpp_extension ``CUDA_GCC_VERSIONS`` (torch 2.13): (min, max exclusive) of the C++ compiler
#: torch accepts next to an nvcc release when it JIT-builds a CUDA extension from a binary wheel.
TORCH_CUDA_GCC: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "11.0": ((5, 0, 0), (10, 0)), "11.1": ((5, 0, 0), (11, 0)), "11.2": ((5, 0, 0), (11, 0)),
    "11.3": ((5, 0, 0), (11, 0)), "11.4": ((6, 0, 0), (12, 0)), "11.5": ((6, 0, 0), (12, 0)),
    "11.6": ((6, 0, 0), (12, 0)), "11.7": ((6, 0, 0), (12, 0)), "12.0": ((6, 0, 0), (13, 0)),
    "12.1": ((6, 0, 0), (13, 0)), "12.2": ((6, 0, 0), (13, 0)), "12.3": ((6, 0, 0), (14, 0)),
    "12.4": ((6, 0, 0), (14, 0)), "12.5": ((6, 0, 0), (14, 0)), "12.6": ((6, 0, 0), (14, 0)),
    "12.7": ((6, 0, 0), (14, 0)), "12.8": ((6, 0, 0), (15, 0)), "12.9": ((6, 0, 0), (15, 0)),
    "13.0": ((6, 0, 0), (16, 0)),
}

_GNUC_MAX = re.compile(r"^\s*#\s*if\s+__GNUC__\s*>\s*(\d+)\s*$", re.MULTILINE)
_GNUC_MIN = re.compile(r"^\s*#\s*if\s+__GNUC__\s*<\s*(\d+)\b", re.MULTILINE)
_GNU_ERROR = re.compile(r"^\s*#\s*error\s+--\s+unsupported GNU version!.*$", re.MULTILINE)


def parse_host_config(text: str) -> dict[str, Any]:
    """The GCC limits in NVIDIA's ``crt/host_config.h``: ``gcc_max`` (newest accepted major), ``gcc_min``
    (oldest, when the header has a lower bound) and the ``#error`` line nvcc prints."""
    mx = _GNUC_MAX.search(text or "")
    mn = _GNUC_MIN.search(text or "")
    err = _GNU_ERROR.search(text or "")
    return {"gcc_max": int(mx.group(1)) if mx else None, "gcc_min": int(mn.group(1)) if mn else None,
            "error_line": err.group(0).strip() if err else None}


def gcc_max_for(cuda: str | None) -> tuple[int | None, str]:
    """(newest GCC major, where the number comes from) for a CUDA release from the table."""
    ver = parse_cuda(cuda)
    if ver is None:
        return None, "unknown CUDA release"
    if ver in NVCC_GCC_MAX:
        return NVCC_GCC_MAX[ver], f"NVIDIA's host-compiler table for CUDA {cuda_str(ver)}"
    same_major = sorted(v for v in NVCC_GCC_MAX if v[0] == ver[0] and v <= ver)
    if same_major:
        v = same_major[-1]
        return NVCC_GCC_MAX[v], f"CUDA {cuda_str(ver)} is newer than the table; at least GCC {NVCC_GCC_MAX[v]} " \
                                f"as for CUDA {cuda_str(v)}"
    return None, f"no host-compiler data for CUDA {cuda_str(ver)}"


HOST_CONFIG_PATHS = ("include/crt/host_config.h", "targets/x86_64-linux/include/crt/host_config.h",
                     "targets/sbsa-linux/include/crt/host_config.h")


# -- driver vs runtime -----------------------------------------------------------------------------------

#: Minimum driver branch for minor-version compatibility within a CUDA major (CUDA Compatibility guide).
MIN_DRIVER_FOR_MAJOR = {11: "450.80.02", 12: "525.60.13", 13: "580"}


def driver_runtime_verdict(driver_cuda: str | int | None, runtime: str | None) -> dict[str, Any]:
    """A CUDA runtime against the newest CUDA the driver supports.

    ``verdict``: ok (runtime <= driver), minor (same major, newer minor: runs through minor-version
    compatibility, but PTX newer than the driver cannot be JIT-compiled), too_old (another major: CUDA
    fails with "CUDA driver version is insufficient for CUDA runtime version") or unknown.
    """
    drv, rt = parse_cuda(driver_cuda), parse_cuda(runtime)
    if drv is None or rt is None:
        return {"verdict": "unknown", "driver": cuda_str(drv), "runtime": cuda_str(rt)}
    # minor-version compatibility exists from CUDA 11 on: before it a newer minor is as fatal as a major
    verdict = "ok" if rt <= drv else "minor" if rt[0] == drv[0] and rt[0] >= 11 else "too_old"
    return {"verdict": verdict, "driver": cuda_str(drv), "runtime": cuda_str(rt),
            "no_minor_compat": rt[0] < 11}


# -- why CUDA did not start ------------------------------------------------------------------------------

#: cudaError_t numbers torch reports at CUDA start (CUDA runtime API, driver_types.h): name, what the
#: runtime prints, and where the cause usually is.
CUDA_INIT_ERRORS: dict[int, tuple[str, str, str]] = {
    3: ("cudaErrorInitializationError", "initialization error",
        "the CUDA driver could not start: device nodes /dev/nvidia* missing or not accessible, or the kernel "
        "module is not loaded"),
    35: ("cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version",
         "no driver, or one older than the CUDA runtime torch carries"),
    46: ("cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable",
         "the GPUs are in exclusive-process or prohibited compute mode and taken, or held by another container"),
    100: ("cudaErrorNoDevice", "no CUDA-capable device is detected",
          "CUDA_VISIBLE_DEVICES hides every GPU, or the container was given none"),
    101: ("cudaErrorInvalidDevice", "invalid device ordinal", "CUDA_VISIBLE_DEVICES names a GPU that is not there"),
    802: ("cudaErrorSystemNotReady", "system not yet initialized",
          "on NVSwitch systems (HGX/DGX) the NVIDIA Fabric Manager is not running, or is another version than "
          "the driver: `systemctl status nvidia-fabricmanager`, `nvidia-smi -q | grep -A2 Fabric`"),
    803: ("cudaErrorSystemDriverMismatch", "system has unsupported display driver / cuda driver combination",
          "the libcuda.so.1 that was loaded belongs to another driver release than the kernel module: a "
          "cuda-compat directory or an old libcuda on LD_LIBRARY_PATH, or a driver upgrade without a reboot"),
    804: ("cudaErrorCompatNotSupportedOnDevice", "forward compatibility was attempted on non supported HW",
          "a forward-compatibility libcuda (cuda-compat) is loaded on a GPU that does not support it "
          "(GeForce and most workstation boards): drop the cuda-compat directory from LD_LIBRARY_PATH"),
    999: ("cudaErrorUnknown", "unknown error",
          "the driver failed without saying why: often the nvidia_uvm module is not loaded (/dev/nvidia-uvm "
          "missing), or the GPU is in a bad state after a suspend/resume or an Xid error (`dmesg | grep -i "
          "xid`); reloading nvidia_uvm or a reboot clears it"),
}
#: The layer of the node each CUDA start error comes from (:mod:`zdoctor.core.nodelayers`), the finding that reads
#: it there, and the source of the rule.
CUDA_INIT_ERROR_LAYERS: dict[int, dict[str, str]] = {
    802: {"layer": "driver-parts", "finding": "gpu.driver-parts.fabric-manager",
          "cause": "Fabric Manager (NVSwitch systems): not running, or another release than the driver",
          "source": "CUDA Runtime API cudaErrorSystemNotReady (\"This error indicates that the system is not yet ready "
                    "to start any CUDA work\"); NVIDIA Fabric Manager User Guide (the GPUs of an NVSwitch "
                    "system are usable only once Fabric Manager of the driver's release has set the fabric up)"},
    803: {"layer": "driver-parts", "finding": "gpu.driver-parts.module",
          "cause": "the kernel module against the user-space driver (libcuda.so.1): an upgrade under a running "
                   "module, or a libcuda of another release first on the search path",
          "source": "CUDA Runtime API cudaErrorSystemDriverMismatch (\"a mismatch between the versions of the "
                    "display driver and the CUDA driver\")"},
    804: {"layer": "driver-parts", "finding": "gpu.driver-parts.forward-compat",
          "cause": "a forward-compatibility libcuda (cuda-compat) on a GPU it is not for",
          "source": "CUDA Runtime API cudaErrorCompatNotSupportedOnDevice; NVIDIA CUDA Compatibility guide, "
                    "Forward Compatibility (data centre GPUs only)"},
    999: {"layer": "kernel-log", "finding": "",
          "cause": "an unknown driver failure: the kernel log (NVRM and Xid records) says what the driver saw",
          "source": "CUDA Runtime API cudaErrorUnknown"},
}
#: The fixed sentences torch's c10/cuda/CUDAFunctions.cpp (device_count_impl) uses instead of a number.
_TORCH_INIT_TEXTS = (("CUDA unknown error", 999), ("CUDA driver initialization failed", 3),
                     ("The NVIDIA driver on your system is too old", 35), ("Found no NVIDIA driver", 35))
_ERROR_NUMBER = re.compile(r"\bError (\d+): ([^(\n]+)")


def cuda_init_error(text: str | None) -> dict[str, Any] | None:
    """torch's CUDA start error text -> ``{text, code, name, message, meaning, layer}`` (code None when the
    text names no known error; ``layer``: :data:`CUDA_INIT_ERROR_LAYERS`' entry, or None); None for no text."""
    if not text:
        return None
    line = text.strip().splitlines()[0] if text.strip() else text
    code: int | None = None
    m = _ERROR_NUMBER.search(text)
    if m:
        code = int(m.group(1))
    else:
        by_name = next((c for c, (_n, msg, _w) in CUDA_INIT_ERRORS.items() if msg in text), None)
        code = by_name or next((c for t, c in _TORCH_INIT_TEXTS if t in text), None)
    name, msg, meaning = CUDA_INIT_ERRORS.get(code, (None, None, None)) if code is not None else (None, None, None)
    where = CUDA_INIT_ERROR_LAYERS.get(code) if code is not None else None
    return {"text": line[:500], "code": code, "name": name, "message": msg, "meaning": meaning,
            "layer": dict(where) if where else None}


# -- remedies: wheels and toolkits -----------------------------------------------------------------------

#: CUDA variants PyTorch publishes wheel indexes for (https://download.pytorch.org/whl/cuXYZ).
TORCH_WHEEL_CUDA: tuple[tuple[int, int], ...] = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))
WHEEL_INDEX = "https://download.pytorch.org/whl/"


def wheel_variant(max_cuda: str | int | None) -> dict[str, Any] | None:
    """The newest torch wheel variant a driver supporting CUDA ``max_cuda`` runs without compatibility tricks:
    ``{"cuda": "12.6", "tag": "cu126", "index": "https://download.pytorch.org/whl/cu126"}``."""
    drv = parse_cuda(max_cuda)
    if drv is None:
        return None
    fits = [v for v in TORCH_WHEEL_CUDA if v <= drv]
    if not fits:
        return None
    v = fits[-1]
    tag = f"cu{v[0]}{v[1]}"
    return {"cuda": cuda_str(v), "tag": tag, "index": WHEEL_INDEX + tag}


def toolkit_install(cuda: str, distro: Mapping[str, Any] | None) -> dict[str, Any]:
    """The NVIDIA package of the CUDA toolkit ``cuda`` (``cuda-toolkit-12-4``) and its install steps per package
    manager this distro may have
    (``distro`` as :func:`zdoctor.layers.toolchain.probe_toolchain.read_os_release` returns it: id, id_like).

    The package comes from NVIDIA's CUDA repository (developer.download.nvidia.com/compute/cuda/repos),
    which must be configured; it installs under ``/usr/local/cuda-12.4``.
    """
    ver = parse_cuda(cuda)
    pkg = packages.cuda_toolkit_package(*(ver[:2] if ver else (None, None)))
    installs = [{"label": pm.label, "commands": pm.install(pkg)} for pm in packages.managers(distro)]
    return {"package": pkg, "installs": installs, "prefix": f"/usr/local/cuda-{cuda_str(ver)}" if ver else None}


# -- python -m torch.utils.collect_env ------------------------------------------------------------------

_COLLECT_KEYS = {
    "PyTorch version": "torch_version",
    "CUDA used to build PyTorch": "torch_cuda",
    "CUDA runtime version": "cuda_runtime",
    "Nvidia driver version": "driver",
    "GCC version": "gcc",
    "Is CUDA available": "cuda_available",
    "GPU models and configuration": "gpus",
    "Python version": "python",
    "OS": "os",
    "Libc version": "libc",
}
_PIP_LINE = re.compile(r"^\[(pip3?|conda)\]\s+(\S+?)(?:==|\s+)(\S+)")


def parse_collect_env(text: str) -> dict[str, Any]:
    """The facts in ``python -m torch.utils.collect_env`` output: versions and the pip/conda package list."""
    out: dict[str, Any] = {v: None for v in _COLLECT_KEYS.values()}
    out["packages"] = {}
    for line in (text or "").splitlines():
        pm = _PIP_LINE.match(line.strip())
        if pm:
            out["packages"][pm.group(2)] = pm.group(3)
            continue
        key, sep, value = line.partition(":")
        if sep and key.strip() in _COLLECT_KEYS:
            val = value.strip()
            out[_COLLECT_KEYS[key.strip()]] = None if val in ("", "N/A", "Could not collect") else val
    gcc = re.search(r"(\d+\.\d+(?:\.\d+)?)\s*$", out["gcc"] or "")
    out["gcc_version"] = gcc.group(1) if gcc else None
    return out
