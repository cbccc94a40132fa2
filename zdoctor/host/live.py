"""The live machine zdoctor runs on."""

from __future__ import annotations

import platform
import socket
from collections.abc import Mapping, Sequence

from zdoctor.core.model import ProbeResult
from zdoctor.host.base import Host, run_probe_guarded
from zdoctor.proc.target import Target


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
    """Runs registered probes against this machine, for one training job (its :class:`Target`).

    ``LiveHost(target=t)``; the keyword form (``python``, ``env``, ``command``, ``ext``, ``timeout``,
    ``options``) builds the target from its parts.
    """

    kind = "live"

    def __init__(self, python: str | None = None, env: Mapping[str, str] | None = None, *,
                 command: str | None = None, ext: Sequence[str] = (), timeout: float | None = None,
                 options: Mapping[str, object] | None = None, target: Target | None = None) -> None:
        super().__init__()
        self.target = target if target is not None else Target.of(
            python, env, command=command, ext=ext, timeout=timeout, options=options)
        self.info = {
            "kind": self.kind,
            "hostname": socket.gethostname(),
            "os": os_pretty_name(),
            "kernel": platform.release(),
            "arch": platform.machine(),
            **self.target.to_info(),
        }

    # The job's parts, read from the target (kept for callers that name them directly).
    @property
    def python(self) -> str:
        return self.target.python

    @property
    def python_explicit(self) -> bool:
        return self.target.python_explicit

    @property
    def env(self) -> dict[str, str]:
        return self.target.env

    @property
    def command(self) -> str | None:
        return self.target.command

    @property
    def ext(self) -> list[str]:
        return self.target.ext

    @property
    def timeout(self) -> float | None:
        return self.target.timeout

    @property
    def options(self) -> dict[str, object]:
        return self.target.options

    def _compute(self, name: str) -> ProbeResult:
        return run_probe_guarded(self, name)
