"""A walk's path in sentences: why an edge was taken and why a walk ended, in the words of each predicate's
own description rather than its name. Above the vocabulary (it reads the predicates' descriptions), so the
report model below it stays free of it."""

from __future__ import annotations

import re
from typing import Any

from zdoctor.core.registry import PREDICATES, load_vocabulary

#: The descriptions of predicates that edges once named and that are data conditions in the playbooks now: a
#: recorded walk that went through one still reads in its words.
RETIRED_PREDICATES = {
    "devtoolset_on_path": "a devtoolset/gcc-toolset is on PATH or enabled through scl",
    "glibc_too_old": "a library needs a newer glibc (GLIBC_x) than the host has",
    "offload_disk_bound": "The optimizer step dominates the iteration and NVMe swapping (optimizer_swap_in_state + "
                          "optimizer_swap_out_state) takes at least half of it: the offload disk is the bottleneck.",
    "offload_ram_short": "The ds_config's offload choice does not fit in this node's MemAvailable even with "
                         "zero.Init, by DeepSpeed's own estimator (the job gets OOM-killed, -9, or swaps). False when "
                         "unknown.",
    "offload_step_bound": "In the training log's wall_clock_breakdown, the optimizer step is the largest phase of an "
                          "iteration (CPU Adam or NVMe swaps, not forward/backward).",
}


def predicate_words(name: str) -> str:
    """What predicate ``name`` asks, in its own description (a retired one's too), without a final period."""
    load_vocabulary()
    spec = PREDICATES.get(name)
    said = spec.doc if spec is not None else RETIRED_PREDICATES.get(name, f"the condition {name} held")
    return said.rstrip(".")


def edge_sentence(predicate: Any, negate: Any = False, override: Any = False, reason: Any = "") -> str:
    """Why a walk took an edge, as a sentence (the predicate's own description, not its name)."""
    if override:
        return "chosen by the user" + (f" ({reason})" if reason else "")
    if not predicate:
        if isinstance(reason, str) and reason.startswith("answer: "):
            return f"answered: {reason[len('answer: '):]}"
        return "the next step when no other condition holds"
    said = predicate_words(str(predicate))
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

    def said(m: re.Match) -> str:
        doc = predicate_words(m.group("name"))
        if m.group("error") is not None:
            return f"could not check whether {doc} ({m.group('error')})"
        return doc if m.group("value") == "true" else f"not: {doc}"

    return _PREDICATE_SAID.sub(said, reason)
