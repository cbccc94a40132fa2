"""The one way zdoctor runs a program: argv (no shell), explicit env, timeout, capped output.

Output is capped while it is read (the first and last bytes are kept), so a command that prints
without end costs a bounded amount of memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zdoctor.core.model import OUTPUT_CAP, Evidence, cap_text
from zdoctor.proc import children, codeowner, contain

if TYPE_CHECKING:
    from zdoctor.proc.runas import RunAs

DEFAULT_TIMEOUT = 20.0
#: The error of a run zdoctor ended before it finished (its probe abandoned, zdoctor leaving).
ENDED = "stopped by zdoctor before it finished; its processes were ended"


def _kill_group(child: contain.Contained) -> None:
    """End the child's whole tree: its keeper ends it (SIGTERM), then its cgroup and group are killed."""
    child.stop(grace=children.GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        child.proc.kill()


def _not_started(argv0: str, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return f"{argv0}: executable not found"
    if isinstance(exc, PermissionError) or exc.errno == errno.EACCES:
        return f"{argv0}: permission denied"
    return f"{argv0}: cannot execute ({exc.strerror or exc})"


def _unstarted(ev: Evidence, argv0: str, exc: OSError, t0: float) -> Evidence:
    """``ev`` of a command that did not start: why, and how long the try took (since ``t0``)."""
    ev.error = _not_started(argv0, exc)
    ev.duration_s = time.monotonic() - t0
    return ev


#: How long the output of a command that has exited may stay open before zdoctor stops reading it.
HELD_OPEN_GRACE = 2.0


class OutputHeldOpen(Exception):
    """The command exited, but a process it left running keeps its standard output or error open."""

    def __init__(self, exit_code: int | None) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """``proc.wait(timeout)``, woken by the kernel the moment the child exits (a pidfd, Linux 5.3+ and
    Python 3.9+) rather than by ``Popen.wait``'s sleeps of up to 50 ms; ``Popen.wait`` where there is none.
    Only the child's exit or the end of ``timeout`` ends the wait: a poll that wakes early (a signal, the
    descriptor gone bad) waits again for the time left."""
    deadline = time.monotonic() + max(0.0, timeout)
    opener = getattr(os, "pidfd_open", None)
    if opener is not None and proc.returncode is None:
        try:
            fd = opener(proc.pid)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                while proc.poll() is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    events: list[tuple[int, int]] = []
                    with contextlib.suppress(InterruptedError):
                        events = poller.poll(left * 1000)
                    if any(flags & select.POLLNVAL for _, flags in events):
                        break  # not a pidfd any more: Popen.wait below, for the time left
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return proc.wait(max(0.0, deadline - time.monotonic()))


class _HeadTail:
    """The first and last bytes of a stream of unknown length: memory stays bounded whatever is written."""

    def __init__(self, cap: int) -> None:
        # ``cap`` is in characters; a UTF-8 character is at most 4 bytes, and :func:`cap_text` keeps
        # three quarters of the characters from the head and one quarter from the tail.
        self.head_limit = 3 * cap + 4
        self.tail_limit = cap + 4
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_limit:  # trim in batches: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.tail_limit]

    def text(self, cap: int) -> tuple[str, bool]:
        """The decoded text, cut to ``cap`` characters (head and tail kept); (text, truncated)."""
        head = self.head.decode("utf-8", "replace")
        tail = bytes(self.tail[-self.tail_limit:]).decode("utf-8", "replace")
        if self.total <= len(self.head) + len(self.tail):
            return cap_text(head + tail, cap)
        head = head[: cap * 3 // 4]
        tail = tail[max(0, len(tail) - (cap - len(head))):]
        cut = self.total - len(head.encode("utf-8", "replace")) - len(tail.encode("utf-8", "replace"))
        return f"{head}\n[... {cut} bytes cut ...]\n{tail}", True


class _Pump:
    """Read a child's stdout and stderr on threads into :class:`_HeadTail` buffers (``communicate``
    keeps everything a command prints, which an endless printer turns into gigabytes)."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes | None, cap: int,
                 on_stdout: Callable[[bytes], None] | None = None) -> None:
        self.proc = proc
        self.out = _HeadTail(cap)
        self.err = _HeadTail(cap)
        self.threads = [threading.Thread(target=self._read, args=(pipe, buf, see), daemon=True)
                        for pipe, buf, see in ((proc.stdout, self.out, on_stdout), (proc.stderr, self.err, None))
                        if pipe is not None]
        if proc.stdin is not None:
            self.threads.append(threading.Thread(target=self._write, args=(proc.stdin, stdin or b""), daemon=True))
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(pipe: Any, buf: _HeadTail, see: Callable[[bytes], None] | None) -> None:
        fd = pipe.fileno()
        with contextlib.suppress(OSError, ValueError):
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                buf.add(chunk)
                if see is not None:
                    with contextlib.suppress(Exception):  # a reader's mistake never stops the reading
                        see(chunk)

    @staticmethod
    def _write(pipe: Any, data: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            pipe.write(data)
        with contextlib.suppress(OSError, ValueError):
            pipe.close()

    def communicate(self, timeout: float) -> None:
        """Wait until the child has exited and its output is at its end; TimeoutExpired otherwise.

        :class:`OutputHeldOpen` when the child exited but, :data:`HELD_OPEN_GRACE` seconds later,
        something it left running (a daemon a wrapper script forked) still holds its output open.
        """
        deadline = time.monotonic() + timeout
        wait_exit(self.proc, max(0.0, deadline - time.monotonic()))
        grace_end = min(deadline, time.monotonic() + HELD_OPEN_GRACE)
        for t in self.threads:
            t.join(max(0.0, grace_end - time.monotonic()))
            if t.is_alive():
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(self.proc.args, timeout)
                raise OutputHeldOpen(self.proc.returncode)

    def close(self) -> None:
        """Stop reading (a grandchild that left the session may hold the pipes open for ever)."""
        for pipe in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    cwd: str | None = None,
    stdin: bytes | None = None,
    cap: int = OUTPUT_CAP,
    label: str | None = None,
    on_start: Callable[[int], None] | None = None,
    prefix: Sequence[str] = (),
    run_as: RunAs | None = None,
    on_stdout: Callable[[bytes], None] | None = None,
) -> Evidence:
    """Run ``argv`` and return its :class:`Evidence`; never raises for a failing program.

    The child runs contained (:func:`zdoctor.proc.contain.popen`: a keeper, a session, a cgroup where the
    node has them), so a timeout ends it and everything it started, and whatever it leaves running
    when it exits is ended too, with exactly ``env`` (default: zdoctor's own environment). A missing or
    non-executable program is reported in ``error`` with ``exit_code`` None; a timeout sets ``error``
    and keeps the output produced so far. ``on_start`` is called with the keeper's pid once it runs
    (the command is its child). ``prefix`` is a tracer the contained command runs under
    (``strace ... --``): the command's exit, not the tracer's wait for its daemons, ends the run. With
    ``run_as`` the command runs as that account and the evidence label says so; without it the runner
    decides (:func:`zdoctor.proc.codeowner.runs_as`: code another account can change never runs as root).
    ``on_stdout`` sees each piece of standard output as it is read, while the command runs.
    """
    argv = [str(a) for a in argv]
    ev = Evidence(label=label or " ".join(argv[:3]), kind="command", argv=argv, started=time.time())
    if run_as is None:
        run_as = codeowner.runs_as(argv, os.environ if env is None else env, cwd)
    if run_as is not None:
        ev.label += f" [as {run_as.describe()}]"
        env = run_as.child_env(os.environ if env is None else env)
    t0 = time.monotonic()
    try:
        child = contain.popen(
            argv,
            env=dict(env) if env is not None else None,
            prefix=prefix,
            run_as=run_as,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
        )
    except OSError as exc:
        return _unstarted(ev, str(prefix[0]) if prefix else argv[0], exc, t0)
    proc = child.proc
    if child.error is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)
        _kill_group(child)
        proc.wait()
        child.finish()
        return _unstarted(ev, argv[0], child.error, t0)
    if on_start is not None:
        on_start(proc.pid)
    pump = _Pump(proc, stdin, cap, on_stdout)
    held_open = False
    try:
        pump.communicate(timeout)
    except OutputHeldOpen:
        # Not a hang: the command finished; a process it started (and did not detach from the output)
        # lives on. What it printed up to here is the command's whole output.
        held_open = True
        _kill_group(child)
        pump.close()
    except subprocess.TimeoutExpired:
        _kill_group(child)
        try:
            pump.communicate(5)
        except subprocess.TimeoutExpired:  # a grandchild left its session and holds the pipes
            pump.close()
            proc.wait()
        ev.error = f"timed out after {timeout:g}s; process group killed"
    finally:
        # A child that exited may have left grandchildren holding the pipes: never leave them behind.
        if proc.returncode is None:
            _kill_group(child)
            proc.wait()
        child.finish()
    pump.close()
    _conclude(ev, proc, t0, pump.out, pump.err, cap)
    if held_open:
        ev.stderr += (f"\n[zdoctor: {argv[0]} exited with code {proc.returncode}, but a process it left running "
                      f"kept its output open; reading stopped {HELD_OPEN_GRACE:g}s after the exit and that "
                      "process group was stopped]")
    return ev


def run_streaming(
    argv: Sequence[str],
    on_line: Callable[[str], None],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    cap: int = OUTPUT_CAP,
    label: str | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Evidence:
    """Like :func:`run`, but ``on_line`` sees each line of standard output as it arrives.

    ``on_line`` runs on a reader thread; an exception in it is not raised here (the line is still kept).
    """
    import threading

    argv = [str(a) for a in argv]
    ev = Evidence(label=label or " ".join(argv[:3]), kind="command", argv=argv, started=time.time())
    run_as = codeowner.runs_as(argv, os.environ if env is None else env)
    if run_as is not None:
        ev.label += f" [as {run_as.describe()}]"
        env = run_as.child_env(os.environ if env is None else env)
    t0 = time.monotonic()
    try:
        child = contain.popen(argv, env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, run_as=run_as)
    except OSError as exc:
        return _unstarted(ev, argv[0], exc, t0)
    proc = child.proc
    if child.error is not None:
        proc.communicate()
        child.finish()
        return _unstarted(ev, argv[0], child.error, t0)
    if on_start is not None:
        on_start(proc.pid)
    chunks = {"out": _HeadTail(cap), "err": _HeadTail(cap)}

    def pump(name: str, pipe: Any) -> None:
        # A line is read at most 64 KiB at a time: output without newlines stays bounded too.
        for raw in iter(lambda: pipe.readline(65536), b""):
            chunks[name].add(raw)
            if name == "out":
                with contextlib.suppress(Exception):
                    on_line(raw.decode("utf-8", "replace").rstrip("\r\n"))

    readers = [threading.Thread(target=pump, args=(n, pipe), daemon=True)
               for n, pipe in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        proc.wait()
        ev.error = f"timed out after {timeout:g}s; process group killed"
    for r in readers:
        r.join(5)
    if any(r.is_alive() for r in readers):  # a grandchild left its session and holds the pipes
        _kill_group(child)
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                with contextlib.suppress(OSError):
                    pipe.close()
    child.finish()
    _conclude(ev, proc, t0, chunks["out"], chunks["err"], cap)
    return ev


def _conclude(ev: Evidence, proc: subprocess.Popen[bytes], t0: float, out: _HeadTail, err: _HeadTail,
              cap: int) -> None:
    """Fill in how a finished run ended: :data:`ENDED` when zdoctor's shutdown ended it, its duration, its
    exit code (None when it did not end by itself) and its output, capped."""
    if ev.error is None and children.was_ended(proc.pid):
        ev.error = ENDED
    ev.duration_s = time.monotonic() - t0
    ev.exit_code = proc.returncode if ev.error is None else None
    ev.stdout, t1 = out.text(cap)
    ev.stderr, t2 = err.text(cap)
    ev.truncated = t1 or t2


def which_all(name: str, path: str | None) -> list[str]:
    """Every executable called ``name`` on ``path``, in search order (like ``which -a``)."""
    found: list[str] = []
    for d in (path or "").split(os.pathsep):
        if not d:
            continue
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK) and cand not in found:
            found.append(cand)
    return found
