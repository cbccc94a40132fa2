"""Write a system configuration file under /etc the careful way, and the remedies that do it.

A drop-in is created under a name that does not exist yet, so nothing an admin wrote is replaced and the
undo (removing that one file) gives back exactly what was there. A file that must be edited in place
(/etc/default/grub) is backed up under a name of its own first and replaced in one rename; its undo puts
the backup back. Either way the core refuses a folder that is a symbolic link or that anyone but root may
change (root never writes through a path another user controls), opens nothing through a link, and checks
the new text before anything changes.

``python -m zdoctor.edit.sysfile --path P --text T --check limits.conf`` runs :func:`create_system_file`,
``--path P --edit NAME --arg W --backup B --check NAME`` runs :func:`replace_system_file` (the guide starts
it under sudo); the last line printed, unless the output is a terminal, is ``zdoctor-sysfile-record: {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import zdoctor
from zdoctor.core.errors import InputError
from zdoctor.core.model import Remedy
from zdoctor.core.shellquote import shell_quote
from zdoctor.edit.atomic import create_checked, replace_checked

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


_GRUB_CMDLINE = re.compile(r'^(GRUB_CMDLINE_LINUX=)"([^"\\$`]*)"\s*$', re.M)


def add_kernel_parameters(text: str, words: Sequence[str]) -> str:
    """/etc/default/grub with ``words`` added to ``GRUB_CMDLINE_LINUX`` (those already there kept once);
    ValueError when there is no plain double-quoted ``GRUB_CMDLINE_LINUX=`` line to edit."""
    found = list(_GRUB_CMDLINE.finditer(text))
    if len(found) != 1:
        raise ValueError(f"{len(found)} plain GRUB_CMDLINE_LINUX=\"...\" lines (one is needed to edit it safely)")
    m = found[0]
    have = m.group(2).split()
    new = " ".join(have + [w for w in words if w not in have])
    return f"{text[:m.start()]}{m.group(1)}\"{new}\"{text[m.end():]}"


def check_grub_default(text: str) -> str | None:
    """Why ``text`` is not a /etc/default/grub to install (None when bash reads it and it has its line)."""
    if len(_GRUB_CMDLINE.findall(text)) != 1:
        return "no single plain GRUB_CMDLINE_LINUX line"
    done = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True, timeout=10) \
        if shutil.which("bash") else None
    if done is not None and done.returncode != 0:
        return f"bash -n refuses it: {done.stderr.strip()[:200]}"
    return None


CHECKS: dict[str, Callable[[str], str | None]] = {"limits.conf": check_limits_conf, "grub": check_grub_default}
EDITS: dict[str, Callable[[str, Sequence[str]], str]] = {"kernel-parameters": add_kernel_parameters}


@dataclass
class CreateRecord:
    """What creating a system file did, for the session log."""

    path: str
    ok: bool = False
    backup: str | None = None
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
    """Create ``path`` with ``text`` through :func:`zdoctor.edit.atomic.create_checked`: refused when the folder
    is unsafe, the name exists (a file, a link, anything), or ``check`` (a key of :data:`CHECKS`) finds the
    text wrong. Never raises for a refusal or a failure: the record says what happened."""
    rec = CreateRecord(path=path)

    def step(said: str) -> None:
        rec.steps.append(said)
        if on_step is not None:
            on_step(said)

    rec.error = _folder_problem(os.path.dirname(os.path.abspath(path)))
    if rec.error is None and check is not None:
        said = CHECKS[check](text) if check in CHECKS else f"no check named {check!r}"
        rec.error = f"the new text is refused: {said}" if said else None
        if said is None:
            step(f"checked the text as {check}")
    if rec.error is None:
        try:
            create_checked(path, text.encode("utf-8"), mode)
            step(f"wrote {path} beside its name and linked it into place (no file had that name)")
            rec.ok = True
        except InputError as exc:
            rec.error = str(exc)
    if rec.error is not None:
        step(f"nothing was changed: {rec.error}")
    return rec


def _read_nofollow(path: str) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file, opened without following a link and without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), st
            chunks.append(chunk)
    finally:
        os.close(fd)


def replace_system_file(path: str, edit: str, args: Sequence[str], *, backup: str, check: str | None = None,
                        on_step: Callable[[str], None] | None = None) -> CreateRecord:
    """Edit ``path`` with the edit named ``edit`` (a key of :data:`EDITS`), the careful way: the file is read
    without following a link, the new text checked (``check``), then :func:`zdoctor.edit.atomic.replace_checked`
    (still the bytes read, the old ones kept under ``backup`` or the next free name, never an earlier backup
    overwritten, the new text renamed into place with the file's mode and owner). Nothing changes on a
    refusal; the record says what happened (``backup``: the name the old bytes were kept under)."""
    rec = CreateRecord(path=path)

    def step(said: str) -> None:
        rec.steps.append(said)
        if on_step is not None:
            on_step(said)

    def refuse(said: str) -> CreateRecord:
        rec.error = said
        step(f"nothing was changed: {said}")
        return rec

    folder = os.path.dirname(os.path.abspath(path))
    problem = _folder_problem(folder)
    if problem:
        return refuse(problem)
    try:
        original, _st = _read_nofollow(path)
    except OSError as exc:
        return refuse(f"{path}: cannot read it as a regular file without following links ({exc.strerror or exc})")
    try:
        new_text = EDITS[edit](original.decode("utf-8"), list(args))
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        return refuse(f"{path}: cannot make the edit: {exc}")
    if new_text.encode("utf-8") == original:
        rec.ok = True
        step(f"{path} already says so: nothing to change")
        return rec
    said = CHECKS[check](new_text) if check else None
    if said:
        return refuse(f"the new text is refused: {said}")
    try:
        # Unchanged since it was read, still no link, backed up under a name no file has, one rename.
        rec.backup = replace_checked(path, new_text.encode("utf-8"), expect=original, backup=backup, what="file")
    except InputError as exc:
        return refuse(str(exc))
    step(f"backed up {path} to {rec.backup}")
    step(f"replaced {path} in one rename")
    rec.ok = True
    return rec


def put_back(path: str, rec: CreateRecord, on_step: Callable[[str], None] | None = None) -> None:
    """Undo a :func:`replace_system_file` whose follow-up failed: the backup's bytes back in one rename."""
    try:
        with open(rec.backup or "", "rb") as fh:
            old = fh.read()
        current, _st = _read_nofollow(path)
        replace_checked(path, old, expect=current, backup=None, what="file")
        said = f"put the old {path} back from {rec.backup}"
    except (OSError, InputError) as exc:
        said = f"could not put the old file back ({exc}): copy {rec.backup} over {path} by hand"
    rec.steps.append(said)
    if on_step is not None:
        on_step(said)


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


def kernel_parameters_remedy(words: Sequence[str], *, title: str, explanation: str,
                             grub: str = "/etc/default/grub") -> Remedy:
    """Add kernel parameters to GRUB_CMDLINE_LINUX: the old file backed up under a name of its own, the
    edit checked, renamed into place, then the boot configuration rebuilt; the undo puts the backup back."""
    q = shell_quote(grub)
    backup = f"{grub}.bak.zdoctor-" + "-".join(w.replace("=", "_") for w in words)
    qb = shell_quote(backup)
    staged = shell_quote(os.path.join(os.path.dirname(grub), f".{os.path.basename(grub)}.zdoctor-new"))
    rebuild = "update-grub 2>/dev/null || grub2-mkconfig -o /boot/grub2/grub.cfg"
    wanted = " ".join(words)
    commands = [f"test ! -e {qb} && test ! -L {qb}",
                f"cp -p -- {q} {qb}",
                f"sed 's/^GRUB_CMDLINE_LINUX=\"/GRUB_CMDLINE_LINUX=\"{wanted} /' {q} > {staged}",
                f"grep -q '^GRUB_CMDLINE_LINUX=\"{wanted} ' {staged} && bash -n {staged}",
                f"chmod --reference={q} -- {staged}",
                f"mv -f -- {staged} {q}",
                rebuild,
                "# then reboot"]
    return Remedy(title=title, commands=commands, requires_root=True,
                  undo=[f"cp -p -- {qb} {q}", rebuild],
                  action={"kind": "file-edit", "path": grub, "edit": "kernel-parameters", "args": list(words),
                          "backup": backup, "check": "grub", "then": rebuild},
                  explanation=f"{explanation} The old {grub} is kept as {backup} (a name of its own, never an "
                              "earlier backup overwritten); the new one is checked (bash reads it, the line has the "
                              "parameters) before it is renamed into place.")


def action_argv(action: dict[str, Any]) -> list[str]:
    """The argv that applies a ``file-create`` or ``file-edit`` remedy action with this interpreter and this
    zdoctor."""

    home = os.path.dirname(os.path.dirname(os.path.abspath(zdoctor.__file__)))
    boot = (f"import sys; sys.path.insert(0, {home!r}); from zdoctor.edit.sysfile import main; "
            "sys.exit(main(sys.argv[1:]))")
    argv = [sys.executable, "-I", "-c", boot, "--path", str(action["path"])]
    if action.get("kind") == "file-edit":
        argv += ["--edit", str(action["edit"]), "--backup", str(action["backup"])]
        argv += [f"--arg={a}" for a in action.get("args") or []]
        argv += ["--then", str(action["then"])] if action.get("then") else []
    else:
        argv += ["--text", str(action["text"])]
    return argv + (["--check", str(action["check"])] if action.get("check") else [])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zdoctor-sysfile", description="Write a system file, carefully.")
    parser.add_argument("--path", required=True)
    parser.add_argument("--text")
    parser.add_argument("--edit", choices=sorted(EDITS))
    parser.add_argument("--arg", action="append", default=[])
    parser.add_argument("--backup")
    parser.add_argument("--then", help="a shell line to run once the file is in place (it is put back if it fails)")
    parser.add_argument("--check", choices=sorted(CHECKS))
    args = parser.parse_args(argv)

    def say(s: str) -> None:
        print(s, flush=True)

    if args.edit:
        if not args.backup:
            parser.error("--edit needs --backup")
        rec = replace_system_file(args.path, args.edit, args.arg, backup=args.backup, check=args.check, on_step=say)
        if rec.ok and args.then and rec.backup:
            done = subprocess.run(["bash", "-c", args.then], stdin=subprocess.DEVNULL, timeout=600)
            if done.returncode != 0:
                rec.ok, rec.error = False, f"{args.then!r} failed (exit {done.returncode})"
                say(rec.error)
                put_back(args.path, rec, say)
            else:
                say(f"ran {args.then}")
    elif args.text is not None:
        rec = create_system_file(args.path, args.text, check=args.check, on_step=say)
    else:
        parser.error("give --text (create) or --edit (replace)")
    if not sys.stdout.isatty():  # the record is for a program reading the output, not for a person
        print(RECORD_PREFIX + json.dumps(rec.to_dict()), flush=True)
    return 0 if rec.ok else 1


if __name__ == "__main__":
    sys.exit(main())
