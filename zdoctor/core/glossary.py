"""The glossary behind learn mode: short and long explanations of the terms the doctor uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zdoctor.core.errors import InputError
from zdoctor.core.resources import data_dir
from zdoctor.core.tomlfile import load_toml_file


@dataclass(frozen=True)
class Term:
    """One glossary entry: the term, a one-line gist, the full text and related terms."""

    term: str
    short: str
    text: str
    see: tuple[str, ...] = ()


def glossary_path() -> Path:

    return data_dir("assets") / "glossary.toml"


def load_glossary(path: Path | None = None) -> list[Term]:
    """Every entry of the glossary, in file order; a malformed file is an :class:`InputError`."""
    path = path or glossary_path()
    data = load_toml_file(path)
    out: list[Term] = []
    for i, entry in enumerate(data.get("term", []), 1):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("term", "short", "text")):
            raise InputError(f"{path}: term {i}: needs string fields term, short and text")
        see = entry.get("see", [])
        if not isinstance(see, list) or not all(isinstance(s, str) for s in see):
            raise InputError(f"{path}: term {i}: see must be an array of strings")
        out.append(Term(entry["term"].strip(), entry["short"].strip(), entry["text"].strip(), tuple(see)))
    return out


def find_term(terms: list[Term], name: str) -> Term | None:
    """The entry called ``name`` (case-insensitive), if any."""
    low = name.lower()
    return next((t for t in terms if t.term.lower() == low), None)
