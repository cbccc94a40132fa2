"""Check ``container``: the container the job runs in, and its cgroup's memory and pids limits.

A memory cgroup limit kills a job (the kernel's OOM killer, constraint CONSTRAINT_MEMCG) while the host has
memory free, and ``/proc/meminfo`` inside a container shows the host's memory, not the limit: the limit and
the kills the cgroup counted are read here. A pids limit close to the processes and threads in use makes
DataLoader workers and NCCL's threads fail with "can't start new thread" / EAGAIN. ``/dev/shm`` and
``--ipc=host`` are the ``gpu.limits`` check's.
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.causes import CGROUP_LIMIT
from zdoctor.core.factstypes import ContainerFacts
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.layers.offload.check_hostram import LIMIT_COMMANDS, job_kill_cause
from zdoctor.readers.hostlimits import human
from zdoctor.symptoms.match import ids_for

#: Usage above this share of the memory limit, or of pids.max, is close to it.
NEAR = 0.90
#: Fewer free pids than this is close too (a DataLoader with 8 workers and NCCL's threads per rank).
PIDS_SPARE = 64


def _size(v: Any) -> str:
    return "no limit" if v == "max" else human(v) if isinstance(v, int) else "unknown"


def _count(v: Any) -> str:
    return str(v) if isinstance(v, int) else "not counted"


def _times(v: Any) -> str:
    return count_of(v, "time") if isinstance(v, int) else "not counted"


@check("container", title="The container and the job's cgroup limits", probes=("container",), layer="container",
       findings=("container.runtime", "container.memory", "container.pids"),
       explains=("killed", "oom-kill", "thread-limit"))
def check_container(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of(me.name)
    if not f:
        return [me.not_checked(facts.why_not(me.name), sub="not-checked")]
    ev = facts.evidence(me.name)
    return [_runtime(me, f, ev), _memory(me, facts, f, ev), _pids(me, facts, f, ev)]


def _runtime(me: CheckSpec, f: ContainerFacts, ev: list[Evidence]) -> Finding:
    box = f.get("container") or {}
    signs = [s for s in box.get("signs") or [] if isinstance(s, dict)]
    looked = "; ".join(str(s.get("evidence") or s.get("sign") or "?") for s in signs) or "no sign could be read"
    if box.get("in_container"):
        return Finding(id=me.id("runtime"), status="ok",
                       title=f"The job runs in a container ({box.get('kind') or 'runtime not named'})",
                       detail=f"Signs: {looked}. Inside it, /proc/meminfo shows the host's memory: the job's "
                              "memory is its cgroup's limit (below).", evidence=ev)
    if all(s.get("present") is None for s in signs):  # none could be read (or none recorded)
        return me.not_checked(looked, ev, sub="runtime", part="whether the job runs in a container")
    return Finding(id=me.id("runtime"), status="ok", title="Not in a container",
                   detail=f"No container sign: {looked}.", evidence=ev)


def _memory(me: CheckSpec, facts: Facts, f: ContainerFacts, ev: list[Evidence]) -> Finding:
    fid = me.id("memory")
    whose = f.get("whose") or "the job"
    mem = (f.get("cgroup") or {}).get("memory") or {}
    room = f.get("headroom") or {}
    if mem.get("error") and mem.get("limit") is None:
        return me.not_checked(f"{whose}: {mem['error']}", ev, sub="memory",
                          part="the job's memory cgroup limit")
    limit, usage, kills = mem.get("limit"), mem.get("usage"), mem.get("oom_kill")
    where = f"{mem.get('limit_file')} of {mem.get('limit_cgroup')}" if mem.get("limit_cgroup") else \
        f"{mem.get('limit_file')} at every level up from {mem.get('cgroup')}"
    counters = (f"OOM events {_count(mem.get('oom'))}, OOM kills {_count(kills)} ({mem.get('events_file')}); limit "
                f"reached: {_times(mem.get('failcnt'))}")
    lines = [f"The memory cgroup of {whose}: {mem.get('cgroup')} ({mem.get('version')}, {mem.get('dir')})."]
    if limit == "max":  # what is used now changes from run to run and judges nothing here: the evidence has it
        lines.append(f"Limit: none ({where}); {counters}.")
    else:
        lines.append(f"Limit: {_size(limit)} ({where}); usage {_size(usage)}, peak {_size(mem.get('peak'))} "
                     f"({mem.get('peak_file')}); {counters}.")
        if room.get("text"):
            lines.append(f"The memory the job can take now: {room['text']}.")
    if mem.get("error"):
        lines.append(f"Partly read: {mem['error']}.")
    rem = Remedy(title="Raise the job's memory limit (the cgroup's, set by whatever started the job)",
                 commands=list(LIMIT_COMMANDS),
                 note="not tried: the limit belongs to the scheduler or container that started the job",
                 explanation="The limit is the job's share of the node, not the node's RAM.")
    if isinstance(kills, int) and kills > 0 and job_kill_cause(facts) == CGROUP_LIMIT:
        when = "after the --command run" if f.get("after_command") else "now"
        lines.append(f"Read {when}: the cgroup's OOM-kill counter counts every kill by its limit since the cgroup "
                     "was made. The kernel killed a process because this limit was reached, whatever the host "
                     "had free" + (f" ({_size(room.get('host_available'))} MemAvailable now)."
                                   if room.get("host_available") is not None else "."))
        return Finding(id=fid, status="fail",
                       title=f"The job's memory cgroup limit ({_size(limit)}) killed {count_of(kills, 'process')}: the "
                             "limit ran out, not the host's memory",
                       detail="\n".join(lines), evidence=ev, remedies=[rem], cause=CGROUP_LIMIT,
                       explains=ids_for(facts, "killed", signal="9")
                       + ids_for(facts, "oom-kill", constraint="CONSTRAINT_MEMCG"))
    if isinstance(kills, int) and kills > 0:  # counted, but the job's kill evidence says it was not the limit
        lines.append("These kills were not at this cgroup's limit: "
                     + (f"the kernel's record of the job's kill says {job_kill_cause(facts)}."
                        if job_kill_cause(facts) else "memory.events counts no OOM event at the limit (a v2 "
                                                     "cgroup counts kills by the host's OOM killer too)."))
        return Finding(id=fid, status="warn",
                       title=f"The job's memory cgroup counted {count_of(kills, 'OOM kill')}, not at its "
                             f"{_size(limit)} limit",
                       detail="\n".join(lines), evidence=ev)
    left = room.get("room")
    if isinstance(limit, int) and isinstance(usage, int) and usage >= NEAR * limit \
            and isinstance(left, int) and left < (1 - NEAR) * limit:
        return Finding(id=fid, status="warn",
                       title=f"The job's memory cgroup is nearly full: {_size(usage)} of its {_size(limit)} limit",
                       detail="\n".join(lines + ["The next allocation past the limit is met by the kernel's OOM "
                                                 "killer inside the cgroup (exit -9, 'Killed')."]),
                       evidence=ev, remedies=[rem])
    high = mem.get("high")
    if isinstance(high, int) and isinstance(usage, int) and usage >= NEAR * high:
        return Finding(id=fid, status="warn",
                       title=f"The job's memory is at its cgroup's memory.high ({_size(high)}): the kernel throttles "
                             "and reclaims it",
                       detail="\n".join(lines + ["Above memory.high the job is slowed down (reclaim and throttling), "
                                                 "not killed: a training that crawls."]), evidence=ev)
    if isinstance(limit, int):
        binds = room.get("source") == "cgroup"
        # An ok verdict leaves out what is used now (it changes from run to run; the evidence has it).
        steady = [lines[0], f"Limit: {_size(limit)} ({where}); {counters}."]
        steady.append("The room under it is below the host's MemAvailable now: offload plans are judged against "
                      "it (offload.capacity and offload.host-ram give the figures)." if binds else
                      "The host's MemAvailable is below the room under it now: offload plans are judged against "
                      "MemAvailable.")
        return Finding(id=fid, status="ok",
                       title=f"The job's memory cgroup limit is {_size(limit)}"
                             + (", below the host's free memory: offload plans are judged against it" if binds
                                else ""),
                       detail="\n".join(steady), evidence=ev)
    if limit == "max":
        return Finding(id=fid, status="ok", title="The job's cgroup sets no memory limit",
                       detail="\n".join(lines + ["The host's memory is the job's."]), evidence=ev)
    return me.not_checked(mem.get("error") or "the limit could not be read", ev, sub="memory",
                          part="the job's memory cgroup limit")


def _pids(me: CheckSpec, facts: Facts, f: ContainerFacts, ev: list[Evidence]) -> Finding:
    fid = me.id("pids")
    p = (f.get("cgroup") or {}).get("pids") or {}
    whose = f.get("whose") or "the job"
    if p.get("error") and p.get("max") is None:
        return me.not_checked(f"{whose}: {p['error']}", ev, sub="pids", part="the job's pids limit")
    mx, cur, refused = p.get("max"), p.get("current"), p.get("refused")
    head = (f"pids.max {mx if mx != 'max' else 'max (no limit)'}"
            + (f" (of {p.get('limit_cgroup')})" if p.get("limit_cgroup") else "")
            + f", pids.current {cur if cur is not None else 'unknown'}: every thread counts, not only processes.")
    rem = Remedy(title="Raise the job's pids limit",
                 commands=["# docker: docker run --pids-limit=<n> (or -1); Kubernetes: the kubelet's podPidsLimit",
                           "# systemd unit or scope: TasksMax=<n> (or infinity)"],
                 note="not tried: the limit belongs to the scheduler or container that started the job",
                 explanation="Each DataLoader worker is a process and each of its threads a task; NCCL and "
                             "OpenMP start threads per rank.")
    fewer = Remedy(title="Start fewer threads: fewer DataLoader workers, OMP_NUM_THREADS per rank",
                   commands=["export OMP_NUM_THREADS=4", "# DataLoader(num_workers=...): fewer workers"],
                   undo=["unset OMP_NUM_THREADS"], note="not tried: it changes how the job runs")
    if isinstance(refused, int) and refused > 0:
        return Finding(id=fid, status="fail",
                       title=f"The job's pids limit refused "
                             f"{count_of(refused, 'fork or thread', 'forks or threads')} (pids.events max)",
                       detail=head + " A refused fork or thread fails with EAGAIN: \"can't start new thread\", "
                                     "\"fork: Resource temporarily unavailable\".",
                       evidence=ev, remedies=[rem, fewer], explains=ids_for(facts, "thread-limit"))
    if isinstance(mx, int) and isinstance(cur, int) and (cur >= NEAR * mx or mx - cur < PIDS_SPARE):
        return Finding(id=fid, status="warn",
                       title=f"The job's pids limit is close: {cur} of pids.max {mx} in use",
                       detail=head + " DataLoader workers and NCCL's threads need more: a new one fails with "
                                     "EAGAIN (\"can't start new thread\").",
                       evidence=ev, remedies=[rem, fewer], explains=ids_for(facts, "thread-limit"))
    # An ok verdict leaves out how many are in use now (it changes from run to run; the evidence has it).
    steady = (f"pids.max {mx if mx != 'max' else 'max (no limit)'}"
              + (f" (of {p.get('limit_cgroup')})" if p.get("limit_cgroup") else "")
              + f": more than {PIDS_SPARE} and {1 - NEAR:.0%} of it free now; every thread counts, not only "
                "processes.")
    if mx == "max":
        return Finding(id=fid, status="ok", title="The job's cgroup sets no pids limit",
                       detail="pids.max is max at every level up from the job's cgroup.", evidence=ev)
    if isinstance(mx, int) and isinstance(cur, int):
        return Finding(id=fid, status="ok", title=f"The job's pids limit ({mx}) leaves room", detail=steady,
                       evidence=ev)
    return me.not_checked(p.get("error") or "pids.max could not be read", ev, sub="pids", part="the job's pids limit")


@predicate("cgroup_memory_limit_runs_out", doc="the job's memory cgroup limit, not the host's memory, is what runs "
           "out: the cgroup counted OOM kills or is nearly full, or the offload's need is short of the room under "
           "the limit (the figure the fits used, below the host's MemAvailable)", probes=("container",))
def cgroup_memory_limit_runs_out(facts: Facts) -> bool:
    if any(x.id == "container.memory" and x.status in ("fail", "warn") for x in check_container(facts)):
        return True
    cap = facts.of("capacity") or {}
    if (cap.get("machine") or {}).get("mem_source") == "cgroup" and cap.get("ram_short"):
        return True
    hr = facts.of("hostram") or {}
    return bool(hr.get("mem_source") == "cgroup" and hr.get("estimate_per_node") is not None
                and hr.get("mem_available") is not None
                and hr["estimate_per_node"] + (hr.get("extra_known_per_node") or 0) > hr["mem_available"])
