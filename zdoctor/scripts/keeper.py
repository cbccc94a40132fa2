"""The small keeper that stands between zdoctor and every command it runs (stdlib only, Python 3.8+).

zdoctor runs this file by path, ``python -I -S keeper.py LIFE ENV STATUS CGROUP CREDS SETUP -- ARGV...``
(never imports it: :mod:`zdoctor.proc.shim` says where it is); the keeper

* first takes its ``SETUP``, ``PARENT:SIGNAL:NICE`` (each part may be empty): the signal it gets when the
  zdoctor thread that started it ends (checking that ``PARENT`` is still its parent, else it exits 137), and
  the lower priority it and the command run at. zdoctor starts it without a ``preexec_fn``, which would make
  every start a full copy of zdoctor's memory (``fork``) instead of a ``vfork``;
* joins the cgroup ``CGROUP`` (its ``cgroup.procs``; empty: none) so the command starts inside it;
* makes itself a child subreaper: whatever the command starts, however it detaches (a new process
  group as ninja gives each job, a new session, a double fork), stays its descendant;
* runs the command as ``CREDS`` (``uid:gid``; empty: as itself): it drops every supplementary group,
  then the gid, then the uid in the command's process just before the exec, so the keeper itself stays
  able to end the tree and the training user's code never runs as root;
* reads the command's environment from the pipe ``ENV`` (its own environment is empty, so no loader
  variable meant for the command touches the keeper), starts the command and tells zdoctor on ``STATUS``
  whether it could (``ok`` or ``E<errno>``);
* when the command exits, kills every descendant it left (a daemon, a backgrounded worker) and exits as
  the command did: the command's own exit decides, and nothing it started outlives it;
* on SIGTERM, SIGHUP or SIGINT (zdoctor ending it, or zdoctor's thread gone: its parent-death signal)
  and when ``LIFE`` reaches its end (zdoctor is gone, however it died, its reaper too), it ends the
  whole tree (SIGTERM, then SIGKILL until none is left) before it goes.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

# Started for every command zdoctor runs: only what it needs is imported (typing and contextlib were half its
# start-up).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

#: prctl's PR_SET_CHILD_SUBREAPER.
PR_SET_CHILD_SUBREAPER = 36
#: The signals that end the keeper and the tree under it.
STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


#: prctl's PR_SET_PDEATHSIG.
PR_SET_PDEATHSIG = 1


def take_setup(setup: str) -> None:
    """``PARENT:SIGNAL:NICE`` (see the module's description); a parent already gone ends the keeper."""
    parent, sig, nice = (setup.split(":") + ["", "", ""])[:3]
    if sig:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except Exception:  # noqa: BLE001 - the lifeline still ends the keeper with zdoctor
            pass
        if parent and os.getppid() != int(parent):  # the parent died before the signal was asked for
            os._exit(137)
    if nice:
        try:  # noqa: SIM105 - contextlib stays out of the keeper's start-up
            os.nice(int(nice))
        except OSError:
            pass


def join_cgroup(procs: str, me: int) -> None:
    """Move this process into the cgroup whose ``cgroup.procs`` is ``procs`` (empty: none); best effort."""
    if procs:
        try:
            with open(procs, "w") as fh:
                fh.write(str(me))
        except OSError:
            pass


def become_subreaper() -> None:
    """Stay the ancestor of whatever the command starts, however it detaches (best effort)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:  # noqa: BLE001 - without it the tree walk still finds what stays attached
        pass


def read_to_end(fd: int, size: int) -> bytes:
    """Everything ``fd`` gives until its writers close it (read ``size`` bytes at a time); ``fd`` is closed."""
    data = b""
    while True:
        chunk = os.read(fd, size)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


def read_env(envfd: int) -> dict[str, str]:
    """The command's environment, ``KEY=VALUE`` entries separated by NUL bytes, read from ``envfd`` to its end."""
    data = read_to_end(envfd, 65536)
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def run_command(argv: list[str], env: dict[str, str], creds: str, errw: int, closing: tuple[int, ...]) -> NoReturn:
    """In the forked child: drop to ``creds`` and exec the command; what stops it goes to ``errw`` as an errno."""
    try:
        for fd in closing:
            os.close(fd)
        for s in (*STOPS, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(s, signal.SIG_DFL)
        if creds:
            uid, gid = (int(x) for x in creds.split(":"))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise PermissionError(1, "the credentials did not take")
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        os.write(errw, str(e.errno or 0).encode())
    except BaseException:  # noqa: BLE001 - whatever it was, the command did not start
        os.write(errw, b"0")
    os._exit(127)


def tree(me: int) -> list[int]:
    """Every living descendant of process ``me``, from /proc."""
    kids: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # behind a filtering tracer that is gone: zdoctor ends the tree
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
            fields = data[data.rfind(b")") + 2:].split()
        except OSError:
            continue
        if fields and fields[0] != b"Z":
            kids.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [me]
    while todo:
        for pid in kids.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


class Reaper:
    """Collects every child that ended, and keeps the command's wait status when it comes."""

    def __init__(self, child: int) -> None:
        self.child = child
        self.code: int | None = None

    def reap(self) -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self.code = st


def end(me: int, grace: float, reaper: Reaper) -> None:
    """End the tree under ``me``: SIGTERM and ``grace`` seconds to go (when given), then SIGKILL until none is
    left."""
    if grace:
        for pid in tree(me):
            try:  # noqa: SIM105 - contextlib would cost every keeper's start-up
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and tree(me):
            reaper.reap()
            time.sleep(0.02)
    for _ in range(500):
        left = tree(me)
        if not left:
            break
        for pid in left:
            try:  # noqa: SIM105 - contextlib would cost every keeper's start-up
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reaper.reap()
        time.sleep(0.01)
    reaper.reap()


def die(me: int, signum: int) -> NoReturn:
    """Exit the way the command did: killed by ``signum`` (without a core file)."""
    if signum != signal.SIGKILL:  # SIGKILL's action cannot be set (nor caught)
        signal.signal(signum, signal.SIG_DFL)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except Exception:  # noqa: BLE001 - a core file is only a cost here
        pass
    os.kill(me, signum)
    os._exit(128 + signum)


def main(args: list[str]) -> NoReturn:
    """``args``: LIFE ENV STATUS CGROUP CREDS SETUP -- ARGV... (see the module's description)."""
    take_setup(args[5])
    life, envfd, status = int(args[0]), int(args[1]), int(args[2])
    procs, creds, argv = args[3], args[4], args[7:]
    me = os.getpid()
    join_cgroup(procs, me)
    become_subreaper()
    env = read_env(envfd)
    stop: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stop.append(signum)

    for s in STOPS:
        signal.signal(s, on_signal)
    # Every signal (the command's exit, a stop) writes a byte here, so the wait below wakes at once.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        run_command(argv, env, creds, w, (r, life, status))
    os.close(w)
    err = read_to_end(r, 64)
    try:
        os.write(status, b"E" + err + b"\n" if err else b"ok\n")
        os.close(status)
    except OSError:
        pass
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    reaper = Reaper(child)
    if err:
        reaper.reap()
        sys.exit(127)
    while True:
        if stop:
            end(me, 0.5, reaper)
            die(me, stop[0])
        try:
            ready = select.select([life, wake_r], [], [], 0.5)[0]
        except OSError:
            ready = []
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except OSError:
                pass
        if life in ready:
            try:
                gone = os.read(life, 1) == b""
            except OSError:
                gone = True
            if gone:
                end(me, 0.5, reaper)
                die(me, signal.SIGKILL)
        reaper.reap()
        if reaper.code is not None:
            end(me, 0, reaper)
            st = reaper.code
            if os.WIFSIGNALED(st):
                die(me, os.WTERMSIG(st))
            os._exit(os.WEXITSTATUS(st))


if __name__ == "__main__":
    main(sys.argv[1:])
