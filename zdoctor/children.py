"""Every process zdoctor starts ends with it.

Each child runs in a process group of its own (so a timeout or a cancel ends it and everything it
started) and is registered here while it runs. When zdoctor gets SIGHUP (the SSH session dropped),
SIGTERM or SIGINT, :func:`install_signal_handlers` ends every registered group before zdoctor itself
goes. SIGKILL cannot be caught: for it, each child asks the kernel for a parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``, Linux only; elsewhere this step is skipped), so the child dies
with the thread that started it; and a small reaper process, told of every group as it starts and
ends, kills the groups still registered when its pipe from zdoctor closes (zdoctor is gone, however
it died), which also ends the grandchildren a parent-death signal does not reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1
HANDLED_SIGNALS = ("SIGHUP", "SIGTERM", "SIGINT")
#: How long the groups get to exit after SIGTERM before SIGKILL.
GRACE_S = 1.0
#: The longest the main thread waits without returning to Python (where signal handlers run).
WAIT_SLICE_S = 0.25

_groups: set[int] = set()
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
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _prctl = libc.prctl
            _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
            _prctl.restype = ctypes.c_int
        except (OSError, AttributeError):
            _prctl = False
    return _prctl or None


def pdeathsig_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent thread dies (None: unsupported).

    The child checks its parent afterwards: a parent that died between the fork and the ``prctl``
    would otherwise be missed.
    """
    prctl = _load_prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)

    return hook


# The reaper: reads "+PGID" / "-PGID" lines; at end of input (zdoctor gone) kills what is left.
REAPER = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line[1:].isdigit():
        (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
"""

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


def register(pgid: int) -> None:
    """Remember a running child's process group (its pid: it leads a session of its own).

    Once a signal is ending zdoctor, the group is killed instead: probes and re-runs still queued in
    worker threads must not start what nobody will end (the interpreter waits for those threads)."""
    with _lock:
        _groups.add(pgid)
        _tell_reaper(f"+{pgid}")
    if _closing:  # set before the signal's own look at the groups: one of the two ends this group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def forget(pgid: int) -> None:
    """The group's leader was reaped: nothing to end any more."""
    with _lock:
        _groups.discard(pgid)
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


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_all(grace: float = GRACE_S) -> list[int]:
    """SIGTERM every registered group, SIGKILL what is left after ``grace`` seconds; the groups ended.

    Takes no lock: a signal handler calls it in the main thread, which may be holding the lock itself.
    """
    groups = sorted(_groups)  # one C-level copy under the GIL
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = [g for g in groups if _alive(g)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [g for g in left if _alive(g)]
    for pgid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return groups


def _handler(signum: int, frame: Any) -> None:
    global _closing
    _closing = True  # no lock here (see end_all); register() checks it after adding a group
    end_all()
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
    for name in HANDLED_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, signal.default_int_handler, _handler):
            signal.signal(sig, _handler)
    _installed = True
    return True
