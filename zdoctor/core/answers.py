"""Which walk answers each symptom the user saw: the walk whose end names a finding that explains it, else
one that met such a finding on its way. ``zdoctor check`` judges its walks as they end; a recorded session
judges the walks it recorded, the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WalkEnd:
    """How one walk ended, as far as answering a symptom goes: its playbook, its diagnosis, the ids of the
    findings stating a problem that it met, and of those among them its end names."""

    playbook: str
    title: str
    diagnosis: str | None
    diagnosis_title: str
    met: tuple[str, ...]
    named: tuple[str, ...]


def answering_walk(entry: Mapping[str, Any], walks: Sequence[WalkEnd]) -> tuple[dict[str, Any] | None, str]:
    """The walk that answers one symptom (a ledger entry: ``explained_by``) with the explaining finding it
    met, or None and why none does: the first walk whose end names a finding that explains the symptom, else
    the first that met one on its way."""
    explaining = [str(x) for x in entry.get("explained_by") or []]
    if not explaining:
        return None, "no finding explains it"
    if not walks:
        return None, "no playbook was walked"
    for named_by_end in (True, False):
        for walk in walks:
            seen = walk.named if named_by_end else walk.met
            found = next((fid for fid in explaining if fid in seen), None)
            if found is not None:
                return {"playbook": walk.playbook, "title": walk.title, "diagnosis": walk.diagnosis,
                        "diagnosis_title": walk.diagnosis_title, "finding": found,
                        "named_by_end": named_by_end}, ""
    return None, "no walk met a finding that explains it"


def with_answers(entries: Iterable[Mapping[str, Any]], walks: Sequence[WalkEnd]) -> list[dict[str, Any]]:
    """The ledger's entries, each with ``answered_by`` (:func:`answering_walk`) and, when that is null,
    ``not_answered`` saying why."""
    out = []
    for e in entries:
        answer, why = answering_walk(e, walks)
        out.append({**e, "answered_by": answer, **({} if answer else {"not_answered": why})})
    return out
