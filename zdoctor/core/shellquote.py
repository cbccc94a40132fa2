"""Quote text for one bash line so that it round-trips the real bytes."""

from __future__ import annotations

import os
import shlex


def shell_quote(path: str) -> str:
    """Quote ``path`` for one bash line: ``shlex.quote`` for printable text, else ANSI-C ``$'...'``
    with every byte escaped, so names with newlines, control characters or undecodable bytes stay on one
    line and name exactly that file."""
    if path.isprintable():
        return shlex.quote(path)
    out = []
    for b in os.fsencode(path):
        if b == 0x27:
            out.append("\\'")
        elif b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"
