"""Probe ``container``: whether the job runs in a container, and the limits of the job's cgroup.

The job's cgroup is the one of ``--pid`` when given, else zdoctor's own: the ``--command`` run starts in it
(zdoctor's own groups for its children sit below it, so its limits and counters hold them too), and inside
a container it is the container's. With ``--command`` the cgroup is read after the run, so its OOM-kill and
refused-fork counters include what the run met.

Facts:

- ``container``: {in_container, kind, clues, signs: [{sign, present (bool | None: unreadable), evidence}]}.
- ``whose``: which process the cgroup is of, in words; ``pid`` (an int, or ``"self"``);
  ``after_command`` (the counters were read after the --command run).
- ``cgroup``: :func:`zdoctor.readers.cgroups.read_process`: {pid, paths, error, memory: {version, cgroup,
  dir, levels [{cgroup, dir, limit, high, usage, inactive_file, room}], limit (bytes | "max" | None),
  limit_cgroup, limit_file, room, high, usage, peak, peak_file, oom, oom_kill, failcnt, under_oom,
  events_file, error}, pids: {version, cgroup, dir, levels, max, current, limit_cgroup, refused, error}}.
- ``headroom``: :func:`zdoctor.readers.cgroups.headroom` against /proc/meminfo's MemAvailable: {bytes,
  source (cgroup | meminfo), text, host_available, limit, limit_cgroup, limit_file, room}.
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import ContainerFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.libraries.probe_libs import LIVE_TIMEOUT
from zdoctor.layers.offload.planner import read_meminfo
from zdoctor.proc.target import target_of
from zdoctor.readers import cgroups
from zdoctor.readers import containerdetect as detect
from zdoctor.readers.hostlimits import human


def _size(v: Any) -> str:
    return "no limit" if v == "max" else human(v) if isinstance(v, int) else "unknown"


@probe("container", title="The container and the job's cgroup limits (memory, pids)", timeout=LIVE_TIMEOUT + 60,
       needs=("livetrace",), facts=ContainerFacts)
def container_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Read the container's signs and the job's cgroup memory and pids limits, usage and counters."""
    target = target_of(host)
    pid = target.options.get("pid")
    after = bool(target.command)
    if after:
        facts_of(host, "livetrace")  # the run first: its OOM kill must be in the counters read below
    if pid:
        whose = f"the --pid {pid} process"
    else:
        pid = "self"
        whose = ("zdoctor's own process, whose cgroup the --command run started in" if after
                 else "zdoctor's own process (inside a container: the container's cgroup)")
    found = cgroups.read_process(pid)
    room = cgroups.headroom(read_meminfo().get("MemAvailable"), found)
    box = detect.detect(target.env, pid=pid)
    facts = {"container": box, "whose": whose, "pid": pid, "after_command": after, "cgroup": found,
             "headroom": room}
    mem, pids = found.get("memory") or {}, found.get("pids") or {}
    rows = [[s["sign"], {True: "yes", False: "no", None: "unreadable"}[s["present"]], s["evidence"]]
            for s in box["signs"]]
    ev = [Evidence.of_table("container signs", ["sign", "present", "evidence"], rows,
                            [i for i, s in enumerate(box["signs"]) if s["present"]])]
    if mem.get("levels"):
        ev.append(Evidence.of_table(f"memory cgroup of {whose} ({mem.get('version')}), up the hierarchy",
                                    ["cgroup", mem.get("limit_file") or "limit", "usage", "inactive file",
                                     "room"],
                                    [[lv["cgroup"], _size(lv["limit"]), _size(lv["usage"]),
                                      _size(lv["inactive_file"]), _size(lv["room"])] for lv in mem["levels"]]))
    mem_rows = [["limit (tightest)", f"{_size(mem.get('limit'))} ({mem.get('limit_cgroup') or '-'})"],
                ["usage", _size(mem.get("usage"))], [mem.get("peak_file") or "peak", _size(mem.get("peak"))],
                ["oom / oom_kill", f"{mem.get('oom')} / {mem.get('oom_kill')} ({mem.get('events_file')})"],
                ["failcnt (limit reached)", str(mem.get("failcnt"))],
                ["pids.max / pids.current", f"{pids.get('max')} / {pids.get('current')}"],
                ["forks refused (pids.events max)", str(pids.get("refused"))],
                ["memory the job can take", room["text"] or "unknown"]]
    if mem.get("error") or pids.get("error"):
        mem_rows.append(["not read", "; ".join(x for x in (mem.get("error"), pids.get("error")) if x)])
    ev.append(Evidence.of_table(f"cgroup limits of {whose}", ["what", "value"], mem_rows))
    return facts, ev
