"""Probe ``memlock_paths``: the locked-memory limit on each path a rank is started by: the training shell
(the ``host_limits`` probe's reading), each process of a running job (``--pid``: its ``/proc/PID/limits``),
and each host of the hostfile through ssh (what pdsh and mpirun's daemons get there).

Facts: ``shell`` {soft_kb, hard_kb}, ``ranks`` [{pid, soft_kb, hard_kb, error}], ``ssh`` [{host, soft_kb,
hard_kb, error}], ``ssh_skipped``, ``launcher``, ``container`` (the host_limits probe's container clues),
``limits_d`` (the names in pam_limits' drop-in folder).
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import MemlockPathsFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.launch.probe_launch import SSH_MAX_HOSTS
from zdoctor.layers.nccl_network.memlock import process_memlock, ssh_memlock
from zdoctor.proc.privilege import runs_as_of

#: Processes of a running job whose limits are read at most.
MAX_RANKS = 64


def _show(v: Any) -> str:
    return "?" if v is None else f"{v} KiB" if isinstance(v, int) else str(v)


def collect_memlock(shell: dict[str, Any], pids: list[int], hosts: list[str], *, run_as: Any = None,
                    port: str | None = None, launcher: str | None = None) -> tuple[MemlockPathsFacts, list[Evidence]]:
    facts: MemlockPathsFacts = {"shell": {"soft_kb": shell.get("memlock_soft_kb"),
                                          "hard_kb": shell.get("memlock_hard_kb")},
                                "ranks": [process_memlock(p) for p in pids[:MAX_RANKS]], "ssh": [],
                                "ssh_skipped": None, "launcher": launcher}
    if hosts:
        facts["ssh"] = ssh_memlock(hosts[:SSH_MAX_HOSTS], run_as, port)
    else:
        facts["ssh_skipped"] = "no hostfile: no host is started through ssh"
    rows = [["the training shell", _show(facts["shell"]["soft_kb"]), _show(facts["shell"]["hard_kb"]), "-"]]
    rows += [[f"pid {r['pid']} (running)", _show(r["soft_kb"]), _show(r["hard_kb"]), r["error"] or "-"]
             for r in facts["ranks"]]
    rows += [[f"ssh {r['host']}", _show(r["soft_kb"]), _show(r["hard_kb"]), r["error"] or "-"] for r in facts["ssh"]]
    return facts, [Evidence.of_table("Locked memory (ulimit -l) on each path a rank starts by",
                                     ["path", "soft", "hard", "error"], rows,
                                     [i for i, r in enumerate(rows) if r[1] not in ("unlimited", "?")])]


@probe("memlock_paths", title="Locked memory for RDMA: the shell, running ranks, hosts through ssh", timeout=40,
       needs=("host_limits", "launch", "hostfile"), facts=MemlockPathsFacts)
def memlock_probe(host: Any) -> tuple[MemlockPathsFacts, list[Evidence]]:
    hl = facts_of(host, "host_limits")
    lf = facts_of(host, "launch")
    hf = facts_of(host, "hostfile")
    pids = [p["pid"] for p in lf.get("processes") or [] if isinstance(p.get("pid"), int)]
    hosts = [r["host"] for r in hf.get("resolve") or [] if r.get("addresses")]
    launch = lf.get("launch") or {}
    facts, ev = collect_memlock(hl.get("target") or {}, pids, hosts, run_as=runs_as_of(host),
                                port=(launch.get("options") or {}).get("ssh_port"), launcher=launch.get("launcher"))
    facts["container"] = hl.get("container") or {}
    facts["limits_d"] = hl.get("limits_d")
    return facts, ev
