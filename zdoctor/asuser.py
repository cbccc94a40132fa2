"""Try to create a file in a directory as another user: a forked child that drops root's groups, takes the
user's own groups, gid and uid (in that order), and does nothing but ``open(O_CREAT|O_EXCL|O_NOFOLLOW)``
and ``unlink``. No program runs in the child, so no code of the user's is run as root or at all."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import signal
import time

from . import children

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
