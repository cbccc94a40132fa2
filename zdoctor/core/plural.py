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


def count_of(n: int, word: str, many: str | None = None) -> str:
    """``n`` followed by ``word`` or its plural (``many`` when the plural is irregular and not listed)."""
    return f"{n} {word if n == 1 else (many or plural(word))}"
