"""Files that are not what their place expects, found without opening them: a FIFO, a device or a socket
named like a library on ``LD_LIBRARY_PATH``, an op's ``.so`` in the JIT cache, or a shell start-up file;
a symbolic link that loops; an ``LD_LIBRARY_PATH`` entry that is no directory.

Opening a FIFO blocks until a writer comes (the loader opening a FIFO named ``libstdc++.so.6`` hangs every
C++ program started with that path), a device gives bytes that are no ELF file, and a loop fails every
lookup. Only ``lstat``/``stat`` are used here, so no reader of this module can block on one, and every
listing is bounded.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from collections.abc import Mapping
from typing import Any

from zdoctor.core.shellquote import shell_quote
from zdoctor.layers.libraries.shellinit import SYSTEM_FILES, USER_FILES
from zdoctor.proc.userfile import kind_of
from zdoctor.readers.jitcache import cache_base

#: Entries of one directory looked at, at most.
MAX_ENTRIES = 4000
#: Special files reported, at most.
MAX_FOUND = 50


def what_is(path: str) -> str | None:
    """What ``path`` is when it is no regular file, directory or working link to one (``a FIFO (named
    pipe)``, ``a symbolic link that loops``, ``a character device`` ...); None for a regular file, a
    directory, a link to one, or nothing at all."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link that loops"
        return None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return kind_of(st.st_mode)


def _library_like(name: str) -> bool:
    return name.startswith("lib") and ".so" in name


def _entries(directory: str) -> list[str]:
    """Up to :data:`MAX_ENTRIES` names in ``directory`` (none when it cannot be listed)."""
    out: list[str] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                out.append(entry.name)
                if len(out) >= MAX_ENTRIES:
                    break
    except OSError:
        return []
    return sorted(out)


def scan(env: Mapping[str, str], home: str | None) -> dict[str, Any]:
    """``{"found": [{path, kind, where, what}], "looked": [...], "truncated": bool}``: the special files on the
    training environment's ``LD_LIBRARY_PATH``, in its JIT op cache and among the shell start-up files."""
    found: list[dict[str, str]] = []
    looked: list[str] = []

    def note(path: str, kind: str | None, where: str) -> None:
        if kind and len(found) < MAX_FOUND and all(f["path"] != path for f in found):
            found.append({"path": path, "kind": kind, "where": where})

    for entry in dict.fromkeys(e for e in (env.get("LD_LIBRARY_PATH") or "").split(":") if e):
        looked.append(f"LD_LIBRARY_PATH entry {entry}")
        kind = what_is(entry)
        if kind:
            note(entry, kind, "an LD_LIBRARY_PATH entry")
            continue
        if not os.path.isdir(entry):
            continue
        for name in _entries(entry):
            if _library_like(name):
                note(os.path.join(entry, name), what_is(os.path.join(entry, name)), f"on LD_LIBRARY_PATH ({entry})")
    base, _source = cache_base(env)
    looked.append(f"the JIT op cache {base}")
    for op in _entries(base):
        op_dir = os.path.join(base, op)
        kind = what_is(op_dir)
        if kind:
            note(op_dir, kind, "in the JIT op cache")
            continue
        # an op dir, or a tag dir holding op dirs (py311_cu121/<op>)
        dirs = [op_dir] + [os.path.join(op_dir, n) for n in _entries(op_dir) if os.path.isdir(os.path.join(op_dir, n))]
        for d in dirs[:200]:
            for name in _entries(d):
                if name.endswith(".so") or name == "lock":
                    note(os.path.join(d, name), what_is(os.path.join(d, name)), "in the JIT op cache")
    starts: list[str] = [os.path.join(home, n) for n in USER_FILES] if home else []
    for pattern in SYSTEM_FILES:
        starts += sorted(glob.glob(pattern))[:200] if any(c in pattern for c in "*?[") else [pattern]
    looked.append("the shell start-up files")
    for path in starts:
        note(path, what_is(path), "a shell start-up file")
    return {"found": found, "looked": looked, "truncated": len(found) >= MAX_FOUND}


def effect(item: Mapping[str, Any]) -> str:
    """What such a file does to the training, in words."""
    kind, where = str(item.get("kind")), str(item.get("where"))
    if "loops" in kind:
        return "every lookup through it fails (Too many levels of symbolic links)"
    if "FIFO" in kind:
        if "start-up" in where:
            return "a shell that reads it blocks at start until something writes to it"
        return "whoever opens it (the loader, torch loading the op) blocks until something writes to it: a hang"
    if "entry" in where:
        return "the loader cannot search it for libraries"
    return "the loader reads no ELF file from it: the load fails"


def removal(item: Mapping[str, Any]) -> str:
    """A shell line that removes exactly this special file, only while it is still of its kind."""
    kind, path = str(item.get("kind")), shell_quote(str(item.get("path")))
    test = {"a FIFO (named pipe)": "-p", "a character device": "-c", "a block device": "-b",
            "a socket": "-S"}.get(kind, "-L")
    return f"test {test} {path} && rm -- {path}"

