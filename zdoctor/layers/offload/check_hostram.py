"""Check ``offload.host-ram``: host memory an offload run needs beyond DeepSpeed's estimate (pinned swap
buffers, parameter-only offload, WSL2's pinned-memory cap), memory that is nearly gone now, and a log
that shows the job was killed. Never "RAM is fine" while either says otherwise."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from zdoctor.core.causes import CGROUP_LIMIT, UNKNOWN_KILL, WHAT_WOULD_TELL, kill_cause, oom_cause
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.layers.offload.planner import gib
from zdoctor.readers.hostlimits import human
from zdoctor.symptoms.match import ids_for


@check("offload.host-ram", title="Host memory beyond the offload estimate", probes=("hostram",),
       explains=("oom-kill", "killed"),
       optional=("dsrelease", "dsconfig", "kernel_log", "livetrace", "container"),
       findings=("offload.host-ram.wsl2",))
def check_hostram(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("hostram"), facts.why_not("hostram"))
    ooms = job_oom_kills(facts, f)
    if not f.get("config") and not f.get("log") and not ooms:
        return [me.not_checked("no ds_config (--ds-config) and no training log (--log) given")]
    ev = facts.evidence("hostram")
    extra, est = f.get("extra_per_node"), f.get("estimate_per_node")
    known_extra = f.get("extra_known_per_node") or 0
    avail, total = f.get("mem_available"), f.get("mem_total")
    lines = [f"{x['what']}: {gib(x.get('per_node'))} per node ({x['formula']})"
             + (f"; unknown without {x['unknown']}" if x.get("unknown") else "") + "." for x in f.get("extra") or []]
    if est is not None:
        lines.append(f"DeepSpeed's estimate for the model states: {gib(est)} per node; with the above: "
                     f"{gib(None if extra is None else est + extra)}.")
    elif f.get("extra"):
        why_est = f.get("estimate_unknown") or "not in the facts"
        lines.append(f"DeepSpeed's estimate for the model states: unknown ({why_est}).")
    if f.get("mem_source") == "cgroup":
        lines.append(f"Memory the job can take now: {gib(avail)}, from {f.get('mem_source_text')}.")
    else:
        lines.append(f"Host memory now: {gib(avail)} available of {gib(total)}"
                     + (f" ({f['mem_source_text']})." if f.get("mem_source_text") else "."))
    rem: list[Remedy] = []
    for x in f.get("extra") or []:
        if "optimizer swap" in x["what"]:
            rem.append(Remedy(title="Shrink the optimizer swap buffers: a smaller sub_group_size (e.g. 1e8) "
                                    "and/or fewer buffers",
                              commands=["# ds_config: zero_optimization.sub_group_size = 1e8; "
                                        "offload_optimizer.buffer_count = 4 or less"],
                              explanation="Each rank pins buffer_count buffers of the largest sub-group; a tenth of "
                                          "the sub-group is a tenth of the pinned memory (more, smaller swaps)."))
        if "parameter swap" in x["what"]:
            rem.append(Remedy(title="Shrink the parameter swap buffers (offload_param.buffer_count x buffer_size)",
                              commands=["# ds_config: zero_optimization.offload_param.buffer_size = 5e7"],
                              explanation="buffer_size must still hold the largest parameter tensor."))
    out: list[Finding] = []
    kills = f.get("killed") or []
    # The whole need is known only when every part is; otherwise only the known parts are a floor.
    needed = None if extra is None or (f.get("extra") and est is None) else (est or 0) + extra
    floor = (est or 0) + known_extra
    unknowns = [x["unknown"] for x in f.get("extra") or [] if x.get("unknown")]
    if f.get("extra") and est is None:
        unknowns.append(f.get("estimate_unknown") or "DeepSpeed's estimate for the model states")
    memcg = [k for k in ooms if k.get("kind") == "memcg"]
    host_wide = [k for k in ooms if k.get("kind") != "memcg"]
    killed = ids_for(facts, "killed", signal="9")
    counted = job_cgroup_oom_kills(facts)
    if memcg:  # a cgroup constraint in the job's kills makes the kill the cgroup's (causes.kill_cause)
        others = [f"Also killed outside the cgroup's limit: {_where(f, x)}: {x['text']}" for x in host_wide[:3]]
        out.append(_memcg_kill(me, f, memcg, lines + others, ev, rem))
        out[-1].explains = ids_for(facts, "oom-kill", constraint="CONSTRAINT_MEMCG") + killed
        out[-1].cause = CGROUP_LIMIT
    elif host_wide and host_wide[0].get("source") != "kernel log":  # the --log's line alone: not a fact here
        k = host_wide[0]
        out.append(me.finding(status="warn",
                           title=f"The training log says the OOM killer killed {k.get('task')} (pid {k.get('pid')}, "
                                 f"{_where(f, k, 'log line ')}): not confirmed on this node (from the message only)",
                           detail="\n".join([f"{_where(f, x)}: {x['text']}" for x in host_wide[:3]]
                                            + ["This node's kernel log holds no record of that kill (an earlier boot, "
                                               "another node, or a line not written by the kernel), so nothing is "
                                               "concluded from it about this node's memory. What the node has now:"]
                                            + lines),
                           evidence=ev, remedies=rem))
    elif host_wide:
        k = host_wide[0]
        cause = oom_cause(k) or kill_cause([k], counted)
        scope = {"global": "host memory ran out (the kernel's OOM killer, constraint "
                           f"{k.get('constraint') or 'not logged'})",
                 "cpuset": "the memory of the NUMA nodes the job's cpuset allows ran out (CONSTRAINT_CPUSET)",
                 "mempolicy": "the memory of the NUMA nodes the job's memory policy allows ran out "
                              "(CONSTRAINT_MEMORY_POLICY)"}.get(k.get("kind") or "") if oom_cause(k) else \
            (f"the job's memory cgroup limit ran out (no constraint logged; the cgroup counted {_kills(counted)} at "
             "its limit)" if cause == CGROUP_LIMIT else f"{UNKNOWN_KILL} ({WHAT_WOULD_TELL} would tell)")
        out.append(me.finding(status="fail", cause=cause,
                              title=f"The kernel's OOM killer killed {k.get('task')} (pid {k.get('pid')}, "
                                    f"{_where(f, k, 'log line ')}): {scope}",
                              detail="\n".join([f"{_where(f, x)}: {x['text']}" for x in host_wide[:3]]
                                               + lines + ["RAM is the bottleneck, whatever the model-state estimate "
                                                          "says; the memory available now is after the kill."]),
                              evidence=ev, remedies=rem,
                              explains=ids_for(facts, "oom-kill", constraint=k.get("constraint")) + killed))
    elif kills and kill_cause([], counted) == CGROUP_LIMIT:
        out.append(me.finding(status="fail", cause=CGROUP_LIMIT,
                           title=f"The training log shows a process killed ({count_of(len(kills), 'line')}, e.g. line "
                                 f"{kills[0][0]}): the job's memory cgroup counted {_kills(counted)} at its "
                                 "limit, not the host's memory (container.memory gives the limit)",
                           detail="\n".join([f"{f.get('log')}:{n}: {t}" for n, t in kills[:3]] + lines),
                           evidence=ev, remedies=[_RAISE_LIMIT] + rem, explains=killed))
    elif kills:
        out.append(me.finding(status="fail",
                           title=f"The training log shows a process killed ({count_of(len(kills), 'line')}, e.g. line "
                                 f"{kills[0][0]}): {UNKNOWN_KILL} (the log does not say who killed it)",
                           detail="\n".join([f"{f.get('log')}:{n}: {t}" for n, t in kills[:3]] + lines
                                            + [_kernel_log_says(facts), f"What would tell: {WHAT_WOULD_TELL}."]),
                           evidence=ev, remedies=rem, explains=killed))
    elif avail is not None and needed and needed > avail:
        out.append(me.finding(status="fail",
                              title=f"Offload needs {gib(needed)} of host memory per node with its pinned buffers; "
                                    f"{gib(avail)} is available{_within(f)}", detail="\n".join(lines), evidence=ev,
                              remedies=_limit_first(f, rem)))
    elif avail is not None and needed is None and floor > avail:
        out.append(me.finding(status="fail",
                              title=f"Offload needs at least {gib(floor)} of host memory per node with its pinned "
                                    f"buffers; {gib(avail)} is available{_within(f)}",
                              detail="\n".join(lines + ["The rest of the need is unknown: " + "; ".join(unknowns)
                                                        + "."]), evidence=ev, remedies=_limit_first(f, rem)))
    elif f.get("exhausted"):
        out.append(me.finding(status="warn",
                              title=(f"The job's cgroup memory is nearly exhausted now: {gib(avail)} left of its "
                                     f"{gib(total)} limit" if f.get("mem_source") == "cgroup" else
                                     f"Host memory is nearly exhausted now: {gib(avail)} available of {gib(total)}"),
                              detail="\n".join(lines + ["Whatever holds it (a running job, page cache pinned by "
                                                        "tmpfs, another user) leaves the offload no room."]),
                              evidence=ev, remedies=rem))
    elif f.get("extra") and (needed is None or avail is None):
        why = "; ".join(unknowns) if needed is None else "MemAvailable could not be read"
        out.append(me.finding(status="skip",
                              title="Host memory beyond the offload estimate: unknown whether it fits "
                                    f"(unknown: {why})",
                              detail="\n".join(lines + [f"Not judged: a figure that depends on {why} is unknown, so "
                                                        "no fit is claimed. Give the missing inputs and run again."]),
                              evidence=ev, remedies=rem))
    elif extra:
        out.append(me.finding(status="ok",
                              title=f"{gib(needed)} per node with the pinned buffers fits in {gib(avail)} available"
                                    f"{_within(f)}",
                              detail="\n".join(lines), evidence=ev))
    if f.get("wsl") and f.get("pinned_blocks"):
        out.append(me.finding(sub="wsl2", status="warn",
                              title="WSL2 caps pinned host memory, and the config pins offload buffers",
                              detail=f"pin_memory is true for {', '.join(f['pinned_blocks'])}. Under WSL2 CUDA's page-"
                                     "locked memory is limited (NVIDIA's CUDA on WSL guide, 'WSL 2 Support "
                                     "Constraints'), so a pinned allocation fails ('CUDA out of memory') long before "
                                     "RAM is full. The size of the cap is not read here.",
                              evidence=ev, remedies=_unpin_remedies(facts, f["pinned_blocks"])))
    if not out and avail is None:
        out.append(me.not_checked("MemAvailable could not be read (/proc/meminfo)", ev))
    if not out:
        out.append(me.finding(status="ok",
                              title="Nothing beyond DeepSpeed's estimate for this config; host memory not exhausted",
                              detail="\n".join(lines), evidence=ev))
    return out


def _memcg_kill(me: CheckSpec, f: Mapping[str, Any], kills: list[dict[str, Any]], lines: list[str],
               ev: list[Evidence],
                rem: list[Remedy]) -> Finding:
    """A kill by the memory cgroup's own limit: the job's limit, not the host's memory, ran out."""
    k = kills[0]
    limit = k.get("limit_kb")
    now = k.get("cgroup_now") or {}
    limit_text = human(limit * 1024) if isinstance(limit, int) else "a limit the log does not show"
    avail = f.get("mem_available_host", f.get("mem_available"))
    total = f.get("mem_total_host", f.get("mem_total"))
    detail = [f"{_where(f, x)}: {x['text']}" for x in kills[:3]]
    detail.append(f"The kernel killed {k.get('task')} (pid {k.get('pid')}) because the memory cgroup "
                  f"{k.get('memcg') or '(path not logged)'} reached its limit ({limit_text}"
                  + (f", usage {human(k['usage_kb'] * 1024)}" if isinstance(k.get("usage_kb"), int) else "")
                  + "): constraint=CONSTRAINT_MEMCG. The host itself did not run out: "
                  f"{gib(avail)} available of {gib(total)} now.")
    if now:
        detail.append(f"That cgroup's limit now: {human(now['bytes']) if now.get('bytes') is not None else 'no limit'} "
                      f"({now['file']}).")
    detail += lines
    limit_rem = Remedy(
        title="Raise the job's memory limit (the cgroup's, set by whatever started the job)",
        commands=list(LIMIT_COMMANDS),
        note="not tried: the limit belongs to the scheduler or container that started the job",
        explanation="The limit is the job's share of the node, not the node's RAM: the same job fits once the "
                    "limit covers what it takes (DeepSpeed's estimate plus the pinned buffers above).")
    return Finding(id=me.name, status="fail",
                   title=f"The job's memory cgroup limit ({limit_text}) was hit and the kernel killed "
                         f"{k.get('task')}; the host had memory left ({gib(avail)} available)",
                   detail="\n".join(detail), evidence=ev, remedies=[limit_rem] + rem)


