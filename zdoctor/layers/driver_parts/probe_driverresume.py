"""Probe ``driver_resume``: whether this boot went through suspend/resume, and the state that decides whether
``nvidia_uvm`` can be reloaded (:mod:`zdoctor.layers.driver_parts.uvmstate`).

Facts: ``sleeps`` (the kernel's and systemd-sleep's sleep records of this boot, oldest first, each with its
``kind``, ``time``, ``text`` and ``source``), ``sleep_errors`` (a source that could not be read), ``uvm`` (loaded,
use count, users, sysfs refcnt), ``holders`` (the processes with /dev/nvidia-uvm open) and ``holders_partial``,
``preserve_allocations`` (the driver's NVreg_PreserveVideoMemoryAllocations, None unknown) and ``services``
(``systemctl is-enabled`` of nvidia-suspend and nvidia-resume, each enabled/disabled/... or None unknown).
"""

from __future__ import annotations

import os
import time
from typing import Any

from zdoctor.core.factstypes import DriverResumeFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.driver_parts import uvmstate
from zdoctor.layers.kernel_log import kernlog
from zdoctor.proc.runner import run, which_all

COMMAND_TIMEOUT = 10.0
JOURNAL_LINES = 500
#: The services NVIDIA's driver installs to save and restore the GPUs' memory across a suspend.
SUSPEND_SERVICES = ("nvidia-suspend.service", "nvidia-resume.service")
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def journal_sleeps(journalctl: str | None = None) -> tuple[list[dict[str, Any]], str | None, list[Evidence]]:
    """systemd-sleep's records of this boot (``journalctl -b _COMM=systemd-sleep``, bounded)."""
    found = [journalctl] if journalctl else which_all("journalctl", SYSTEM_PATH)
    if not found:
        return [], "journalctl is not installed", []
    ev = run([found[0], "-b", "-o", "json", "-q", "--no-pager", "-n", str(JOURNAL_LINES), "_COMM=systemd-sleep"],
             timeout=COMMAND_TIMEOUT, cap=8 * 1024 * 1024, label="journalctl -b _COMM=systemd-sleep")
    if ev.error or ev.exit_code != 0:
        return [], f"journalctl: {ev.error or f'exit code {ev.exit_code}'}", [ev]
    found_sleeps = uvmstate.journal_sleeps((ev.stdout or "").splitlines())
    ev.stdout = "\n".join(s["text"] for s in found_sleeps)
    return found_sleeps, None, [ev]


def service_states(systemctl: str | None = None) -> tuple[dict[str, str | None], list[Evidence]]:
    """``systemctl is-enabled`` of each of :data:`SUSPEND_SERVICES`: its word, or None where systemctl does not
    run here (no systemd as PID 1, a container)."""
    found = [systemctl] if systemctl else which_all("systemctl", SYSTEM_PATH)
    if not found:
        return {s: None for s in SUSPEND_SERVICES}, []
    out: dict[str, str | None] = {}
    evidence = []
    for unit in SUSPEND_SERVICES:
        ev = run([found[0], "is-enabled", unit], timeout=COMMAND_TIMEOUT, label=f"systemctl is-enabled {unit}")
        evidence.append(ev)
        word = (ev.stdout or "").strip().splitlines()[0] if (ev.stdout or "").strip() else ""
        # is-enabled prints the state (exit 0 enabled, else 1); with no systemd it prints nothing usable
        out[unit] = word if word and " " not in word and not ev.error else None
    return out, evidence


def collect(*, kmsg: str = kernlog.KMSG, stat_path: str = "/proc/stat", journalctl: str | None = None,
            use_journal: bool = True, proc_modules: str = "/proc/modules", refcnt: str = uvmstate.UVM_REFCNT,
            device: str = uvmstate.UVM_DEVICE, proc_root: str = "/proc", params: str = uvmstate.NVIDIA_PARAMS,
            systemctl: str | None = None) -> tuple[dict[str, Any], list[Evidence]]:
    """The facts above; every path is a parameter so a test reads the state it built."""
    sleeps, kerr = uvmstate.kmsg_sleeps(kmsg, stat_path)
    errors = [f"kernel log: {kerr}"] if kerr else []
    evidence: list[Evidence] = []
    if use_journal:
        jsleeps, jerr, jev = journal_sleeps(journalctl)
        sleeps += jsleeps
        evidence += jev
        if jerr:
            errors.append(jerr)
    sleeps.sort(key=lambda s: s.get("time") or 0.0)
    holders, partial = uvmstate.holders(device, proc_root)
    services, sev = service_states(systemctl)
    facts: dict[str, Any] = {
        "sleeps": sleeps[-50:], "sleep_errors": errors, "uvm": uvmstate.uvm_module(proc_modules, refcnt),
        "device": device, "device_exists": os.path.exists(device), "holders": holders[:50],
        "holders_partial": partial, "preserve_allocations": uvmstate.preserve_allocations(params),
        "services": services}
    rows = [[s["kind"], _when(s.get("time")), s["source"], s["text"]] for s in facts["sleeps"][-20:]]
    table = [Evidence.of_table("Suspend and resume records of this boot", ["kind", "time", "source", "record"], rows)]
    return facts, [*table, *evidence, *sev]


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else "unknown time"


@probe("driver_resume", title="Suspend/resume of this boot, nvidia_uvm and who holds /dev/nvidia-uvm", timeout=40,
       background=True, facts=DriverResumeFacts)
def driver_resume_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """The sleep records of this boot, the nvidia_uvm module and the processes holding its device."""
    return collect()
