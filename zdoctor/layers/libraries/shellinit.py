"""Where the training's LD_LIBRARY_PATH and LD_PRELOAD come from: the shell startup files that set them.

An entry like ``/opt/conda/lib`` on LD_LIBRARY_PATH rarely comes from the command line; it comes from a
line in a shell profile (``export LD_LIBRARY_PATH=/opt/conda/lib`` in ``~/.bashrc``), a file in
``/etc/profile.d``, ``/etc/environment`` or a conda env's ``activate.d`` script. Removing the entry for one
shell fixes one shell; the line in the file is what brings it back. This module reads those files (never
runs them) and returns every line that sets one of the variables.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.proc.userfile import open_regular

#: Variables whose setting lines are collected.
VARIABLES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
#: Per-user startup files, relative to the home directory (bash, sh, zsh), in the order shells read them.
USER_FILES = (".bash_profile", ".bash_login", ".profile", ".bashrc", ".zshenv", ".zprofile", ".zshrc",
              ".pam_environment")
#: System-wide startup files (globs), as bash/sh/zsh and PAM read them.
SYSTEM_FILES = ("/etc/environment", "/etc/profile", "/etc/profile.d/*.sh", "/etc/bash.bashrc", "/etc/bashrc",
                "/etc/zsh/zshenv", "/etc/zshenv")
#: Files read at most (a home directory full of profiles is not worth more).
MAX_FILES = 200
MAX_BYTES = 1 << 20

_NAMES = "|".join(VARIABLES)
_SETS = re.compile(r"^\s*(?:export\s+|declare\s+-x\s+|setenv\s+)?(?P<var>" + _NAMES + r")\s*[=\s]")
_EXPORT_LIST = re.compile(r"^\s*export\s+.*\b(?P<var>" + _NAMES + r")\b")


def startup_files(home: str | None, prefixes: Iterable[str] = (), root: str = "/") -> list[str]:
    """Every startup file that exists under ``root``, as the node's own paths (``root`` stripped)."""
    wanted: list[str] = []
    if home:
        wanted += [os.path.join(home, name) for name in USER_FILES]
    wanted += list(SYSTEM_FILES)
    for prefix in prefixes:
        wanted.append(os.path.join(prefix, "etc", "conda", "activate.d", "*.sh"))
    out: list[str] = []
    for pattern in wanted:
        full = os.path.join(root, pattern.lstrip("/"))
        for path in sorted(glob.glob(full)) if any(c in pattern for c in "*?[") else [full]:
            if os.path.isfile(path):
                shown = "/" + os.path.relpath(path, root) if root != "/" else path
                if shown not in out:
                    out.append(shown)
    return out[:MAX_FILES]


def setting_lines(text: str) -> list[tuple[int, str, str]]:
    """``(line number, variable, line)`` for each line of a shell file that sets one of :data:`VARIABLES`."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _SETS.match(line) or _EXPORT_LIST.match(line)
        if m:
            out.append((n, m.group("var"), stripped[:400]))
    return out


def scan(home: str | None, prefixes: Iterable[str] = (), root: str = "/") -> dict[str, Any]:
    """The ``shellinit`` facts: the files read and every line in them that sets LD_LIBRARY_PATH/LD_PRELOAD."""
    files = startup_files(home, prefixes, root)
    lines: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    sources: dict[str, dict[str, Any]] = {}
    for shown in files:
        path = os.path.join(root, shown.lstrip("/")) if root != "/" else shown
        try:
            with open_regular(path) as fh:
                data = fh.read(MAX_BYTES + 1)
                st = os.fstat(fh.fileno())
        except OSError as exc:
            errors[shown] = exc.strerror or str(exc)
            continue
        found = setting_lines(data[:MAX_BYTES].decode("utf-8", errors="replace"))
        for n, var, line in found:
            lines.append({"file": shown, "line": n, "variable": var, "text": line})
        if found and len(data) <= MAX_BYTES:
            # the whole file as read, so a fix of its line can be previewed and applied only to these bytes
            sources[shown] = {"sha256": hashlib.sha256(data).hexdigest(), "uid": st.st_uid,
                              "text": data.decode("utf-8", "surrogateescape")}
    return {"home": home, "files": files, "lines": lines, "errors": errors, "sources": sources}


#: How a line that is commented out is marked, so whoever reads the file knows why and by whom.
COMMENT_NOTE = "commented out by zdoctor"


def commented_out(text: str, number: int, why: str) -> str | None:
    """``text`` with its line ``number`` (1-based) commented out, the reason at its end; None when that line
    is no setting line (the file changed) or is already a comment."""
    lines = text.splitlines(keepends=True)
    if not 1 <= number <= len(lines):
        return None
    line = lines[number - 1]
    body = line.rstrip("\r\n")
    if not body.strip() or body.lstrip().startswith("#") or not (_SETS.match(body) or _EXPORT_LIST.match(body)):
        return None
    lines[number - 1] = f"# {body}  # {COMMENT_NOTE}: {why}" + line[len(body):]
    return "".join(lines)


def lines_for_entry(facts: Mapping[str, Any] | None, variable: str, entry: str) -> list[dict[str, Any]]:
    """The recorded lines that set ``variable`` and name ``entry`` (a directory or file), first read first."""
    norm = os.path.normpath(entry)
    out = []
    for x in (facts or {}).get("lines") or []:
        if x.get("variable") != variable:
            continue
        words = re.split(r"[\s:=\"']+", str(x.get("text") or ""))
        if any(w and os.path.normpath(w) == norm for w in words):
            out.append(x)
    return out
