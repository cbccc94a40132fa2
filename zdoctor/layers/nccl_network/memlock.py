"""The locked-memory limit (RLIMIT_MEMLOCK) RDMA registration meets, where the ranks really get it: a running
rank's own ``/proc/PID/limits``, and the limit a process started through ssh on a host gets (pdsh, mpirun's
daemons and the fleet all start through ssh, and sshd hands its sessions the limits of PAM or its own
unit, not the launching shell's).

Limits are in KiB as ``ulimit -l`` prints them (an int), or ``"unlimited"``.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from zdoctor.proc.runner import run
from zdoctor.proc.systools import system_tool_or_name
from zdoctor.proc.userfile import open_regular
from zdoctor.readers.hostlimits import parse_limit

SSH_TIMEOUT = 5
SSH_PARALLEL = 8
#: What the shell on the host prints: soft, then hard, then its effective capabilities.
ULIMIT_L = "ulimit -S -l; ulimit -H -l; grep CapEff /proc/self/status"
#: CAP_IPC_LOCK's bit: a process that has it may lock (and register) memory beyond RLIMIT_MEMLOCK.
CAP_IPC_LOCK = 14


def ipc_lock_of(status_text: str) -> bool | None:
    """Whether the ``CapEff`` line of a ``/proc/PID/status`` text has CAP_IPC_LOCK (None without the line)."""
    for line in (status_text or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
            except (IndexError, ValueError):
                return None
    return None


def _kib(text: str) -> int | str | None:
    t = text.strip()
    if t == "unlimited":
        return "unlimited"
    return int(t) // 1024 if t.isdigit() else None


def parse_proc_limits(text: str) -> dict[str, Any]:
    """``Max locked memory`` of a ``/proc/PID/limits`` text (bytes there) -> ``{soft_kb, hard_kb}``."""
    for line in (text or "").splitlines():
        if line.startswith("Max locked memory"):
            parts = line[len("Max locked memory"):].split()
            if len(parts) >= 2:
                return {"soft_kb": _kib(parts[0]), "hard_kb": _kib(parts[1])}
    return {"soft_kb": None, "hard_kb": None}


def _read(path: str) -> str:
    with open_regular(path) as fh:
        return fh.read(64 * 1024).decode("ascii", "replace")


def process_memlock(pid: int) -> dict[str, Any]:
    """A running process's locked-memory limit and whether it has CAP_IPC_LOCK:
    ``{pid, soft_kb, hard_kb, ipc_lock, error}``."""
    try:
        limits = parse_proc_limits(_read(f"/proc/{int(pid)}/limits"))
        ipc_lock = ipc_lock_of(_read(f"/proc/{int(pid)}/status"))
    except OSError as exc:
        return {"pid": pid, "soft_kb": None, "hard_kb": None, "ipc_lock": None, "error": exc.strerror or str(exc)}
    return {"pid": pid, **limits, "ipc_lock": ipc_lock, "error": None}


def ssh_memlock(hosts: list[str], run_as: Any = None, port: str | None = None) -> list[dict[str, Any]]:
    """``ssh -o BatchMode=yes HOST 'ulimit -S -l; ulimit -H -l; grep CapEff ...'`` for each host, concurrently
    and bounded, as the training user: ``[{host, soft_kb, hard_kb, ipc_lock, error}]``."""
    ssh = system_tool_or_name("ssh")

    def one(host: str) -> dict[str, Any]:
        argv = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT}",
                *(["-p", str(port)] if port else []), "--", host, ULIMIT_L]
        ev = run(argv, timeout=SSH_TIMEOUT + 5, run_as=run_as, label=f"ssh {host} ulimit -l")
        lines = (ev.stdout or "").splitlines()
        if ev.exit_code != 0 or len(lines) < 2:
            said = (ev.stderr or ev.error or "").strip().splitlines()
            return {"host": host, "soft_kb": None, "hard_kb": None, "ipc_lock": None,
                    "error": said[-1][:300] if said else f"exit code {ev.exit_code}"}
        return {"host": host, "soft_kb": parse_limit(lines[0]), "hard_kb": parse_limit(lines[1]),
                "ipc_lock": ipc_lock_of("\n".join(lines[2:])), "error": None}

    if not hosts:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(SSH_PARALLEL, len(hosts))) as pool:
        return list(pool.map(one, hosts))


def lower(a: int | str | None, b: int | str | None) -> bool:
    """Whether limit ``a`` is below ``b`` (``unlimited`` is above every number; None compares as unknown)."""
    if a is None or b is None or a == "unlimited":
        return False
    return b == "unlimited" or (isinstance(a, int) and isinstance(b, int) and a < b)
