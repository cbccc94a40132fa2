"""Every process zdoctor starts ends with it.

Each child runs in a process group of its own (so a timeout or a cancel ends it and everything it
started) and is registered here while it runs. When zdoctor gets SIGHUP (the SSH session dropped),
SIGTERM or SIGINT, :func:`install_signal_handlers` ends every registered group before zdoctor itself
goes. SIGKILL cannot be caught: for it, each child asks the kernel for a parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``, Linux only; elsewhere this step is skipped), so the child dies
with the thread that started it; and a small reaper process, told of every group as it starts and
ends, kills the groups still registered when its pipe from zdoctor closes (zdoctor is gone, however
it died), which also ends the grandchildren a parent-death signal does not reach.

A process group is not enough: ninja starts each compiler in a group of its own, a daemon starts a
session of its own. So every command runs under a keeper (:mod:`zdoctor.proc.shim`, started by
:func:`zdoctor.proc.contain.popen`)
that is a child subreaper, kills what the command left when it exits, and ends the whole tree when
zdoctor ends it or goes away (a pipe from zdoctor reaches its end, even when zdoctor and its reaper were
both killed at once); and, where the node allows it, in a cgroup of its own (:mod:`zdoctor.proc.cgroup`),
killed as one by zdoctor, by the reaper, or by the next zdoctor that starts. zdoctor is a child
subreaper itself, so a keeper killed outright hands its tree to zdoctor, which ends it on the way out.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from zdoctor.proc import cgroup, scratch
from zdoctor.proc.leftovers import process_gone

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
HANDLED_SIGNALS = ("SIGHUP", "SIGTERM", "SIGINT")
#: How long the groups get to exit after SIGTERM before SIGKILL.
GRACE_S = 1.0
#: The longest the main thread waits without returning to Python (where signal handlers run).
WAIT_SLICE_S = 0.25

#: Running children: process group -> the directory of their cgroup ("" when none).
_groups: dict[int, str] = {}
#: Called (no arguments; returning notes for the user) once zdoctor has ended its children on the way out.
_after_end: list[Callable[[], list[str]]] = []
#: The thread that started each running group (a probe's thread is named ``probe:NAME``).
_owners: dict[int, str] = {}
#: Groups zdoctor ended before they finished by themselves (a probe abandoned, a step left).
_ended: set[int] = set()
_lock = threading.Lock()
_prctl: Any = None
_installed = False
#: Set by a signal that ends zdoctor: a child that a worker thread starts after it is ended at once.
_closing = False


def _load_prctl() -> Any:
    """libc's ``prctl``, resolved before any fork (the child only calls it); None off Linux."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            # the C library zdoctor itself runs on; ``ctypes.util.find_library`` would run ldconfig (and a
            # compiler) as children no one contains
            libc = ctypes.CDLL(None, use_errno=True)
            _prctl = libc.prctl
            _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
            _prctl.restype = ctypes.c_int
        except (OSError, AttributeError):
            _prctl = False
    return _prctl or None


