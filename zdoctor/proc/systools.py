"""The system tools zdoctor runs as root, by absolute path in the system directories, never through PATH
(a ``findmnt`` the caller's or the training user's PATH puts first would run as root)."""

from __future__ import annotations

import os
import stat

#: Where the root-side tools are looked up, in order; nothing on the caller's PATH.
SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def system_tool(name: str) -> str | None:
    """The absolute path of ``name`` in :data:`SYSTEM_DIRS`: a root-owned executable regular file that
    nobody else may write; None when there is none."""
    for d in SYSTEM_DIRS:
        path = os.path.join(d, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022 and st.st_mode & 0o111:
            return path
    return None


def system_tool_or_name(name: str) -> str:
    """:func:`system_tool`, else ``/usr/bin/NAME`` (which then fails to run as "not found", never a PATH lookup)."""
    return system_tool(name) or os.path.join("/usr/bin", name)
