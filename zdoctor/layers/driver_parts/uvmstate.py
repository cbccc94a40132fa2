"""The driver's state after a suspend/resume: the node's sleep records, the ``nvidia_uvm`` module and who holds
``/dev/nvidia-uvm``.

A node that was suspended and resumed without the driver saving its state (the nvidia-suspend and
nvidia-resume services, ``NVreg_PreserveVideoMemoryAllocations=1``) can come back with NVML fine and CUDA
failing with "unknown error" (cudaErrorUnknown, 999): the unified-memory module ``nvidia_uvm`` lost its state.
Reloading it clears that, and is possible only while no process holds ``/dev/nvidia-uvm``.

Sleep records are trusted by their source: the kernel's own (``PM: suspend entry``, ``PM: suspend exit``,
``ACPI: PM: Waking up from system sleep state``, hibernation's), from the kernel's facility
(:func:`zdoctor.layers.kernel_log.kernlog.from_kernel`), and systemd-sleep's in the journal, by journald's
trusted fields (``_COMM``, ``_UID`` 0). Paths are parameters, so tests read what they built.
"""

from __future__ import annotations

import os
import pwd
import re
from typing import Any, Iterable

from zdoctor.core.jsondoc import json_objects
from zdoctor.layers.kernel_log import kernlog
from zdoctor.readers.fdholders import fd_holders
from zdoctor.readers.sysread import read_small

UVM_DEVICE = "/dev/nvidia-uvm"
UVM_REFCNT = "/sys/module/nvidia_uvm/refcnt"
NVIDIA_PARAMS = "/proc/driver/nvidia/params"
#: The kernel's sleep records (kernel/power/suspend.c and hibernate.c with pr_fmt "PM: ", drivers/acpi/sleep.c
#: with "ACPI: PM: "): what each says.
KERNEL_SLEEP = (
    (re.compile(r"PM: suspend entry \((?P<state>[\w-]+)\)"), "suspend"),
    (re.compile(r"PM: suspend exit\b"), "resume"),
    (re.compile(r"PM: hibernation: hibernation entry\b"), "suspend"),
    (re.compile(r"PM: hibernation: hibernation exit\b"), "resume"),
    (re.compile(r"ACPI: PM: Waking up from system sleep state (?P<state>S\d)"), "resume"),
)
#: systemd-sleep's words, old and new releases ("Suspending system...", "Entering sleep state 'suspend'...",
#: "System resumed.", "System returned from sleep state.").
SYSTEMD_SLEEP = ((re.compile(r"^(?:Suspending system|Entering sleep state|Hibernating system)"), "suspend"),
                 (re.compile(r"^(?:System resumed|System returned from sleep)"), "resume"))
#: Processes and descriptors looked at, and seconds spent, at most, finding who holds the device.
MAX_PIDS = 8192
MAX_FDS = 4096
TIME_LIMIT_S = 3.0


def kernel_sleep(rec: dict[str, Any]) -> str | None:
    """``suspend`` or ``resume`` for one of the kernel's own sleep records; None for any other record, and for
    a look-alike written from user space (not the kernel's facility)."""
    if not kernlog.from_kernel(rec):
        return None
    text = rec.get("text") or ""
    return next((kind for pattern, kind in KERNEL_SLEEP if pattern.match(text)), None)


def journal_sleeps(lines: Iterable[str]) -> list[dict[str, Any]]:
    """systemd-sleep's records of ``journalctl -o json`` lines, by journald's trusted fields: the process
    named ``systemd-sleep`` (``_COMM``), run by root (``_UID`` 0)."""
    out = []
    for d in json_objects(lines):
        msg = d.get("MESSAGE")
        if d.get("_COMM") != "systemd-sleep" or str(d.get("_UID")) != "0" or not isinstance(msg, str):
            continue
        kind = next((k for pattern, k in SYSTEMD_SLEEP if pattern.match(msg)), None)
        if kind:
            realtime = str(d.get("__REALTIME_TIMESTAMP") or "")
            when = int(realtime) / 1e6 if realtime.isdigit() else None
            out.append({"kind": kind, "time": when, "text": msg[:300], "source": "journal (systemd-sleep)"})
    return out


def kmsg_sleeps(path: str = kernlog.KMSG, stat_path: str = "/proc/stat") -> tuple[list[dict[str, Any]], str | None]:
    """The kernel's sleep records in the kernel log (read with the kernel log layer's reader), and why it could
    not be read."""
    got = kernlog.read_kmsg(path, keep=lambda rec: kernel_sleep(rec) is not None)
    if got.error:
        return [], got.error
    btime = kernlog.boot_time(stat_path)
    return [{"kind": kernel_sleep(r), "time": kernlog.wall_time(r.get("usec"), btime), "text": r["text"][:300],
             "source": "kernel log"} for r in got.records], None


def uvm_module(proc_modules: str = "/proc/modules", refcnt: str = UVM_REFCNT) -> dict[str, Any]:
    """``loaded`` (None when /proc/modules cannot be read), ``use_count`` (its third field, which counts open
    files of /dev/nvidia-uvm and the modules that use it), ``users`` and ``refcnt`` (sysfs)."""
    text = read_small(proc_modules, 1024 * 1024)
    out: dict[str, Any] = {"loaded": None, "use_count": None, "users": [], "refcnt": None,
                           "error": None if text is not None else f"{proc_modules} could not be read"}
    if text is not None:
        line = next((ln.split() for ln in text.splitlines() if ln.startswith("nvidia_uvm ")), None)
        out["loaded"] = line is not None
        if line and len(line) >= 4:
            out["use_count"] = int(line[2]) if line[2].isdigit() else None
            out["users"] = [] if line[3] == "-" else [u for u in line[3].split(",") if u]
    ref = (read_small(refcnt, 64) or "").strip()
    out["refcnt"] = int(ref) if ref.isdigit() else None
    if out["loaded"] is None and out["refcnt"] is not None:
        out["loaded"] = True  # /proc/modules unreadable, but sysfs has the module
    return out


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def holders(device: str = UVM_DEVICE, proc_root: str = "/proc", *, time_limit: float = TIME_LIMIT_S
            ) -> tuple[list[dict[str, Any]], str | None]:
    """The processes with ``device`` open (each ``pid``, ``user``, ``command``), walking ``/proc/*/fd``
    bounded; and why the walk is incomplete (processes it may not look into, or a limit), else None."""
    owners, why = fd_holders([device], proc_root, max_pids=MAX_PIDS, max_fds=MAX_FDS, time_limit=time_limit)
    return [_process(proc_root, pid) for pid in owners.get(device, [])], why


def _process(proc_root: str, pid: int) -> dict[str, Any]:
    raw = read_small(f"{proc_root}/{pid}/cmdline", 4096) or ""
    try:
        uid = os.stat(f"{proc_root}/{pid}").st_uid
    except OSError:
        uid = -1
    return {"pid": pid, "user": _user(uid) if uid >= 0 else "unknown",
            "command": " ".join(a for a in raw.split("\0") if a)[:300] or "?"}


def preserve_allocations(params: str = NVIDIA_PARAMS) -> bool | None:
    """``PreserveVideoMemoryAllocations`` of the loaded driver (``/proc/driver/nvidia/params``); None unknown."""
    text = read_small(params, 64 * 1024)
    m = re.search(r"^PreserveVideoMemoryAllocations:\s*(\d+)", text or "", re.M)
    return bool(int(m.group(1))) if m else None
