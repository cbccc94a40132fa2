"""A walk's path in sentences: why an edge was taken and why a walk ended, in the words of each predicate's
own description rather than its name. Above the vocabulary (it reads the predicates' descriptions), so the
report model below it stays free of it."""

from __future__ import annotations

import re
from typing import Any

from zdoctor.core.registry import PREDICATES, load_vocabulary


def edge_sentence(predicate: Any, negate: Any = False, override: Any = False, reason: Any = "") -> str:
    """Why a walk took an edge, as a sentence (the predicate's own description, not its name)."""
    if override:
        return "chosen by the user" + (f" ({reason})" if reason else "")
    if not predicate:
        if isinstance(reason, str) and reason.startswith("answer: "):
            return f"answered: {reason[len('answer: '):]}"
        return "the next step when no other condition holds"
    load_vocabulary()
    spec = PREDICATES.get(str(predicate))
    said = spec.doc if spec is not None else f"the condition {predicate} held"
    said = said.rstrip(".")
    return f"it is not the case that {said}" if negate else said


_PREDICATE_SAID = re.compile(r"predicate (?P<name>[A-Za-z0-9_]+) "
                             r"(?:is (?P<value>true|false)|failed \((?P<error>[^)]*)\); counted as false)")
_REACHED = re.compile(r"^reached (?P<kind>diagnosis|remedy) \S+: ")


def in_words(reason: str) -> str:
    """A walk's recorded reason with every ``predicate NAME is true/false`` (or ``... failed (...)``) put into
    the words of the predicate's description."""
    reason = _REACHED.sub(lambda m: f"reached the {m.group('kind')}: ", reason)
    if "predicate " not in reason:
        return reason
    load_vocabulary()

    def said(m: re.Match) -> str:
        spec = PREDICATES.get(m.group("name"))
        doc = (spec.doc if spec is not None else f"the condition {m.group('name')} held").rstrip(".")
        if m.group("error") is not None:
            return f"could not check whether {doc} ({m.group('error')})"
        return doc if m.group("value") == "true" else f"not: {doc}"

    return _PREDICATE_SAID.sub(said, reason)
