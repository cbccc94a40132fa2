"""Start a command contained: under its keeper (:mod:`zdoctor.proc.shim`), in a session and, where the node
allows it, a cgroup of its own (:mod:`zdoctor.proc.cgroup`), registered with :mod:`zdoctor.proc.children` until it
is reaped. What the command starts stays in the keeper's tree; ending the command ends all of it.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.proc import cgroup, children, codeowner, shim

_life: int | None = None  # the read end of the pipe every keeper watches; its write end lives only here
_life_w: int | None = None


def _lifeline() -> int:
    """The read end of zdoctor's lifeline: it reaches its end when zdoctor is gone, however it died."""
    global _life, _life_w
    if _life is None:
        r, w = os.pipe()  # both close on exec: a keeper gets the read end through pass_fds only
        _life, _life_w = r, w
    return _life



class Contained:
    """A command started under its keeper: ``proc`` is the keeper (its pid leads the process group),
    ``cgroup`` the command's own cgroup (None where the node has none), ``error`` why the command
    itself could not be started (the keeper then exits 127)."""

    def __init__(self, proc: Any, group: cgroup.Cgroup | None, error: OSError | None, traced: bool = False,
                 filtered: bool = False) -> None:
        self.proc, self.cgroup, self.error, self.traced = proc, group, error, traced
        #: The tracer filters in the kernel (strace --seccomp-bpf): its tracees' traced calls fail (ENOSYS)
        #: once it is gone, so it must outlive the keeper, which then ends the tree itself.
        self.filtered = filtered

    def kill(self) -> None:
        """End the command's whole tree now: its cgroup at once, then its keeper's group."""
        if self.cgroup is not None:
            self._kill_cgroup()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _kill_cgroup(self) -> None:
        """Kill the cgroup, then reap its members that were handed to zdoctor (the subreaper) because the
        keeper died before them, say a compiler ninja or ``setsid`` put in a group of its own: no ``Popen``
        waits for them, and each would stay a ``<defunct>`` child of zdoctor for as long as it runs."""
        assert self.cgroup is not None
        members = [pid for pid in self.cgroup.members() if pid != self.proc.pid]
        self.cgroup.kill()
        _reap_handed_over(members)

    def stop(self, grace: float = children.GRACE_S) -> None:
        """Ask the keeper to end the tree (SIGTERM first, so a build can clean up), then :meth:`kill`.

        A tracer goes first (SIGKILL, alone): its log then ends inside the calls the command hangs in. Behind
        a filtering tracer the keeper cannot read /proc any more, so zdoctor ends the tree it had (pidfds:
        a recycled pid is never signalled)."""
        held: list[int] = []
        if self.traced and self.proc.poll() is None:
            if self.filtered:
                held = _pidfds(children.descendants(self.proc.pid))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        try:
            self._stop_tree(held, grace)
        finally:
            for fd in held:
                os.close(fd)

    def _stop_tree(self, held: list[int], grace: float) -> None:
        _signal_pidfds(held, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while children.alive(self.proc.pid) and time.monotonic() < deadline:
            if self.proc.poll() is None:
                with contextlib.suppress(Exception):
                    self.proc.wait(0.02)
            else:
                _reap_orphans(self.proc.pid)
                time.sleep(0.02)
        _signal_pidfds(held, signal.SIGKILL)
        self.kill()

    def finish(self) -> None:
        """After the keeper was reaped: kill whatever is still in the cgroup, remove it, forget the group."""
        if self.cgroup is not None:
            if self.cgroup.members():
                self._kill_cgroup()
            self.cgroup.remove()
        if self.traced:
            _reap_orphans(self.proc.pid)
        children.forget(self.proc.pid)


def _pidfds(pids: list[int]) -> list[int]:
    """A pidfd of each of ``pids`` still alive (none where the kernel or Python has no pidfd_open)."""
    opener = getattr(os, "pidfd_open", None)
    out: list[int] = []
    if opener is None:
        return out
    for pid in pids:
        with contextlib.suppress(OSError):
            out.append(opener(pid))
    return out


def _signal_pidfds(fds: list[int], sig: int) -> None:
    send = getattr(signal, "pidfd_send_signal", None)
    if send is None:
        return
    for fd in fds:
        with contextlib.suppress(OSError):
            send(fd, sig)


def _reap_orphans(pgid: int) -> None:
    """Reap the exited processes of group ``pgid`` handed to zdoctor as the subreaper (a keeper whose
    tracer died): no ``Popen`` waits for them, and a zombie would keep the group alive."""
    me = os.getpid()
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return
    for name in names:
        fields = children.stat_fields(int(name))
        if len(fields) > 2 and fields[0] == b"Z" and int(fields[1]) == me and int(fields[2]) == pgid:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(int(name), os.WNOHANG)


def _reap_handed_over(pids: list[int]) -> None:
    """Reap those of ``pids`` that are exited children of zdoctor (members of a command's killed cgroup, never
    a process zdoctor started itself)."""
    me = os.getpid()
    for pid in pids:
        fields = children.stat_fields(pid)
        if len(fields) > 1 and fields[0] == b"Z" and int(fields[1]) == me:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _env_block(env: Mapping[str, str] | None) -> bytes:
    return b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0"
                    for k, v in (os.environ if env is None else env).items() if "=" not in k and k)


