"""Which findings explain which symptoms: derived from the catalogue, not wired by hand per check.

A symptom is explained by

- a finding that names it (its ``explains``: a check that matched the symptom's concrete fields);
- a problem-stating finding of a check its catalogue entry names as confirming it (``confirm``), unless that
  check matched another symptom of the same kind by its fields and not this one (then it spoke of that one);
- for a message that wraps another (``wraps``: DeepSpeed's op builder around torch's message, a launcher's
  exit line around a rank's error), whatever explains the inner message seen in the same place, and the
  checks that confirm the inner message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from zdoctor.core.registry import CHECKS, load_vocabulary, owner_check
from zdoctor.core.symptom import EXPLAINING, UNEXPLAINED_PREFIX, Symptom
from zdoctor.symptoms.catalogue import ANY_ERROR, Signature, signature


@dataclass(frozen=True)
class Said:
    """What the links need of a finding: its id, status and the symptoms it names."""

    id: str
    status: str
    explains: tuple[str, ...]


def _wrapped(sig: Signature | None) -> list[Signature]:
    return [w for w in (signature(x) for x in (sig.wraps if sig else ()) if x != ANY_ERROR) if w is not None]


def confirming_checks(s: Symptom) -> list[str]:
    """The checks the catalogue names as confirming ``s``: its entry's, and those of the messages it wraps."""
    load_vocabulary()  # a check not yet registered would be silently left out
    sig = signature(s.signature)
    names = [*(sig.confirm if sig else ()), *(c for w in _wrapped(sig) for c in w.confirm)]
    return [n for n in dict.fromkeys(names) if n in CHECKS]


def kinds_of(s: Symptom) -> set[str]:
    """The symptom kinds ``s`` stands for: its own, and those of the messages it wraps."""
    return {s.kind, *(w.kind for w in _wrapped(signature(s.signature)))}


def candidate_checks(s: Symptom) -> list[str]:
    """Every check that can explain ``s``: those that declare its kind, and those that confirm it."""
    load_vocabulary()  # a symptom with no check registered yet would read as one nothing can explain
    kinds = kinds_of(s)
    declared = [name for name, spec in CHECKS.items() if kinds & set(spec.explains)]
    return list(dict.fromkeys([*declared, *confirming_checks(s)]))


def _wraps_any(s: Symptom) -> bool:
    sig = signature(s.signature)
    return bool(sig and ANY_ERROR in sig.wraps)


def _inner(s: Symptom, symptoms: Sequence[Symptom]) -> list[Symptom]:
    """The symptoms seen in the same place that ``s`` wraps."""
    sig = signature(s.signature)
    if sig is None or not sig.wraps:
        return []
    same = [o for o in symptoms if o.id != s.id and o.source == s.source and o.signature != s.signature]
    if ANY_ERROR in sig.wraps:
        return [o for o in same if not _wraps_any(o)]
    return [o for o in same if o.signature in sig.wraps]


def derive(symptoms: Sequence[Symptom], findings: Iterable[Said]) -> dict[str, list[str]]:
    """For each symptom id, the ids of the findings that explain it (sorted; empty: unexplained)."""
    load_vocabulary()
    said = [f for f in findings if f.status in EXPLAINING and not f.id.startswith(UNEXPLAINED_PREFIX)]
    by_id = {s.id: s for s in symptoms}
    owner = {f.id: owner_check(f.id, CHECKS) for f in said}
    # the kinds each check matched by their fields: for those it spoke of the symptoms it named, and no other
    matched: dict[str, set[str]] = {}
    for f in said:
        for sid in f.explains:
            if sid in by_id and owner[f.id]:
                matched.setdefault(owner[f.id] or "", set()).add(by_id[sid].kind)
    out: dict[str, list[str]] = {}
    for s in symptoms:
        kinds, confirm = kinds_of(s), set(confirming_checks(s))
        found = {f.id for f in said if s.id in f.explains}
        for f in said:
            check = owner[f.id]
            if check in confirm and not (matched.get(check or "", set()) & kinds):
                found.add(f.id)
        out[s.id] = sorted(found)
    for s in symptoms:  # a wrapper after the messages it wraps: what explains them explains it
        for inner in _inner(s, symptoms):
            out[s.id] = sorted({*out[s.id], *out.get(inner.id, [])})
    return out

