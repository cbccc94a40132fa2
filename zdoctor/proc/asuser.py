"""Act on a file as another user: a forked child that drops root's groups, takes the user's own groups, gid
and uid (in that order), and makes only system calls: ``can_create`` tries ``open(O_CREAT|O_EXCL|
O_NOFOLLOW)`` and ``unlink``; ``open_as`` opens a file for reading and hands the descriptor back. No
program runs in the child, so no code of the user's is run as root or at all."""

from __future__ import annotations

import array
import contextlib
import errno
import os
import pwd
import secrets
import signal
import socket
import stat as stat_module
import time

from zdoctor.proc import children

#: How long the child may take before it is killed (it makes four system calls).
CHILD_TIMEOUT_S = 5.0


def identity(name: str) -> dict[str, int | str] | None:
    """``{name, uid, gid}`` of a user on this machine (None when there is none)."""
    try:
        pw = pwd.getpwnam(name)
    except (KeyError, OSError):
        return None
    return {"name": pw.pw_name, "uid": pw.pw_uid, "gid": pw.pw_gid}


def _child(write_fd: int, path: str, groups: list[int], uid: int, gid: int) -> None:
    """Answer ``0`` (created), ``ERRNO`` (the create failed) or ``sERRNO`` (switching users failed)."""
    answer = "0"
    try:
        try:
            os.setpgid(0, 0)
            os.setgroups(groups)  # root's supplementary groups go; the user's own come in
            os.setgid(gid)
            os.setuid(uid)
            switched = os.getuid() == uid and os.geteuid() == uid and os.getgid() == gid
        except OSError as exc:
            answer, switched = f"s{exc.errno or errno.EIO}", False
        if switched:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                os.close(fd)
                os.unlink(path)
            except OSError as exc:
                answer = str(exc.errno or errno.EIO)
        elif answer == "0":
            answer = f"s{errno.EPERM}"
        os.write(write_fd, answer.encode())
    finally:  # the child must never return into the parent's code
        os._exit(0)


def can_create(directory: str, name: str, timeout: float = CHILD_TIMEOUT_S) -> dict[str, object]:
    """Whether ``name`` can create (and remove) a file in ``directory``: ``{ok, error, uid, gid}``.

    Needs root (to switch users); ``ok`` None with ``error`` saying why when the test could not run."""
    who = identity(name)
    if who is None:
        return {"ok": None, "error": f"no user {name!r} on this machine", "uid": None, "gid": None}
    out: dict[str, object] = {"ok": None, "error": None, "uid": who["uid"], "gid": who["gid"], "groups": None}
    if os.geteuid() != 0:
        out["error"] = f"zdoctor is not root, so it cannot test as {name}"
        return out
    try:  # read in the parent: the child makes system calls only (no user database lookups after fork)
        groups = sorted(set(os.getgrouplist(str(who["name"]), int(who["gid"]))))
    except OSError as exc:
        out["error"] = f"the groups of {name} could not be read: {exc.strerror or exc}"
        return out
    out["groups"] = groups
    path = os.path.join(directory, f".zdoctor-access-{os.getpid()}-{secrets.token_hex(6)}")
    rfd, wfd = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(rfd)
        os.close(wfd)
        out["error"] = f"cannot start the test as {name}: {exc.strerror or exc}"
        return out
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(rfd)
        _child(wfd, path, groups, int(who["uid"]), int(who["gid"]))
    os.close(wfd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    children.register(pid)
    try:
        deadline = time.monotonic() + timeout
        while True:
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                out["error"] = f"the test as {name} did not finish in {timeout:g}s"
                return out
            time.sleep(0.01)
        raw = os.read(rfd, 32).decode("ascii", "replace").strip()
    finally:
        os.close(rfd)
        children.forget(pid)
    if raw.startswith("s") and raw[1:].isdigit():
        out["error"] = f"could not switch to {name}: {os.strerror(int(raw[1:]))}"
    elif not raw.isdigit():
        out["error"] = f"the test as {name} gave no answer"
    elif raw == "0":
        out["ok"] = True
    else:
        out["ok"] = False
        out["error"] = os.strerror(int(raw))
    return out


def _open_child(sock_fd: int, path: str, groups: list[int], uid: int, gid: int) -> None:
    """Send back ``path`` opened for reading (a regular file only, never blocking) as ``uid``, or an answer:
    ``sERRNO`` (switching users failed), ``ERRNO`` (the open failed), ``mMODE`` (not a regular file)."""
    try:
        sock = socket.socket(fileno=sock_fd)
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
        except OSError as exc:
            sock.send(f"s{exc.errno or errno.EIO}".encode())
            return
        try:
            st = os.stat(path)
            if not stat_module.S_ISREG(st.st_mode):
                sock.send(f"m{st.st_mode}".encode())
                return
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            sock.send(str(exc.errno or errno.EIO).encode())
            return
        sock.sendmsg([b"0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    finally:  # the child must never return into the parent's code
        os._exit(0)


def open_as(path: str, uid: int, timeout: float = CHILD_TIMEOUT_S) -> int:
    """``path`` opened for reading with the rights of ``uid`` (its own groups; none for an unknown uid), the
    descriptor handed back from a child that made only system calls: a file the user cannot read stays
    unread, whatever link they planted. Raises OSError (``errno`` set; EINVAL with the mode in the message
    for a file that is not regular)."""
    try:
        pw = pwd.getpwuid(uid)
        gid, groups = pw.pw_gid, sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid)))
    except (KeyError, OSError):
        gid, groups = uid, []
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.fork()
    except OSError:
        parent.close()
        child.close()
        raise
    if pid == 0:  # pragma: no cover - runs in the child
        parent.close()
        _open_child(child.detach(), path, groups, uid, gid)
    child.close()
    children.register(pid)
    try:
        parent.settimeout(timeout)
        try:
            msg, anc, _flags, _addr = parent.recvmsg(32, socket.CMSG_SPACE(array.array("i").itemsize))
        except socket.timeout:
            raise OSError(errno.ETIMEDOUT, f"opening it as uid {uid} did not finish in {timeout:g}s") from None
        fds = array.array("i")
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        answer = msg.decode("ascii", "replace")
        if answer == "0" and fds:
            return fds[0]
        for extra in fds:
            os.close(extra)
        if answer.startswith("m") and answer[1:].isdigit():
            raise OSError(errno.EINVAL, f"mode {int(answer[1:]):o}")
        if answer.startswith("s") and answer[1:].isdigit():
            raise OSError(int(answer[1:]), f"could not become uid {uid}: {os.strerror(int(answer[1:]))}")
        code = int(answer) if answer.isdigit() else errno.EIO
        raise OSError(code, os.strerror(code))
    finally:
        parent.close()
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        children.forget(pid)
