"""Reading the kernel's small text files (sysfs attributes, /proc entries): their text, or None when they
cannot be read."""

from __future__ import annotations


def read_small(path: str, limit: int = 4096) -> str | None:
    """The text of ``path``, at most ``limit`` characters (undecodable bytes replaced); None when it cannot be
    read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def read_value(path: str) -> str | None:
    """The value a sysfs attribute holds (its text without surrounding white space); None when it cannot be
    read."""
    text = read_small(path)
    return None if text is None else text.strip()