def _feed(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    with contextlib.suppress(OSError):
        os.close(fd)


def _read_status(fd: int, timeout: float = 60.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while not data.endswith(b"\n") and time.monotonic() < deadline:
            if not select.select([fd], [], [], children.WAIT_SLICE_S)[0]:
                continue
            chunk = os.read(fd, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return data.strip()


#: How much lower the CPU priority of the commands started in a :func:`background` block is (``nice``).
BACKGROUND_NICE = 10
_priority = threading.local()


@contextlib.contextmanager
def background():
    """In this block (this thread), every command :func:`popen` starts runs at a lower CPU priority: the
    work of a probe that no one waits for yields the CPU to the one everyone waits for (torch's import)."""
    before = getattr(_priority, "nice", 0)
    _priority.nice = BACKGROUND_NICE
    try:
        yield
    finally:
        _priority.nice = before


def _nice() -> int:
    """The lower priority of a :func:`background` block this thread is in (0: none)."""
    return int(getattr(_priority, "nice", 0))


def _preexec(sig: int | None) -> Any:
    """A tracer's set-up before its exec: the parent-death signal (None: none), and the lower priority of
    a :func:`background` block."""
    hook = children.pdeathsig_hook(sig) if sig is not None else None
    nice = _nice()
    if not nice:
        return hook

    def both() -> None:
        if hook is not None:
            hook()
        with contextlib.suppress(OSError):
            os.nice(nice)

    return both


def popen(argv: Sequence[str], *, env: Mapping[str, str] | None = None, prefix: Sequence[str] = (),
          run_as: Any = None, **kwargs: Any) -> Contained:
    """Start ``argv`` under its keeper, in a session and (where allowed) a cgroup of its own; registered.

    ``env`` is the command's environment (default: zdoctor's); the keeper itself gets an empty one.
    ``prefix`` is a program the keeper runs under (a tracer: ``strace ... --``); it gets the command's
    environment without its ``LD_`` variables. ``kwargs`` go to ``subprocess.Popen`` (stdin, stdout,
    stderr, cwd). ``run_as`` (a :class:`zdoctor.proc.runas.RunAs`) is the account the command runs as: the keeper
    drops the command's process to it (groups, gid, uid) just before the exec, and stays zdoctor's.
    OSError when the keeper (or the prefix) cannot start; a command that cannot start gives ``error`` (its
    errno and message) on the result.
    """
    if run_as is None:  # the rule holds for a command started here directly too
        run_as = codeowner.runs_as(argv, os.environ if env is None else env, kwargs.get("cwd"))
        if run_as is not None:
            env = run_as.child_env(os.environ if env is None else env)
    if run_as is not None and argv and "/" not in argv[0]:  # found on the command's PATH before the drop
        found = shutil.which(argv[0], path=(os.environ if env is None else env).get("PATH", os.defpath))
        argv = [found, *argv[1:]] if found else list(argv)
    group = cgroup.create()
    env_r, env_w = os.pipe()
    st_r, st_w = os.pipe()
    life = _lifeline()
    # The keeper stays zdoctor's (root's) to end the tree; the command drops to run_as right before its exec.
    creds = f"{run_as.uid}:{run_as.gid}" if run_as is not None else ""
    outer_env: dict[str, str] = {}
    filtered = "--seccomp-bpf" in prefix
    # A tracer dies with zdoctor (its tracees detach and the keeper, told by LIFE, ends them), except a
    # filtering one: it lives until the keeper has ended the tree and gone.
    death = signal.SIGTERM if not prefix else None if filtered else signal.SIGKILL
    # A keeper started directly sets its own parent-death signal and priority (its SETUP): a ``preexec_fn``
    # would turn each start into a fork that copies zdoctor's memory (15 ms at 300 MB) instead of a vfork.
    # A tracer is not the keeper, so it gets them from the fork as before.
    setup = "" if prefix else f"{os.getpid()}:{int(death) if death is not None else ''}:{_nice() or ''}"
    keeper = [*shim.keeper_command(sys.executable), str(life), str(env_r), str(st_w),
              group.procs if group is not None else "", creds, setup, "--", *argv]
    if prefix:
        base = os.environ if env is None else env
        outer_env = {k: v for k, v in base.items() if not k.startswith("LD_")}
    try:
        proc = subprocess.Popen([*prefix, *keeper], env=outer_env, start_new_session=True, close_fds=True,
                                pass_fds=(life, env_r, st_w),
                                preexec_fn=_preexec(death) if prefix else None,
                                **kwargs)
    except BaseException:
        for fd in (env_r, env_w, st_r, st_w):
            os.close(fd)
        if group is not None:
            group.remove(0)
        raise
    os.close(env_r)
    os.close(st_w)
    children.register(proc.pid, group)
    threading.Thread(target=_feed, args=(env_w, _env_block(env)), daemon=True).start()
    status = _read_status(st_r)
    error = None
    if status.startswith(b"E"):
        code = int(status[1:] or 0)
        error = OSError(code, os.strerror(code) if code else "cannot execute")
    return Contained(proc, group, error, traced=bool(prefix), filtered=filtered)


