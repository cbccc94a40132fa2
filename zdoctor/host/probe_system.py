"""The node at a glance: OS, kernel, CPUs, memory, glibc."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

from zdoctor.core.factstypes import SystemFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.host.live import os_pretty_name
from zdoctor.proc.userfile import open_regular_text

MEMINFO_KEYS = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree", "HugePages_Total", "Shmem")


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per key (HugePages counts stay counts)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        value = int(parts[0])
        out[name.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


def _read(path: str, evidence: list[Evidence]) -> str | None:
    try:
        with open_regular_text(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(256 * 1024)
    except OSError as exc:
        evidence.append(Evidence(label=f"read {path}", kind="file", paths=[path],
                                 error=f"{path}: {exc.strerror or exc}"))
        return None
    return text


@probe("system", title="The node at a glance", timeout=5.0, facts=SystemFacts)
def system(host: Any) -> tuple[SystemFacts, list[Evidence]]:
    """Host name, OS, kernel, architecture, CPU count, memory and the C library."""
    evidence: list[Evidence] = []
    facts: SystemFacts = {
        "hostname": socket.gethostname(),
        "os": os_pretty_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        facts["glibc"] = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        facts["glibc"] = None
    text = _read("/proc/meminfo", evidence)
    if text is not None:
        mem = parse_meminfo(text)
        facts["memory"] = {k: mem[k] for k in MEMINFO_KEYS if k in mem}
        evidence.append(Evidence(label="read /proc/meminfo", kind="file", paths=["/proc/meminfo"],
                                 stdout="\n".join(line for line in text.splitlines()
                                                  if line.split(":")[0] in MEMINFO_KEYS)))
    return facts, evidence
