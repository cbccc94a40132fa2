"""The remedies of a GPU or driver fault, shared by the GPU checks and the kernel log's: reset the GPU, reload
the driver's kernel modules, reboot the node. None is tried: each needs root and the GPUs idle."""

from __future__ import annotations

import shlex
from typing import Any

from zdoctor.core.model import Remedy
from zdoctor.core.plural import noun_for


def reboot_remedy() -> Remedy:
    return Remedy(title="Drain the node and reboot it", commands=["systemctl reboot"], requires_root=True,
                  note="not tried: it stops every process on the node",
                  explanation="Move the jobs off the node first. A reboot loads the kernel module that matches the "
                              "installed driver and re-initialises every GPU.")


def reload_remedy(order: list[str]) -> Remedy:
    """Unload the NVIDIA modules users first (``order``: :func:`kmod.unload_order`) and load the installed
    release again, without a reboot."""
    return Remedy(
        title="Reload the NVIDIA kernel modules (no reboot)",
        commands=["fuser -v /dev/nvidia* || true",
                  "systemctl stop nvidia-persistenced nvidia-fabricmanager 2>/dev/null || true",
                  "modprobe -r " + " ".join(shlex.quote(m) for m in order),
                  "modprobe nvidia", "nvidia-smi"],
        requires_root=True, note="not tried: it needs root and every process on the GPUs stopped",
        explanation="The first line lists the processes that hold a GPU: stop them (training, nvidia-smi "
                    "loops, monitoring agents) or the unload fails with 'Module nvidia is in use'. The "
                    "modules are removed users first (" + " -> ".join(order) + ", as /proc/modules lists "
                    "them); loading nvidia again loads the installed release. With a desktop on the "
                    "GPU (nvidia_drm in use by the display server), reboot instead. Restart the services "
                    "stopped above afterwards.")


def reset_remedy(gpus: list[dict[str, Any]]) -> Remedy:
    idx = ",".join(str(g["index"]) for g in gpus)
    return Remedy(title=f"Drain the node, then reset the {noun_for(len(gpus), 'GPU')}",
                  commands=[f"nvidia-smi -r -i {idx}"],
                  requires_root=True, verified=None,
                  explanation="A GPU reset needs every process on the GPU stopped (and persistence daemons "
                              "that hold it). Move jobs off the node first; if the reset fails or errors come "
                              "back, the GPU needs a reboot or an RMA.")
