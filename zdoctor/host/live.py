"""The live machine zdoctor runs on."""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping, Sequence

from ..model import ProbeResult
from .base import Host, run_probe_guarded


def os_pretty_name(path: str = "/etc/os-release") -> str:
    """PRETTY_NAME from os-release, or the kernel name when there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


class LiveHost(Host):
    """Runs registered probes against this machine.

    ``python`` is the target interpreter (the training environment's); ``python_explicit`` tells
    whether the user named it. ``env`` is the environment the training runs with (default: ours).
    """

    kind = "live"

    def __init__(self, python: str | None = None, env: Mapping[str, str] | None = None, *,
                 command: str | None = None, ext: Sequence[str] = (), timeout: float | None = None,
                 options: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.env: dict[str, str] = dict(os.environ if env is None else env)
        self.python_explicit = python is not None
        self.python = python or "python3"
        self.command = command
        self.ext = list(ext)
        self.timeout = timeout
        #: The job's description for offload/storage/GPU probes: ds_config, offload_path, model_params,
        #: model_config, nodes, gpus_per_node, train_log, io_size, gpu_sample (absent when not given).
        self.options: dict[str, object] = dict(options or {})
        self.info = {
            "kind": self.kind,
            "hostname": socket.gethostname(),
            "os": os_pretty_name(),
            "kernel": platform.release(),
            "arch": platform.machine(),
            "python": self.python,
            "python_explicit": self.python_explicit,
            "command": command,
            "ext": list(ext),
            "timeout": timeout,
            "options": dict(options or {}),
        }

    def _compute(self, name: str) -> ProbeResult:
        return run_probe_guarded(self, name)
