"""Playbook edge conditions as data: what most predicates only asked.

An edge's ``when`` is either the name of a registered predicate (for what data cannot say) or a table:

- ``when = {finding = "gpu.env.p2p", status = ["warn", "fail"]}``: some finding whose id is that id, or
  starts with it and a dot, has one of those statuses. The finding comes from the check that owns the id
  (the registered check whose name is the id or its longest dotted prefix), evaluated once per probe result.
- ``when = {fact = "nvml.count", equals = 0}`` (or ``in = [...]``, or ``present = true``): a probe's fact,
  named as ``probe.key.key``, compared with a value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from zdoctor.core.jsondoc import value_at
from zdoctor.core.model import STATUSES, Finding
from zdoctor.core.plural import noun_for
from zdoctor.core.registry import CHECKS, owner_check

#: Keys a condition table may use.
FINDING_KEYS = ("finding", "status")
FACT_KEYS = ("fact", "equals", "in", "present")


@dataclass(frozen=True)
class FindingCondition:
    """Some finding ``finding`` (or one under it) has one of ``status``."""

    finding: str
    status: tuple[str, ...]

    def describe(self) -> str:
        return f"finding {self.finding} is {' or '.join(self.status)}"

    def to_dict(self) -> dict[str, Any]:
        return {"finding": self.finding, "status": list(self.status)}

    def matches(self, fid: str) -> bool:
        return fid == self.finding or fid.startswith(self.finding + ".")


_MISSING = object()


@dataclass(frozen=True)
class FactCondition:
    """The fact ``probe.key...`` equals a value, is one of several, or is present at all."""

    fact: str
    equals: Any = _MISSING
    one_of: tuple[Any, ...] | None = None
    present: bool | None = None

    @property
    def probe(self) -> str:
        return self.fact.split(".", 1)[0]

    @property
    def path(self) -> list[str]:
        return self.fact.split(".")[1:]

    def describe(self) -> str:
        if self.one_of is not None:
            return f"fact {self.fact} is one of {', '.join(map(repr, self.one_of))}"
        if self.present is not None:
            return f"fact {self.fact} is {'present' if self.present else 'absent'}"
        return f"fact {self.fact} is {self.equals!r}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fact": self.fact}
        if self.one_of is not None:
            out["in"] = list(self.one_of)
        elif self.present is not None:
            out["present"] = self.present
        else:
            out["equals"] = self.equals
        return out


Condition = Union[FindingCondition, FactCondition]


def parse_condition(raw: Mapping[str, Any]) -> tuple[Condition | None, list[str]]:
    """A condition from its TOML table, and the problems found (a condition is returned only without any)."""
    errors: list[str] = []
    if "finding" in raw:
        extra = sorted(set(raw) - set(FINDING_KEYS))
        if extra:
            errors.append(f"unknown {noun_for(len(extra), 'key')} {', '.join(extra)} in a finding condition "
                          "(use finding, status)")
        fid, status = raw.get("finding"), raw.get("status", ["warn", "fail"])
        if not isinstance(fid, str) or not fid.strip():
            errors.append("'finding' must be a finding id")
        if isinstance(status, str):
            status = [status]
        if not isinstance(status, list) or not status or any(s not in STATUSES for s in status):
            errors.append(f"'status' must be a list of {', '.join(STATUSES)}")
        return (None if errors else FindingCondition(str(fid), tuple(status))), errors
    if "fact" in raw:
        extra = sorted(set(raw) - set(FACT_KEYS))
        if extra:
            errors.append(f"unknown {noun_for(len(extra), 'key')} {', '.join(extra)} in a fact condition "
                          "(use fact, equals, in, present)")
        fact = raw.get("fact")
        if not isinstance(fact, str) or "." not in fact:
            errors.append("'fact' must name a probe and a key, e.g. \"nvml.count\"")
        given = [k for k in ("equals", "in", "present") if k in raw]
        if len(given) != 1:
            errors.append("a fact condition needs exactly one of equals, in, present")
        if "in" in raw and not isinstance(raw["in"], list):
            errors.append("'in' must be a list")
        if "present" in raw and not isinstance(raw["present"], bool):
            errors.append("'present' must be true or false")
        if errors:
            return None, errors
        if "in" in raw:
            return FactCondition(str(fact), one_of=tuple(raw["in"])), []
        if "present" in raw:
            return FactCondition(str(fact), present=bool(raw["present"])), []
        return FactCondition(str(fact), equals=raw["equals"]), []
    return None, ["a condition table needs 'finding' (with 'status') or 'fact'"]


def probes_of(cond: Condition, checks: Mapping[str, Any]) -> list[str]:
    """The probes a condition reads."""
    if isinstance(cond, FactCondition):
        return [cond.probe]
    owner = owner_check(cond.finding, checks)
    return list(checks[owner].probes) if owner else []


def holds(cond: Condition, facts: Any, findings_of: Callable[[str], list[Finding]]) -> bool:
    """Whether ``cond`` holds for ``facts``; ``findings_of(check)`` gives a check's (cached) findings."""

    if isinstance(cond, FindingCondition):
        owner = owner_check(cond.finding, CHECKS)
        if owner is None:
            raise ValueError(f"no registered check produces finding {cond.finding!r}")
        return any(cond.matches(f.id) and f.status in cond.status for f in findings_of(owner))
    record = facts.of(cond.probe)
    value = _MISSING if record is None else value_at(record, cond.path, default=_MISSING)
    if cond.present is not None:
        return (value is not _MISSING and value is not None) == cond.present
    if value is _MISSING:
        return False
    if cond.one_of is not None:
        return value in cond.one_of
    return bool(value == cond.equals)
