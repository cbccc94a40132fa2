"""Change one file through the safe core, as its own process (the guide runs it, under sudo when needed).

``python -m zdoctor.core_apply --path P --sha256 H --backup B --text-part T [--text-part T ...]``
replaces ``P`` with the concatenated parts (several arguments, so configs far past the 128 KiB a
single argument may be still fit) when ``P`` still holds the bytes whose SHA-256 is ``H`` (the bytes
the preview showed), through :class:`zdoctor.atomic.CheckedReplace`. As root, in a folder that belongs
to the file's owner, it first becomes that owner (groups dropped): root never writes in a folder the
training user controls. Each step is printed; the last line is ``zdoctor-replace-record: {json}``.
Exit 0 when the file was replaced.

``python -m zdoctor.core_apply --remove P [--dir] [--wait-pid N ...]`` waits until the processes ``N``
have exited, then removes ``P`` through :func:`zdoctor.atomic.remove_checked` (no link on the way is
followed), as the owner of its folder in the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pwd
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from .atomic import CheckedReplace, remove_checked
from .errors import InputError

RECORD_PREFIX = "zdoctor-replace-record: "
#: One argument stays well under the kernel's 128 KiB limit per argument.
PART_CHARS = 32 * 1024
HELD_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}


def text_parts(text: str) -> list[str]:
    """``text`` cut into argument-sized parts (never empty: one empty part for an empty text)."""
    return [text[i:i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]


def action_argv(action: dict[str, Any]) -> list[str]:
    """The argv that applies a ``file-replace`` remedy action with this interpreter and this zdoctor."""
    argv = _boot() + ["--path", str(action["path"]), "--sha256", str(action["sha256"]),
            "--backup", str(action["backup"])]
    if isinstance(action.get("uid"), int):
        argv += ["--uid", str(action["uid"])]
    for part in text_parts(str(action["text"])):
        argv += ["--text-part", part]
    return argv


def remove_action_argv(action: dict[str, Any]) -> list[str]:
    """The argv that applies a ``remove-lock`` remedy action (see the module's text)."""
    argv = _boot() + ["--remove", str(action["path"])] + (["--dir"] if action.get("lock_kind") == "dir" else [])
    for pid in action.get("wait_pids") or []:
        argv += ["--wait-pid", str(int(pid))]
    return argv


def _boot() -> list[str]:
    import zdoctor

    home = os.path.dirname(os.path.dirname(os.path.abspath(zdoctor.__file__)))
    return [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {home!r}); from zdoctor.core_apply "
            "import main; sys.exit(main(sys.argv[1:]))"]


def remove(path: str, kind: str, wait_pids: Sequence[int], step: Any = print) -> dict[str, Any]:
    """Wait for ``wait_pids`` to exit, then remove ``path`` without following links; the record of it."""
    rec: dict[str, Any] = {"path": path, "ok": False, "as_user": None, "error": None}
    while any(_alive(pid) for pid in wait_pids):
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    parser.add_argument("--text-part", action="append", default=[])
    args = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # end through the cleanups, not in the middle of them
        signal.signal(sig, _exit_on)
    def step(text: str) -> None:
        print(text, flush=True)

    if args.remove:
        rec = remove(args.remove, "dir" if args.dir else "file", args.wait_pid, step=step)
    elif args.path and args.sha256:
        rec = replace(args.path, "".join(args.text_part), args.sha256, args.backup, step=step, uid=args.uid)
    else:
        parser.error("give --path and --sha256, or --remove")
    if rec["error"]:
        print(f"error: {rec['error']}", flush=True)
    print(RECORD_PREFIX + json.dumps(rec), flush=True)
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
