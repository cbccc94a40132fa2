"""A PCI device as the bus shows it now: present or not, its vendor and its link, from sysfs.

``/sys/bus/pci/devices/<domain:bus:device.function>/`` holds ``vendor`` (``0x10de`` is NVIDIA),
``current_link_speed``/``current_link_width`` and ``max_link_speed``/``max_link_width``. A kernel record
about a GPU is checked against these facts of the node now.
"""

from __future__ import annotations

import os
from typing import Any

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
_LINK_FILES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(128).strip() or None
    except OSError:
        return None


def pci_device(address: str, root: str = PCI_DEVICES) -> dict[str, Any]:
    """``present`` (None when the bus cannot be read at all), ``vendor`` and the link files of ``address``."""
    if not os.path.isdir(root):
        return {"address": address, "present": None, "error": f"{root} cannot be read"}
    path = os.path.join(root, address)
    if not os.path.exists(path):
        return {"address": address, "present": False, "path": path}
    out: dict[str, Any] = {"address": address, "present": True, "path": path,
                           "vendor": _read(os.path.join(path, "vendor"))}
    for name in _LINK_FILES:
        out[name] = _read(os.path.join(path, name))
    return out


def link_state(dev: dict[str, Any]) -> str:
    """``x16 at 32.0 GT/s PCIe of x16 at 32.0 GT/s PCIe (full)``, or the degraded link, or ``not read``."""
    cur_w, max_w = dev.get("current_link_width"), dev.get("max_link_width")
    cur_s, max_s = dev.get("current_link_speed"), dev.get("max_link_speed")
    if not (cur_w and max_w and cur_s and max_s):
        return "link not read"
    text = f"x{cur_w} at {cur_s} of x{max_w} at {max_s}"
    return text + (" (full)" if (cur_w, cur_s) == (max_w, max_s) else " (degraded)")
