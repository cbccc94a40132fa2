"""Which processes hold a file open: ``/proc/*/fd`` walked once, bounded, the links read, never followed."""

from __future__ import annotations

import os
import time
from collections.abc import Collection


def fd_holders(targets: Collection[str], proc_root: str = "/proc", *, max_pids: int = 65536,
               max_fds: int | None = None, time_limit: float | None = None
               ) -> tuple[dict[str, list[int]], str | None]:
    """Each of ``targets`` (a descriptor's link as ``/proc/PID/fd/N`` reads it: a path, ``socket:[INODE]``) ->
    the pids holding it, lowest first; and why the walk is incomplete (processes it may not look into, or a
    limit: ``max_pids`` processes, ``max_fds`` descriptors of each, ``time_limit`` seconds), else None."""
    want = set(targets)
    owners: dict[str, list[int]] = {}
    try:
        pids = sorted(int(p) for p in os.listdir(proc_root) if p.isdigit())
    except OSError as exc:
        return owners, f"{proc_root}: {exc.strerror or exc}"
    stopped = f"stopped after {max_pids} processes" if len(pids) > max_pids else None
    deadline = time.monotonic() + time_limit if time_limit is not None else None
    refused = 0
    for pid in pids[:max_pids]:
        if deadline is not None and time.monotonic() > deadline:
            stopped = f"stopped after {time_limit:g} s"
            break
        fd_dir = f"{proc_root}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            refused += 1
            continue
        except OSError:
            continue  # gone, or a kernel thread
        for fd in fds[:max_fds]:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in want and pid not in owners.setdefault(target, []):
                owners[target].append(pid)
    return owners, stopped or (f"{refused} processes could not be looked into (not root)" if refused else None)
