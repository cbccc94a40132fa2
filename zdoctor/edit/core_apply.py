"""Change one file through the safe core, as its own process (the guide runs it, under sudo when needed).

``python -m zdoctor.edit.core_apply --path P --sha256 H --backup B --text-file F --text-sha256 T`` replaces
``P`` with the text in ``F`` (checked to hash to ``T``) when ``P`` still holds the bytes whose SHA-256 is
``H`` (the bytes the preview showed), through :class:`zdoctor.edit.atomic.CheckedReplace`. The text travels in
a file of a private folder, never as arguments: all of argv fits in about 2 MiB, and configs up to 16 MiB
are previewed. As root, in a folder that belongs
to the file's owner, it first becomes that owner (groups dropped): root never writes in a folder the
training user controls. Each step is printed; the last line, unless the output is a terminal, is
``zdoctor-replace-record: {json}``.
Exit 0 when the file was replaced.

``python -m zdoctor.edit.core_apply --remove P [--dir] [--wait-pid N ...]`` waits until the processes ``N``
have exited, then removes ``P`` through :func:`zdoctor.edit.atomic.remove_checked` (no link on the way is
followed), as the owner of its folder in the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import zdoctor
from zdoctor.core.errors import InputError
from zdoctor.edit.atomic import CheckedReplace, remove_checked
from zdoctor.proc import scratch
from zdoctor.proc.leftovers import process_gone

RECORD_PREFIX = "zdoctor-replace-record: "
HELD_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
#: The largest new text the core takes: as much as a config the preview reads.
MAX_TEXT = 16 * 1024 * 1024


@contextlib.contextmanager
def action_argv(action: dict[str, Any]) -> Iterator[list[str]]:
    """The argv that applies a ``file-replace`` remedy action with this interpreter and this zdoctor, while
    the new text waits in a file of a private folder (made here, removed after)."""
    data = str(action["text"]).encode("utf-8", "surrogateescape")
    folder = scratch.private_dir("text-")  # swept by the next run should this one be killed
    try:
        path = os.path.join(folder, "text")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        argv = _boot() + ["--path", str(action["path"]), "--sha256", str(action["sha256"]),
                          "--backup", str(action["backup"]), "--text-file", path,
                          "--text-sha256", hashlib.sha256(data).hexdigest()]
        if isinstance(action.get("uid"), int):
            argv += ["--uid", str(action["uid"])]
        yield argv
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_text(path: str, sha256: str) -> str:
    """The text in ``path``: a regular file (no link followed), at most :data:`MAX_TEXT` bytes, hashing to
    ``sha256``; else an InputError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the new text: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TEXT:
            raise InputError(f"{path}: the new text is not a regular file of at most {MAX_TEXT >> 20} MiB")
        chunks, left = [], MAX_TEXT + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_TEXT or hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"{path}: the new text is not the one shown (its SHA-256 differs); nothing changed")
    return data.decode("utf-8", "surrogateescape")


def remove_action_argv(action: dict[str, Any]) -> list[str]:
    """The argv that applies a ``remove-lock`` remedy action (see the module's text)."""
    argv = _boot() + ["--remove", str(action["path"])] + (["--dir"] if action.get("lock_kind") == "dir" else [])
    for pid in action.get("wait_pids") or []:
        argv += ["--wait-pid", str(int(pid))]
    return argv


def _boot() -> list[str]:

    home = os.path.dirname(os.path.dirname(os.path.abspath(zdoctor.__file__)))
    return [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {home!r}); from zdoctor.edit.core_apply "
            "import main; sys.exit(main(sys.argv[1:]))"]


def remove(path: str, kind: str, wait_pids: Sequence[int], step: Any = print) -> dict[str, Any]:
    """Wait for ``wait_pids`` to exit, then remove ``path`` without following links; the record of it."""
    rec: dict[str, Any] = {"path": path, "ok": False, "as_user": None, "error": None}
    while not all(process_gone(pid) for pid in wait_pids):
        time.sleep(1)
    if wait_pids:
        step("the processes waited for have exited")
    try:
        rec["as_user"] = become_folder_owner(path)
        if rec["as_user"]:
            step(f"removing as {rec['as_user']}")
        step(remove_checked(path, kind))
        rec["ok"] = True
    except (InputError, OSError) as exc:
        rec["error"] = str(exc) if isinstance(exc, InputError) else f"{path}: {exc.strerror or exc}"
    return rec