def job_oom_kills(facts: Facts, f: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The OOM kills of this job: the kernel log's records (the better source: constraint, cgroup and limit
    whole) of a pid the --log's OOM lines or the --command run name, then the --log's records the kernel log
    does not hold (an earlier boot, a log copied from another node). Kills of other processes on the node
    are not the job's, and are left to kernel.oom."""
    logged = list(f.get("oom_kills") or [])
    kl = facts.of("kernel_log")
    if not kl:
        return logged
    by_pid = {k.get("pid"): k for k in logged}
    run_pids = set((facts.of("livetrace") or {}).get("pids") or [])
    out: list[dict[str, Any]] = []
    for k in kl.get("ooms") or []:
        pid = k.get("pid")
        if pid in by_pid or pid in run_pids:
            from_log = by_pid.pop(pid, None) or {}
            out.append({**from_log, **{key: v for key, v in k.items() if v is not None}, "source": "kernel log",
                        "cgroup_now": from_log.get("cgroup_now")})
    return out + [k for k in logged if k.get("pid") in by_pid]


def job_cgroup_oom_kills(facts: Facts) -> int | None:
    """The OOM kills the job's memory cgroup counted at its own limit (memory.events oom_kill, v1's
    oom_control), None when not read. A v2 cgroup also counts kills by the host's OOM killer there, so a count
    with no OOM event at the limit (memory.events oom 0) is not the limit's."""
    mem = ((facts.of("container") or {}).get("cgroup") or {}).get("memory") or {}
    kills, events = mem.get("oom_kill"), mem.get("oom")
    if not isinstance(kills, int):
        return None
    return kills if not isinstance(events, int) or events > 0 else 0


