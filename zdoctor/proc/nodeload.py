"""How busy the node is: the load average against the CPUs this process may use, and how much longer a
late probe is waited for because of it."""

from __future__ import annotations

import os

#: A probe on a node busier than its CPUs is waited for up to this many times its budget: the load decides.
MAX_STRETCH = 4.0


def node_load() -> tuple[float | None, int]:
    """(the one-minute load average, the CPUs this process may use); the load is None where unknown."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        return os.getloadavg()[0], max(1, cpus)
    except OSError:
        return None, max(1, cpus)


def budget_stretch(load: float | None, cpus: int) -> float:
    """How many times its budget a late probe is waited for: the load per CPU, between 1 and MAX_STRETCH."""
    return 1.0 if load is None else min(MAX_STRETCH, max(1.0, load / cpus))


def load_words(load: float | None, cpus: int) -> str:
    """``this node: load 31.2 on 2 CPUs`` (or ``2 CPUs, load unknown``), for a late probe's words."""
    return f"this node: load {load:.1f} on {cpus} CPUs" if load is not None else f"{cpus} CPUs, load unknown"