def become_folder_owner(path: str) -> str | None:
    """As root, when the file and its folder belong to the same other user, become that user (groups
    dropped). Returns who the write runs as, in words (None: as whoever runs this)."""
    if os.geteuid() != 0:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    try:
        dst, fst = os.stat(folder), os.lstat(path)
    except OSError:  # the core says what is wrong with it
        return None
    if dst.st_uid == 0 or dst.st_uid != fst.st_uid:
        return None
    try:
        name = pwd.getpwuid(dst.st_uid).pw_name
    except KeyError:
        name = f"uid {dst.st_uid}"
    os.setgroups([])
    os.setgid(fst.st_gid)
    os.setuid(dst.st_uid)
    return f"{name} (the owner of {folder}; root does not write in another user's folder)"


def replace(path: str, text: str, sha256: str, backup: str | None, step: Any = print,
            uid: int | None = None) -> dict[str, Any]:
    """Replace ``path`` with ``text`` if it still holds the bytes hashed ``sha256`` (and still belongs to
    ``uid`` when given); the record of it."""
    rec: dict[str, Any] = {"path": path, "ok": False, "backup": None, "as_user": None, "error": None}
    # The replace takes milliseconds: a signal waits until it is done or undone (a handler run between
    # two steps would leave the staged file behind), then ends the process.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        rec["as_user"] = become_folder_owner(path)
        if rec["as_user"]:
            step(f"writing as {rec['as_user']}")
        rep = CheckedReplace.stage(path, text.encode("utf-8", "surrogateescape"), expect_uid=uid, what="file")
        try:
            if hashlib.sha256(rep.original).hexdigest() != sha256:
                raise InputError(f"{path}: changed since it was shown (someone edited it); nothing changed - "
                                 "look at it again and re-run")
            step(f"checked {path}: a regular file, unchanged since it was shown")
            step(f"wrote the new text beside it ({rep.staged_path}) and synced it")
            rec["backup"] = rep.commit(backup)
        finally:
            rep.close()  # the staged file goes when anything (a signal too) stopped the replace
        if rec["backup"]:
            step(f"backed up the old file to {rec['backup']}")
        step(f"replaced {path} in one rename")
        rec["ok"] = True
    except (InputError, OSError) as exc:
        rec["error"] = str(exc) if isinstance(exc, InputError) else f"{path}: {exc.strerror or exc}"
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return rec


def _exit_on(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zdoctor-replace", description=__doc__)
    parser.add_argument("--path")
    parser.add_argument("--sha256")
    parser.add_argument("--remove", metavar="PATH")
    parser.add_argument("--dir", action="store_true")
    parser.add_argument("--wait-pid", type=int, action="append", default=[])
    parser.add_argument("--backup", default=None)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--text-file")
    parser.add_argument("--text-sha256")
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # end through the cleanups, not in the middle of them
        signal.signal(sig, _exit_on)
    def step(text: str) -> None:
        print(text, flush=True)

    if args.remove:
        rec = remove(args.remove, "dir" if args.dir else "file", args.wait_pid, step=step)
    elif args.path and args.sha256 and args.text_file and args.text_sha256:
        try:  # read as the caller, before becoming the folder's owner
            text = read_text(args.text_file, args.text_sha256)
        except InputError as exc:
            rec = {"path": args.path, "ok": False, "backup": None, "as_user": None, "error": str(exc)}
        else:
            rec = replace(args.path, text, args.sha256, args.backup, step=step, uid=args.uid)
    else:
        parser.error("give --path, --sha256, --text-file and --text-sha256, or --remove")
    if rec["error"]:
        print(f"error: {rec['error']}", flush=True)
    if not sys.stdout.isatty():  # the record is for a program reading the output, not for a person
        print(RECORD_PREFIX + json.dumps(rec), flush=True)
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
