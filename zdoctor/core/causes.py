"""The cause classes a finding may name for what the user saw, which of them exclude each other, and the one
classification of an OOM kill that every check speaking of a kill shares.

A finding that names the cause of a symptom declares its class (``Finding.cause``). Two findings explaining
the same symptom may not name classes of one exclusive group: a kill is the job's memory cgroup limit or the
host's RAM, never both; a compile that stops on "No space left on device" is a full directory, not a broken
compiler. :func:`contradictions` finds such pairs in a report.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

HOST_RAM = "host-ram"
CGROUP_LIMIT = "cgroup-limit"
NUMA_LIMIT = "numa-limit"
FULL_DISK = "full-disk"
BROKEN_COMPILER = "broken-compiler"

#: Every cause class, with what it says.
CAUSES: dict[str, str] = {
    HOST_RAM: "the host's memory ran out",
    CGROUP_LIMIT: "the job's memory cgroup limit was reached",
    NUMA_LIMIT: "the memory of the NUMA nodes the job may use (its cpuset or memory policy) ran out",
    FULL_DISK: "a file system the work writes to is full",
    BROKEN_COMPILER: "the compiler itself does not work",
}

#: Groups of cause classes of which one symptom has at most one.
EXCLUSIVE: tuple[frozenset[str], ...] = (
    frozenset({HOST_RAM, CGROUP_LIMIT, NUMA_LIMIT}),
    frozenset({FULL_DISK, BROKEN_COMPILER}),
)

#: What a kill whose constraint is not known is, and the facts that would tell.
UNKNOWN_KILL = "unknown: host RAM or a cgroup limit"
WHAT_WOULD_TELL = ("the kernel's OOM record of the kill (its constraint: CONSTRAINT_MEMCG is the job's memory cgroup "
                   "limit, CONSTRAINT_NONE the host's memory) or the job's cgroup memory.events oom_kill counter")

_BY_CONSTRAINT = {"CONSTRAINT_MEMCG": CGROUP_LIMIT, "CONSTRAINT_NONE": HOST_RAM,
                  "CONSTRAINT_CPUSET": NUMA_LIMIT, "CONSTRAINT_MEMORY_POLICY": NUMA_LIMIT}
_BY_KIND = {"memcg": CGROUP_LIMIT, "global": HOST_RAM, "cpuset": NUMA_LIMIT, "mempolicy": NUMA_LIMIT}


def oom_cause(kill: Mapping[str, Any]) -> str | None:
    """The cause class of one OOM-kill record (``constraint`` as the kernel logs it, or the parser's ``kind``);
    None when neither is known."""
    return _BY_CONSTRAINT.get(str(kill.get("constraint") or "")) or _BY_KIND.get(str(kill.get("kind") or ""))


def kill_cause(kills: Iterable[Mapping[str, Any]], cgroup_oom_kills: Any = None) -> str | None:
    """The one cause class of the job's kill, from its OOM records and the OOM kills its memory cgroup counted
    at its limit. A CONSTRAINT_MEMCG record makes it the cgroup limit; records that agree on another class
    make it theirs; with no record that says (none, or no constraint logged), the cgroup counting kills at its
    limit makes it the cgroup limit; otherwise None (unknown)."""
    classes = {oom_cause(k) for k in kills}
    if CGROUP_LIMIT in classes:
        return CGROUP_LIMIT
    known = classes - {None}
    if len(known) == 1 and None not in classes:
        return known.pop()
    if not known and isinstance(cgroup_oom_kills, int) and cgroup_oom_kills > 0:
        return CGROUP_LIMIT
    return None


def _get(finding: Any, key: str) -> Any:
    return finding.get(key) if isinstance(finding, Mapping) else getattr(finding, key, None)


def contradictions(findings: Iterable[Any]) -> list[str]:
    """One line for each pair of failing or warning findings (objects or their JSON) that explain the same
    symptom with cause classes of one exclusive group."""
    named: dict[str, list[tuple[str, str]]] = {}
    for f in findings:
        cause = _get(f, "cause")
        if not cause or _get(f, "status") not in ("fail", "warn"):
            continue
        for sid in _get(f, "explains") or []:
            named.setdefault(str(sid), []).append((str(_get(f, "id")), str(cause)))
    out = []
    for sid, said in named.items():
        for i, (a, ca) in enumerate(said):
            for b, cb in said[i + 1:]:
                if ca != cb and any({ca, cb} <= group for group in EXCLUSIVE):
                    out.append(f"{sid}: {a} says {ca} ({CAUSES.get(ca, ca)}), {b} says {cb} ({CAUSES.get(cb, cb)})")
    return out
