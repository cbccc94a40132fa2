"""What a verdict means, below every renderer and the model: the order of statuses, how findings are
counted and sorted, and the verification states of a remedy (tried: fixed, tried: the tool starts, tried:
did not fix, not tried) with how an older record reads back. No words for a person here beyond the recorded reasons:
:mod:`zdoctor.core.present` puts these into sentences, marks and styles."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from zdoctor.core.symptom import EXPLAINING, UNEXPLAINED_PREFIX

#: A finding: a :class:`~zdoctor.core.model.Finding` or its dict.
F = TypeVar("F")

STATUSES = ("ok", "warn", "fail", "skip", "crash")
#: Order used when sorting findings for display: worst first.
STATUS_RANK = {"crash": 0, "fail": 1, "warn": 2, "skip": 3, "ok": 4}
#: Statuses that make `zdoctor check` exit 1.
FAILING = frozenset({"fail", "crash"})

#: The verification states of a remedy. "fixed" is reserved for the failing command itself succeeding
#: when re-run with the remedy; a trial that only started the tool the command needs (``ninja --version``)
#: is "tool_starts", however cleanly the tool then started.
FIXED = "fixed"
TOOL_STARTS = "tool_starts"
NOT_FIXED = "not_fixed"
NOT_TRIED = "not_tried"
VERIFICATION_STATES = (FIXED, TOOL_STARTS, NOT_FIXED, NOT_TRIED)
#: Why a remedy was not tried when its maker said nothing more precise.
DEFAULT_NOT_TRIED = "zdoctor has no way to try it here"
NOT_TRIED_ROOT = "it needs root and changes the machine"
OLD_RECORD = "this session was recorded without saying whether it was tried"
#: Sentences older sessions put in a remedy's explanation when zdoctor did not try it.
OLD_NOT_TRIED = ("zdoctor cannot try it here", "zdoctor does not try it", "Not verified in advance")
#: How a remedy's own note may already begin; the reason is what follows (the sentence adds the words).
_NOT_TRIED_WORDS = ("not tried, because ", "not tried: ")


def _bare_reason(note: str) -> str:
    """The reason in a not-tried note, without the "not tried" words the note may repeat."""
    for words in _NOT_TRIED_WORDS:
        if note.lower().startswith(words):
            return note[len(words):]
    return note


def count(statuses: Iterable[str]) -> dict[str, int]:
    """Count ``statuses`` per known status, plus a ``total``."""
    counts = {s: 0 for s in STATUSES}
    total = 0
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
        total += 1
    counts["total"] = total
    return counts


def finding_key(status: Any, fid: Any) -> tuple[int, str]:
    """The sort key of a finding: worst status first, then by id."""
    return (STATUS_RANK.get(status, len(STATUS_RANK)), "" if fid is None else str(fid))


def _field(item: Any, name: str) -> Any:
    """A field of a finding or symptom entry, whether it is a record object or its dict."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def answered_symptoms(finding: Any, symptoms: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ids of the ``symptoms`` (ledger entries: ``{id, explained_by}``) that ``finding`` answers: those it
    explains (its ``explains`` while it states a problem, or the entry's ``explained_by`` naming it) and the
    one it stands for when nothing explains it (``symptom.unexplained.<id>``)."""
    fid = str(_field(finding, "id") or "")
    explains = _field(finding, "explains")
    stated = _field(finding, "status") in EXPLAINING and isinstance(explains, (list, tuple))
    said = {str(x) for x in explains} if stated else set()
    out = []
    for entry in symptoms:
        sid = str(entry.get("id") or "")
        by = entry.get("explained_by")
        if sid in said or fid == UNEXPLAINED_PREFIX + sid or (isinstance(by, list) and fid in by):
            out.append(sid)
    return out


def answer_first(findings: Iterable[F], symptoms: Iterable[Mapping[str, Any]] = ()) -> list[F]:
    """The order every report shows findings in: those that answer a symptom the user saw first (in the
    symptoms' order S1, S2 ..., then worst first), then the rest worst first, then by id (with no symptom:
    worst first). ``findings`` are :class:`~zdoctor.core.model.Finding` records or their dicts."""
    entries = [e for e in symptoms if isinstance(e, Mapping)]
    place = {str(e.get("id") or ""): i for i, e in enumerate(entries)}

    def key(f: F) -> tuple[int, int, str]:
        answered = [place[sid] for sid in answered_symptoms(f, entries)]
        return (min(answered, default=len(place)),) + finding_key(_field(f, "status"), _field(f, "id"))

    return sorted(findings, key=key)


def split_answers(findings: Iterable[F], symptoms: Iterable[Mapping[str, Any]] = ()) -> tuple[list[F], list[F]]:
    """``findings`` in :func:`answer_first`'s order, cut in two: those that answer a symptom, and the rest
    (what the report shows under :data:`zdoctor.core.present.ALSO_FOUND`)."""
    entries = [e for e in symptoms if isinstance(e, Mapping)]
    ordered = answer_first(findings, entries)
    answers = [f for f in ordered if answered_symptoms(f, entries)]
    return answers, [f for f in ordered if not answered_symptoms(f, entries)]


@dataclass(frozen=True)
class Verification:
    """Whether a remedy was tried: ``fixed``, ``tool_starts`` (only the tool was started, with what it
    printed), ``not_fixed`` (with what the re-run showed) or ``not_tried`` (with the reason)."""

    state: str
    reason: str = ""

    @property
    def verified(self) -> bool:
        """Tried, and it fixed the failing command."""
        return self.state == FIXED

    def to_dict(self) -> dict[str, str]:
        return {"state": self.state, "reason": self.reason}


def verification_of(remedy: Any) -> Verification:
    """The verification of a :class:`~zdoctor.core.model.Remedy` or of a remedy recorded as a dict.

    A dict from an older session carries only ``verified``: true is ``fixed``; false is ``not_fixed``
    where its explanation says the re-run still failed, else ``not_tried`` (it was the flag of remedies
    zdoctor could not try).
    """
    if isinstance(remedy, Mapping):
        rec = remedy.get("verification")
        if isinstance(rec, Mapping) and rec.get("state") in VERIFICATION_STATES:
            reason = str(rec.get("reason") or "")
            if rec["state"] == NOT_TRIED:
                return Verification(NOT_TRIED, _bare_reason(reason) or DEFAULT_NOT_TRIED)
            return Verification(str(rec["state"]), reason)
        explanation = str(remedy.get("explanation") or "")
        said = explanation[explanation.index("Verified: ") + len("Verified: "):] if "Verified: " in explanation else ""
        if remedy.get("verified") is True:
            return Verification(FIXED, said)
        if said.startswith(("the command still fails", "re-running the command")):
            return Verification(NOT_FIXED, said)
        for marker in OLD_NOT_TRIED:
            if marker in explanation:
                sentence = explanation[explanation.rfind(".", 0, explanation.index(marker)) + 1:].strip()
                sentence = sentence.split(". ")[0]
                return Verification(NOT_TRIED, sentence[:1].lower() + sentence[1:])
        return Verification(NOT_TRIED, OLD_RECORD if remedy.get("verified") is False else DEFAULT_NOT_TRIED)
    if getattr(remedy, "verified", None) is True:
        return Verification(FIXED, getattr(remedy, "note", "") or "")
    if getattr(remedy, "tool_started", False):
        return Verification(TOOL_STARTS, getattr(remedy, "note", "") or "")
    if getattr(remedy, "tried", False):
        return Verification(NOT_FIXED, getattr(remedy, "note", "") or "")
    reason = _bare_reason(getattr(remedy, "note", "") or "")
    if not reason:  # the reason is part of the record (the JSON says what the guide and the exports say)
        reason = NOT_TRIED_ROOT if getattr(remedy, "requires_root", False) else DEFAULT_NOT_TRIED
    return Verification(NOT_TRIED, reason)
