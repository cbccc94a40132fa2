"""A run zdoctor kills never leaves the stale JIT build lock it diagnoses.

torch's ``FileBaton`` creates ``<op dir>/lock`` when a build starts and deletes it when the build ends;
a builder killed in between leaves it, and every later launch then waits forever. zdoctor kills the
commands it re-runs when they pass their time limit, and every command still running when zdoctor
itself goes (the guide quit, a signal), so around such a run it notes the locks that exist before;
after the kill, a lock that was not there before and that no process holds any more (none has it open
or works in its build directory, as ninja and the compilers do) was left by the killed run: it is
removed (the build directory is left as it was found) and zdoctor says so; a new lock still held by a
live process is reported, not touched.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.model import Evidence
from zdoctor.proc import children
from zdoctor.proc.runner import ENDED, run
from zdoctor.readers.jitcache import LOCK_NAME, MAX_DIR_ENTRIES, extension_roots

MAX_PROC_SCAN = 100_000


def lock_files(env: Mapping[str, str]) -> dict[str, int]:
    """Every JIT build lock under the extension cache of ``env``: path -> inode."""
    out: dict[str, int] = {}
    for root in extension_roots(env):
        try:
            with os.scandir(root) as it:
                entries = list(itertools.islice(it, MAX_DIR_ENTRIES))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(entry.path, LOCK_NAME)
            try:
                out[path] = os.lstat(path).st_ino
            except OSError:
                continue
    return out


def holders(path: str) -> list[int]:
    """Pids of the processes that hold the build of lock ``path``: have it open, or work in (or under) its
    directory (those this user may look at)."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    build = os.path.dirname(os.path.realpath(path))
    found: list[int] = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    scanned = 0
    for pid in pids:
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        if cwd == build or cwd.startswith(build + os.sep):
            found.append(int(pid))
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            scanned += 1
            if scanned > MAX_PROC_SCAN:
                return found
            try:
                st = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                found.append(int(pid))
                break
    return found


def clean_left_locks(before: Mapping[str, int], env: Mapping[str, str]) -> list[str]:
    """Remove the locks a killed run left (new since ``before`` and held by nobody); say what was done."""
    notes: list[str] = []
    for path, ino in sorted(lock_files(env).items()):
        if before.get(path) == ino:
            continue
        held = holders(path)
        if held:
            notes.append(f"a JIT build lock appeared during the run and is still held by pid "
                         f"{', '.join(map(str, held))}: left in place: {path}")
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            notes.append(f"the killed run left a JIT build lock that could not be removed "
                         f"({exc.strerror or exc}): {path}")
            continue
        notes.append(f"removed the JIT build lock the killed run left (it was not there before): {path}")
    return notes


def run_guarded(argv: Sequence[str], env: Mapping[str, str], **kwargs: Any) -> Evidence:
    """:func:`~zdoctor.proc.runner.run` that leaves torch's extension cache as found when the run is killed:
    at its time limit, or because zdoctor itself is going while it runs."""
    before = lock_files(env)
    withdraw = children.after_end(lambda: clean_left_locks(before, env))
    try:
        ev = run(argv, env=env, **kwargs)
    finally:
        withdraw()
    if ev.error and (ev.error.startswith("timed out") or ev.error == ENDED):
        notes = clean_left_locks(before, env)
        if notes:
            ev.error = "; ".join([ev.error, *notes])
    return ev
