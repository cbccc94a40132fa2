"""NVIDIA Fabric Manager on NVSwitch systems (HGX/DGX): is there an NVSwitch, is the service running, and
is it the driver's exact release.

On an NVSwitch system the GPUs join the NVLink fabric only through Fabric Manager; until it has, CUDA
fails at start with error 802 (``cudaErrorSystemNotReady``, "system not yet initialized"). Fabric
Manager refuses to run beside another driver release: it logs "fabric manager NVIDIA GPU driver
interface version X don't match with driver version Y. Please update with matching NVIDIA driver
package." and exits. Pure readers and parsers; paths and texts are parameters.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

from zdoctor.readers.sysread import read_value

#: The systemd unit NVIDIA's packages install.
UNIT = "nvidia-fabricmanager"
#: NVIDIA's PCI vendor id and the PCI class of an NVSwitch (0x0680: bridge, other).
NVIDIA_VENDOR = "0x10de"
NVSWITCH_CLASS = "0x0680"
#: What nv-fabricmanager logs when its release is not the driver's (older releases say "don't").
MISMATCH = re.compile(r"fabric manager NVIDIA GPU driver interface version (?P<fm>\d+(?:\.\d+)+) "
                      r"(?:don't|doesn't|don’t|doesn’t) match with driver version (?P<driver>\d+(?:\.\d+)+)")
_FM_VERSION = re.compile(r"version(?: is)?\s*:?\s*(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)


def nvswitch_evidence(*, dev_glob: str = "/dev/nvidia-nvswitch*", proc_dir: str = "/proc/driver/nvidia-nvswitch",
                      pci_root: str = "/sys/bus/pci/devices") -> list[str]:
    """What says this node has NVSwitches: their device nodes, the nvswitch driver's /proc directory, and
    NVIDIA PCI devices of class 0x0680 (each named once); empty when none is there."""
    found = sorted(glob.glob(dev_glob))[:4]
    if os.path.isdir(proc_dir):
        found.append(proc_dir)
    try:
        devices = sorted(os.listdir(pci_root))
    except OSError:
        devices = []
    for dev in devices:
        base = os.path.join(pci_root, dev)
        if read_value(os.path.join(base, "vendor")) == NVIDIA_VENDOR and \
                (read_value(os.path.join(base, "class")) or "").startswith(NVSWITCH_CLASS):
            found.append(f"PCI {dev} (10de, class 0x0680)")
    return found


def parse_systemctl_show(text: str) -> dict[str, str]:
    """``systemctl show UNIT -p ActiveState,SubState,ExecMainStatus,...`` output -> ``{key: value}``."""
    out = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def unit_state(props: dict[str, str]) -> dict[str, Any]:
    """``{active, sub, load, status, running}`` from :func:`parse_systemctl_show`'s answer; ``running`` is
    None when the unit is not installed (LoadState not-found)."""
    load = props.get("LoadState")
    active, sub = props.get("ActiveState"), props.get("SubState")
    status = props.get("ExecMainStatus") or ""
    running = None if load == "not-found" else (active == "active" and sub == "running")
    return {"load": load, "active": active, "sub": sub, "status": int(status) if status.isdigit() else None,
            "running": running}


def parse_version_output(text: str) -> str | None:
    """``nv-fabricmanager --version`` ("Fabric Manager version is : 580.95.05") -> ``580.95.05``."""
    m = _FM_VERSION.search(text or "")
    return m.group(1) if m else None


def log_mismatch(text: str) -> dict[str, str] | None:
    """The last version-mismatch line of a Fabric Manager log: ``{line, fm, driver}``; None when there is none."""
    hit = None
    for line in (text or "").splitlines():
        m = MISMATCH.search(line)
        if m:
            hit = {"line": line.strip()[:400], "fm": m.group("fm"), "driver": m.group("driver")}
    return hit


def fabric_state_from_smi(gpus: list[dict[str, Any]]) -> list[str]:
    """Each GPU's fabric state as nvidia-smi reports it (``Completed``, ``In Progress`` ...), where known."""
    return [str(g.get("fabric_state")) for g in gpus or [] if g.get("fabric_state") not in (None, "N/A")]
