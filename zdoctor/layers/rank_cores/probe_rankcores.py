"""Probe ``rankcores``: the CPUs the ranks of this node may run on, against the threads they start.

Facts: ``numa`` (:func:`zdoctor.layers.rank_cores.cores.numa_nodes`), ``cpus`` (the CPUs the launch inherits: zdoctor's
own allowed CPUs, or the running job's launcher's), ``ranks`` (a running job's ranks: each one's
Cpus_allowed_list and thread count; [] without a --pid), ``ranks_per_node`` and where that was learned,
``omp_num_threads`` (the launch's OMP_NUM_THREADS: the environment's, or what the launcher sets), ``binding``
(--bind_cores_to_rank, numactl/taskset in front of the program, mpirun/srun binding options) and
``numactl`` (whether numactl is installed and runs: --bind_cores_to_rank needs it).
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.factstypes import RankcoresFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.rank_cores import cores
from zdoctor.proc.runner import run
from zdoctor.proc.systools import system_tool
from zdoctor.proc.target import target_of


def rank_processes(processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The processes of a job tree that are ranks: those with a LOCAL_RANK whose parent does not carry the
    same one (a rank's data-loader workers inherit its variables)."""
    def key(p: dict[str, Any]) -> tuple[str | None, str | None]:
        env = p.get("env") or {}
        return env.get("RANK"), env.get("LOCAL_RANK")

    by_pid = {p["pid"]: p for p in processes}
    out = []
    for p in processes:
        if key(p)[1] is None:
            continue
        parent = by_pid.get(p.get("ppid"))
        if parent is not None and key(parent) == key(p):
            continue
        out.append(p)
    return out


def _ranks_per_node(launch: dict[str, Any], env: dict[str, str], options: dict[str, Any],
                    processes: list[dict[str, Any]]) -> tuple[int | None, str]:
    ranks = rank_processes(processes)
    if ranks:
        return len(ranks), "the running job's processes with a LOCAL_RANK"
    opts = launch.get("options") or {}
    for key, what in (("num_gpus", "--num_gpus"), ("nproc_per_node", "--nproc_per_node / --num_processes"),
                      ("npernode", "the launcher's processes per node")):
        value = str(opts.get(key) or "")
        if value.isdigit() and int(value) > 0:
            return int(value), what
    include = str(opts.get("include") or "")
    if include.startswith("localhost:") and "@" not in include:
        return len(include.split(":", 1)[1].split(",")), "--include"
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if launch.get("launcher") == "deepspeed" and cvd and not opts.get("hostfile"):
        return len([d for d in cvd.split(",") if d.strip()]), "CUDA_VISIBLE_DEVICES (the launcher takes it)"
    if options.get("gpus_per_node"):
        return int(options["gpus_per_node"]), "--gpus-per-node"
    if launch.get("launcher") == "python":
        return 1, "a plain python process is one rank"
    return None, "not known: the command does not say how many ranks it starts (--gpus-per-node tells zdoctor)"


def _omp(launch: dict[str, Any], env: dict[str, str], binding: dict[str, Any],
         ranks: int | None) -> tuple[str | None, str]:
    if env.get("OMP_NUM_THREADS"):
        return env["OMP_NUM_THREADS"], "the launch's environment"
    kind = launch.get("launcher")
    if kind == "deepspeed" and binding.get("bind_cores_to_rank"):
        return "cores per rank", "deepspeed --bind_cores_to_rank sets it to each rank's share of the cores"
    if kind in ("torchrun", "accelerate") and ranks is not None and ranks > 1:
        return "1", ("torch.distributed.run sets OMP_NUM_THREADS=1 for each worker when it is unset and "
                     "nproc_per_node > 1 (torch/distributed/run.py)")
    return None, "not set: each rank's OpenMP and torch use one thread per CPU it may run on"


def collect_rankcores(launch_facts: dict[str, Any], options: dict[str, Any], node_root: str = cores.NODE_ROOT,
                      proc_root: str = cores.PROC_ROOT) -> tuple[dict[str, Any], list[Evidence]]:
    launch = launch_facts.get("launch") or {}
    env = launch_facts.get("env") or {}
    processes = launch_facts.get("processes") or []
    facts: dict[str, Any] = {"numa": cores.numa_nodes(node_root)}
    if processes:
        top = processes[0]["pid"]
        facts["cpus"] = cores.process_cpus(top, proc_root)
        facts["cpus_of"] = f"the job's first process (pid {top})"
    else:
        facts["cpus"] = cores.process_cpus(os.getpid(), proc_root)
        facts["cpus_of"] = "zdoctor's own process: a command started from the same shell inherits them"
    ranks = [dict(cores.process_cpus(p["pid"], proc_root), local_rank=p["env"].get("LOCAL_RANK"))
             for p in rank_processes(processes)]
    facts["ranks"] = ranks
    n, how = _ranks_per_node(launch, env, options, processes)
    facts["ranks_per_node"], facts["ranks_how"] = n, how
    opts = launch.get("options") or {}
    binding = {"bind_cores_to_rank": bool(opts.get("bind_cores_to_rank")),
               "bind_core_list": opts.get("bind_core_list"), "binders": launch.get("binders") or [],
               "mpi": opts.get("bind_to") or opts.get("map_by")}
    facts["binding"] = binding
    facts["omp_num_threads"], facts["omp_how"] = _omp(launch, env, binding, n)
    numactl = system_tool("numactl")
    facts["numactl"] = {"path": numactl, "runs": None}
    ev: list[Evidence] = []
    if numactl:
        got = run([numactl, "--show"], timeout=10, label="numactl --show")
        facts["numactl"]["runs"] = got.exit_code == 0
        ev.append(got)
    rows = [[f"NUMA node {x['node']}", x["cpus"], str(x["count"])] for x in facts["numa"]["nodes"]]
    rows.append([f"the launch ({facts['cpus_of'].split(':')[0]})", facts["cpus"].get("cpus") or "unknown",
                 str(facts["cpus"].get("count") or "unknown")])
    rows += [[f"rank LOCAL_RANK={r['local_rank']} (pid {r['pid']}, {r['threads']} threads)", r["cpus"] or "unknown",
              str(r["count"] or "unknown")] for r in ranks]
    ev.insert(0, Evidence.of_table("CPUs of the node and of the ranks", ["what", "CPUs", "count"], rows))
    return facts, ev


@probe("rankcores", title="NUMA nodes, each rank's CPUs and threads", timeout=30, needs=("launch",),
       facts=RankcoresFacts)
def rankcores_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    return collect_rankcores(facts_of(host, "launch"), target_of(host).options)
