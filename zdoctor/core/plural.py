"""Counted nouns in sentences: "1 row", "2 rows", "1 process", "3 processes", never "(s)" or "(es)"."""

from __future__ import annotations

#: Plurals that do not just add "s".
_IRREGULAR = {"process": "processes", "copy": "copies", "entry": "entries", "switch": "switches"}


def plural(word: str) -> str:
    """The plural of ``word``."""
    head, _, last = word.rpartition(" ")
    if last in _IRREGULAR:
        return f"{head} {_IRREGULAR[last]}".lstrip()
    return word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s")


def noun_for(n: int, word: str, many: str | None = None) -> str:
    """``word`` for one, its plural for any other count (``many`` when the plural is irregular and not listed)."""
    return word if n == 1 else (many or plural(word))


def count_of(n: int, word: str, many: str | None = None) -> str:
    """``n`` followed by ``word`` or its plural (see :func:`noun_for`)."""
    return f"{n} {noun_for(n, word, many)}"
