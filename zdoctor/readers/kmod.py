"""The NVIDIA kernel modules as loaded, against the user-space driver libraries.

NVML refuses to start (``NVML_ERROR_LIB_RM_VERSION_MISMATCH``, nvidia-smi: "Failed to initialize NVML:
Driver/library version mismatch") when the kernel module that is loaded is another release than the
user-space libraries on disk: the driver package was upgraded and the old module is still in memory.
The fix is to unload the modules (users before the modules they use, as ``/proc/modules`` lists them)
and load the new one, or to reboot. Pure readers over files whose paths are parameters.
"""

from __future__ import annotations

import os
import re
from typing import Any

from zdoctor.readers.sysread import read_small

#: What nvidia-smi prints when the loaded module and the libraries differ.
MISMATCH_TEXT = "Driver/library version mismatch"
#: The NVIDIA modules, in the order they can be unloaded when nothing else says otherwise.
NVIDIA_MODULES = ("nvidia_peermem", "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_fs", "nvidia")
_KERNEL_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")
_LIB_VERSION = re.compile(r"libnvidia-ml\.so\.(\d+(?:\.\d+)+)$")


def parse_proc_modules(text: str) -> dict[str, list[str]]:
    """The NVIDIA modules in ``/proc/modules`` text: name -> the modules that use it."""
    out: dict[str, list[str]] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[0].startswith("nvidia"):
            continue
        users = [] if parts[3] == "-" else [u for u in parts[3].split(",") if u]
        out[parts[0]] = users
    return out


def unload_order(modules: dict[str, list[str]]) -> list[str]:
    """The loaded NVIDIA modules, each after every module that uses it (``modprobe -r`` order)."""
    order: list[str] = []
    rank = {m: i for i, m in enumerate(NVIDIA_MODULES)}
    pending = sorted(modules, key=lambda m: rank.get(m, -1))

    def visit(name: str, seen: tuple[str, ...] = ()) -> None:
        if name in order or name in seen:
            return
        for user in modules.get(name, []):
            if user in modules:
                visit(user, seen + (name,))
        order.append(name)

    for name in pending:
        visit(name)
    return order


def kernel_version(proc_version_text: str | None, sys_version_text: str | None) -> str | None:
    """The loaded module's version: ``/sys/module/nvidia/version``, else ``/proc/driver/nvidia/version``."""
    v = (sys_version_text or "").strip()
    if re.fullmatch(r"\d+(?:\.\d+)+", v):
        return v
    m = _KERNEL_VERSION.search(proc_version_text or "")
    return m.group(1) if m else None


def library_version(path: str | None) -> str | None:
    """``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.04`` -> ``580.159.04``."""
    m = _LIB_VERSION.search(os.path.basename(path or ""))
    return m.group(1) if m else None


def read_text(path: str) -> str | None:
    """A small text file (64 KiB at most); None when it cannot be read."""
    return read_small(path, 64 * 1024)


def collect(*, proc_modules: str = "/proc/modules", proc_version: str = "/proc/driver/nvidia/version",
            sys_version: str = "/sys/module/nvidia/version", nvml_libs: list[str] | None = None) -> dict[str, Any]:
    """``modules`` {name: [users]}, ``unload_order``, ``kernel_version``, ``library`` (the resolved
    libnvidia-ml.so.1) and ``library_version``; None where a file could not be read."""
    text = read_text(proc_modules)
    mods = parse_proc_modules(text) if text is not None else None
    lib = next((os.path.realpath(p) for p in nvml_libs or [] if os.path.exists(p)), None)
    return {"modules": mods, "unload_order": unload_order(mods) if mods is not None else None,
            "modules_error": None if text is not None else f"{proc_modules} could not be read",
            "kernel_version": kernel_version(read_text(proc_version), read_text(sys_version)),
            "library": lib, "library_version": library_version(lib)}
