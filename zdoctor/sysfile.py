"""Create a system configuration file (a drop-in under /etc) the careful way, and the remedy that does it.

A drop-in is written under a name that does not exist yet, so nothing an admin wrote is replaced and the
undo (removing that one file) gives back exactly what was there. The core refuses a folder that is a
symbolic link or that anyone but root may change (root never writes through a path another user controls),
refuses when a file of that name appeared since the preview, checks the text before anything changes,
writes it beside its final name and links it into place in one step that fails if the name is taken.

``python -m zdoctor.sysfile --path P --text T --check limits.conf`` runs :func:`create_system_file` (the
guide starts it under sudo); the last line it prints is ``zdoctor-sysfile-record: {json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .atomic import fsync_dir, write_beside
from .model import Remedy
from .shellquote import shell_quote

RECORD_PREFIX = "zdoctor-sysfile-record: "
LIMITS_D = "/etc/security/limits.d"
#: The items pam_limits knows (limits.conf(5)).
LIMIT_ITEMS = frozenset({"core", "data", "fsize", "memlock", "nofile", "rss", "stack", "cpu", "nproc", "as",
                         "maxlogins", "maxsyslogins", "nonewprivs", "priority", "locks", "sigpending", "msgqueue",
                         "nice", "rtprio", "chroot"})
_LIMIT_VALUE = re.compile(r"^(?:-?\d+|unlimited|infinity)$")


def check_limits_conf(text: str) -> str | None:
    """Why ``text`` is not a limits.conf(5) file pam_limits reads as meant (None when it is)."""
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if len(words) != 4:
            return f"line {n}: {raw!r} has {len(words)} fields; limits.conf lines have 4 (domain type item value)"
        _domain, kind, item, value = words
        if kind not in ("soft", "hard", "-"):
            return f"line {n}: type {kind!r} is not soft, hard or -"
        if item not in LIMIT_ITEMS:
            return f"line {n}: {item!r} is not a limit pam_limits knows"
        if not _LIMIT_VALUE.match(value):
            return f"line {n}: value {value!r} is not a number, unlimited or infinity"
    return None


CHECKS: dict[str, Callable[[str], str | None]] = {"limits.conf": check_limits_conf}


@dataclass
class CreateRecord:
    """What creating a system file did, for the session log."""

    path: str
    ok: bool = False
    error: str | None = None
    steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _folder_problem(folder: str) -> str | None:
    """Why root must not write into ``folder`` (a link, not a directory, changeable by someone else)."""
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"{folder}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a symbolic link (to {os.path.realpath(folder)}); refusing to write through it"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a directory"
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{folder} may be changed by someone other than root (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}); refusing to write a system file there")
    return None


def create_system_file(path: str, text: str, *, check: str | None = None, mode: int = 0o644,
                       on_step: Callable[[str], None] | None = None) -> CreateRecord:
    """Create ``path`` with ``text``: refused when the folder is unsafe, the name exists (a file, a link,
    anything), or ``check`` (a key of :data:`CHECKS`) finds the text wrong. The text goes to a temp file
    beside the name and is hard-linked to it (which fails if the name was taken meanwhile), so the file
    appears whole or not at all. Never raises for a refusal or a failure: the record says what happened."""
    rec = CreateRecord(path=path)

    def step(said: str) -> None:
        rec.steps.append(said)
        if on_step is not None:
            on_step(said)

    folder = os.path.dirname(os.path.abspath(path))
    rec.error = _folder_problem(folder)
    if rec.error is None and os.path.lexists(path):
        rec.error = f"{path} already exists: refusing to replace it (zdoctor writes only a name that is free)"
    if rec.error is None and check is not None:
        said = CHECKS[check](text) if check in CHECKS else f"no check named {check!r}"
        rec.error = f"the new text is refused: {said}" if said else None
        if said is None:
            step(f"checked the text as {check}")
    if rec.error is not None:
        step(f"nothing was changed: {rec.error}")
        return rec
    tmp: str | None = None
    try:
        tmp = write_beside(path, text.encode("utf-8"), None, mode)
        step(f"wrote the text to {tmp}")
        os.link(tmp, path)  # fails with EEXIST if the name appeared: never replaces
        step(f"linked it into place as {path}")
        fsync_dir(path)
        rec.ok = True
    except OSError as exc:
        rec.error = f"{path}: {exc.strerror or exc}"
        step(f"nothing was changed: {rec.error}")
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return rec


def free_name(folder: str, stem: str, suffix: str, taken: Iterable[str] | None) -> str:
    """``stem + suffix``, or ``stem-2 + suffix`` … : the first name not in ``taken`` (the folder's names
    as recorded on the node)."""
    names = set(taken or ())
    name, n = f"{stem}{suffix}", 1
    while name in names:
        n += 1
        name = f"{stem}-{n}{suffix}"
    return os.path.join(folder, name)


def create_file_remedy(path: str, text: str, *, title: str, explanation: str, check: str | None = None,
                       verified: bool | None = None) -> Remedy:
    """The remedy that creates ``path`` (a name that does not exist yet) holding ``text``.

    The printed lines do what the core does, for a paste: stop if the name is taken, write beside it, link
    it into place (``ln`` fails rather than replace a file that appeared). The undo removes that one file,
    and only while its first line is still the one written (a file someone else put there stays).
    The guide applies it with :func:`create_system_file` (``action``)."""
    q = shell_quote(path)
    staged = shell_quote(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.zdoctor-new"))
    body = text if text.endswith("\n") else text + "\n"
    lines = body.splitlines()
    commands = [f"test ! -e {q} && test ! -L {q}",
                "printf '%s\\n' " + " ".join(shell_quote(line) for line in lines) + f" > {staged}",
                f"chmod 0644 -- {staged}",
                f"ln -- {staged} {q}",
                f"rm -f -- {staged}"]
    return Remedy(title=title, commands=commands, requires_root=True, verified=verified,
                  undo=[f"grep -qxF -- {shell_quote(lines[0])} {q} && rm -f -- {q}"],
                  action={"kind": "file-create", "path": path, "text": body, "check": check},
                  explanation=f"{explanation} zdoctor writes {path}, a name no file had on this node when it was "
                              "checked, so nothing there is replaced, and the undo (removing that one file) leaves "
                              "the folder as it was.")


def action_argv(action: dict[str, Any]) -> list[str]:
    """The argv that applies a ``file-create`` remedy action with this interpreter and this zdoctor."""
    import zdoctor

    home = os.path.dirname(os.path.dirname(os.path.abspath(zdoctor.__file__)))
    boot = (f"import sys; sys.path.insert(0, {home!r}); from zdoctor.sysfile import main; "
            "sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-I", "-c", boot, "--path", str(action["path"]), "--text", str(action["text"])]
    return argv + (["--check", str(action["check"])] if action.get("check") else [])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zdoctor-sysfile", description="Create a system file, carefully.")
    parser.add_argument("--path", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--check", choices=sorted(CHECKS))
    args = parser.parse_args(argv)
    rec = create_system_file(args.path, args.text, check=args.check, on_step=lambda s: print(s, flush=True))
    print(RECORD_PREFIX + json.dumps(rec.to_dict()), flush=True)
    return 0 if rec.ok else 1


if __name__ == "__main__":
    sys.exit(main())