def pdeathsig_hook(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when its parent thread dies (None: unsupported).

    The child checks its parent afterwards: a parent that died between the fork and the ``prctl``
    would otherwise be missed.
    """
    prctl = _load_prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)

    return hook


# The reaper: reads "+PGID CGROUP" / "-PGID" lines; at end of input (zdoctor gone) kills what is left.
REAPER = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
groups = {}
for line in sys.stdin:
    word, _, path = line.strip().partition(" ")
    if word[1:].isdigit():
        if word[0] == "+":
            groups[int(word[1:])] = path
        else:
            groups.pop(int(word[1:]), None)
for g, path in groups.items():
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
    if path:
        kind, _, where = path.partition(":")
        kill_cgroup(where, kind)
        try:
            os.rmdir(where)
        except OSError:
            pass
""" + cgroup.KILL_SOURCE

_reaper: Any = None  # the reaper's Popen; False once it could not be started


def _tell_reaper(line: str) -> None:
    """Send one line to the reaper (started on first use); a reaper that cannot run is done without."""
    global _reaper
    import subprocess

    if _reaper is None:
        try:
            _reaper = subprocess.Popen([sys.executable, "-I", "-S", "-c", REAPER], stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True, close_fds=True)
        except OSError:
            _reaper = False
    if not _reaper:
        return
    try:
        _reaper.stdin.write(line.encode() + b"\n")
        _reaper.stdin.flush()
    except (OSError, ValueError):
        _reaper = False


def set_subreaper() -> bool:
    """Make zdoctor a child subreaper: a keeper killed outright leaves its tree to zdoctor, not to init."""
    prctl = _load_prctl()
    return bool(prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def register(pgid: int, group: cgroup.Cgroup | None = None) -> None:
    """Remember a running child's process group (its pid: it leads a session of its own) and cgroup.

    Once a signal is ending zdoctor, the group is killed instead: probes and re-runs still queued in
    worker threads must not start what nobody will end (the interpreter waits for those threads)."""
    where = f"{group.kind}:{group.path}" if group is not None else ""
    with _lock:
        _groups[pgid] = where
        _owners[pgid] = threading.current_thread().name
        _tell_reaper(f"+{pgid} {where}".rstrip())
    if _closing:  # set before the signal's own look at the groups: one of the two ends this group
        if group is not None:
            group.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def forget(pgid: int) -> None:
    """The group's leader was reaped: nothing to end any more."""
    with _lock:
        _groups.pop(pgid, None)
        _owners.pop(pgid, None)
        _tell_reaper(f"-{pgid}")


def join(thread: threading.Thread, timeout: float | None = None) -> None:
    """``thread.join(timeout)`` in short slices.

    The kernel may hand a signal to any thread; Python runs its handler only in the main thread, and only
    once that thread is back in Python code. A main thread blocked in one long join would never see it.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while thread.is_alive():
        left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - time.monotonic())
        if left <= 0:
            return
        thread.join(left)


def as_completed(futures: Any) -> Any:
    """``concurrent.futures.as_completed`` waiting in short slices (see :func:`join`)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=WAIT_SLICE_S, return_when=FIRST_COMPLETED)
        yield from done


def running() -> list[int]:
    """The process groups started and not yet reaped."""
    with _lock:
        return sorted(_groups)


def alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists (a zombie leader counts)."""
    return not process_gone(pgid, group=True)


def end_all(grace: float = GRACE_S) -> list[int]:
    """SIGTERM every registered group, SIGKILL what is left after ``grace`` seconds; the groups ended.

    A keeper ends its whole tree on SIGTERM; a cgroup is killed as one at the end, whatever its members
    did in between. Takes no lock: a signal handler calls it in the main thread, which may be holding
    the lock itself.
    """
    groups = dict(_groups)  # one C-level copy under the GIL
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = [g for g in groups if alive(g)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [g for g in left if alive(g)]
    for pgid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for where in groups.values():
        if where:
            kind, _, path = where.partition(":")
            cgroup.Cgroup(path, kind).kill()
    return sorted(groups)


def end_started_by(thread_name: str, grace: float = GRACE_S) -> list[int]:
    """End every running command that the thread ``thread_name`` started (its whole tree); the groups.

    For a caller that stops waiting on work still under way (an abandoned probe): what it started must
    not run on by itself. The run that started it then reports it as ended (:func:`was_ended`)."""
    with _lock:
        mine = {g: w for g, w in _groups.items() if _owners.get(g) == thread_name}
        _ended.update(mine)
    for pgid in mine:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(g) for g in mine) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pgid, where in mine.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        if where:
            kind, _, path = where.partition(":")
            cgroup.Cgroup(path, kind).kill()
    return sorted(mine)


def was_ended(pgid: int) -> bool:
    """Whether zdoctor ended the group (it did not finish, nor reach its time limit, by itself); asked once."""
    with _lock:
        if pgid in _ended:
            _ended.discard(pgid)
            return True
    return False


def stat_fields(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent, process group ...), or [] when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return []
    return data[data.rfind(b")") + 2:].split()


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from each process's parent in /proc/PID/stat)."""
    kids: dict[int, list[int]] = {}
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []
    for name in names:
        fields = stat_fields(int(name))
        if len(fields) > 1 and fields[0] != b"Z":
            kids.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _kill_orphans() -> None:
    """SIGKILL every descendant of zdoctor but its reaper, until none is left (zdoctor is going)."""
    spare = {_reaper.pid} if _reaper else set()
    for _ in range(100):
        left = [p for p in descendants(os.getpid()) if p not in spare]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def after_end(callback: Callable[[], list[str]]) -> Callable[[], None]:
    """Run ``callback`` once zdoctor has ended its children on the way out; it returns notes for the user.

    Returns the function that takes the callback back (the run it guards finished by itself); once zdoctor
    is ending its children the callback stays: the run finished because it was ended."""
    _after_end.append(callback)

    def withdraw() -> None:
        if not _closing:
            with contextlib.suppress(ValueError):
                _after_end.remove(callback)

    return withdraw


def _run_after_end() -> list[str]:
    notes: list[str] = []
    while _after_end:
        callback = _after_end.pop()
        try:
            notes.extend(callback())
        except Exception as exc:  # noqa: BLE001 - going away: one line, not a traceback
            notes.append(f"a clean-up after ending the commands failed: {type(exc).__name__}: {exc}")
    for note in notes:
        with contextlib.suppress(OSError, ValueError):
            print(f"zdoctor: {note}", file=sys.stderr, flush=True)
    return notes


def shutdown() -> list[str]:
    """zdoctor is leaving (the guide quit, the check ended): end every child still running, then run the
    clean-ups of the runs that were ended (a stale build lock); returns their notes, also printed."""
    global _closing
    if not _groups and not _after_end:
        return []
    _closing = True
    end_all()
    return _run_after_end()


def _handler(signum: int, frame: Any) -> None:
    global _closing
    _closing = True  # no lock here (see end_all); register() checks it after adding a group
    end_all()
    _kill_orphans()
    _run_after_end()
    scratch.remove_run_folder()
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal, as the sender expects


def install_signal_handlers() -> bool:
    """End every started process group on SIGHUP, SIGTERM and SIGINT (main thread only; False elsewhere).

    A signal whose handler someone else set (not the default one) is left alone.
    """
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return False
    _load_prctl()
    set_subreaper()
    cgroup.sweep_stale()
    scratch.sweep_stale()
    for name in HANDLED_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, signal.default_int_handler, _handler):
            signal.signal(sig, _handler)
    _installed = True
    return True