def job_kill_cause(facts: Facts) -> str | None:
    """The one cause class of the job's kill (:func:`zdoctor.core.causes.kill_cause`) from every fact that speaks of
    it: the OOM records of the job and its memory cgroup's counters."""
    return kill_cause(job_oom_kills(facts, facts.of("hostram") or {}), job_cgroup_oom_kills(facts))


def _kills(n: int | None) -> str:
    """How many OOM kills a cgroup counted, in words."""
    return count_of(n, "OOM kill") if isinstance(n, int) else "an unknown number of OOM kills"


def _where(f: Mapping[str, Any], k: dict[str, Any], line_word: str = "") -> str:
    """Where a kill's record is: the kernel log (with its time), or the --log's line (``line_word`` + its
    number when given, else ``LOG:N``)."""
    if k.get("source") == "kernel log":
        t = k.get("time")
        return "kernel log" + (time.strftime(" %Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else "")
    return f"{line_word}{k.get('line')}" if line_word else f"{f.get('log')}:{k.get('line')}"


def _kernel_log_says(facts: Facts) -> str:
    """What the kernel log says of a kill the training log shows without an OOM record."""
    kl = facts.of("kernel_log")
    first = ("A SIGKILL (-9, 'Killed') of a training process is the kernel's OOM killer far more often than "
             "anything else, but the log has no OOM record. ")
    if kl is None:
        return (first + f"The kernel log was not read ({facts.why_not('kernel_log')}): "
                "`dmesg -T | grep -iE 'out of memory|oom-kill'` on the node says "
                "whether it was the whole host (constraint=CONSTRAINT_NONE) or the job's memory cgroup "
                "(CONSTRAINT_MEMCG, 'Memory cgroup out of memory'), whose limit is not the host's memory.")
    since = (kl.get("window") or {}).get("since")
    since_text = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if since is not None else "an unknown time"
    others = kl.get("ooms") or []
    if not others:
        return (first + f"The kernel log ({kl.get('path')}, since {since_text}) has no OOM-kill record: the kill "
                "was not the kernel's OOM killer in that window (a scheduler or a person sent SIGKILL, or it happened "
                "before the window, in an earlier boot).")
    last = others[-1]
    return (first + f"The kernel log ({kl.get('path')}, since {since_text}) has {count_of(len(others), 'OOM kill')}, "
            "the last of "
            f"{last.get('task')} (pid {last.get('pid')}, {last.get('constraint') or 'constraint not logged'}, cgroup "
            f"{last.get('task_memcg') or last.get('memcg') or 'not logged'}); none names a pid of this job, so "
            "whether one of them was this job's kill is not known (kernel.oom lists them).")


def _within(f: Mapping[str, Any]) -> str:
    """`` under the job's cgroup limit of 8.00 GiB`` when that limit, not the host, gave the figure."""
    return f" under the job's cgroup limit of {gib(f.get('mem_total'))}" if f.get("mem_source") == "cgroup" else ""


def _limit_first(f: Mapping[str, Any], rem: list[Remedy]) -> list[Remedy]:
    """The remedies, led by raising the job's memory limit when that limit is what the need does not fit."""
    if f.get("mem_source") != "cgroup":
        return rem
    return [Remedy(title="Raise the job's memory limit (the cgroup's, set by whatever started the job)",
                   commands=list(LIMIT_COMMANDS), note="not tried: the limit belongs to the scheduler or container "
                   "that started the job",
                   explanation=f"The figure judged is {f.get('mem_source_text')}: the host has more.")] + rem


#: Where a job's memory limit is set, by what started it.
LIMIT_COMMANDS = ("# Slurm: sbatch/srun --mem=0 (all of the node's memory) or a larger --mem / --mem-per-gpu",
                  "# docker: docker run --memory=<size> (or no --memory); Kubernetes: resources.limits.memory",
                  "# systemd unit or scope: MemoryMax=<size> (v1: MemoryLimit=)")


_RAISE_LIMIT = Remedy(title="Raise the job's memory limit (the cgroup's, set by whatever started the job)",
                     commands=list(LIMIT_COMMANDS),
                     note="not tried: the limit belongs to the scheduler or container that started the job",
                     explanation="The limit is the job's share of the node, not the node's RAM.")


def _unpin_remedies(facts: Facts, blocks: list[str]) -> list[Remedy]:
    """Turn pinning off for the offload blocks, unless the installed DeepSpeed release ignores pin_memory at
    the config's ZeRO stage (it pins whatever the setting says): then the release's rule is the remedy."""
    stage = (facts.of("dsconfig") or {}).get("stage")
    release = facts.of("dsrelease") or {}
    rule = ((release.get("rules") or {}).get("zero12-pin-memory") or {}).get("state")
    if stage in (1, 2) and rule == "old":
        version = release.get("version") or "the installed release"
        return [Remedy(title=f"Upgrade DeepSpeed: {version} pins the offload buffers at ZeRO stage {stage} whatever "
                             "pin_memory says", commands=["python -m pip install --upgrade deepspeed"],
                       note="not tried: it replaces an installed package",
                       explanation="Setting pin_memory = false would change nothing on this release (read from its "
                                   "own ZeRO 1/2 code), so it is not offered; a release that reads pin_memory, or "
                                   "ZeRO stage 3, lets the config turn pinning off.")]
    return [Remedy(title="Turn pinning off for the offload blocks (slower copies, no cap)",
                   commands=[f"# ds_config: zero_optimization.{b}.pin_memory = false" for b in blocks])]


@predicate("offload_host_ram_exhausted", doc="host memory is (nearly) gone, the log shows a kill, pinned "
           "buffers push the need past what is available, or WSL2 caps the pinned memory the config asks for",
           probes=("hostram",))
def offload_host_ram_exhausted(facts: Facts) -> bool:
    return any(x.id in ("offload.host-ram", "offload.host-ram.wsl2") and x.status in ("fail", "warn")
               for x in check_hostram(facts))
