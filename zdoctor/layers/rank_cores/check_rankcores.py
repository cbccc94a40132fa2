"""Check ``cores.ranks``: the CPUs each rank of this node gets against the threads it starts (NUMA nodes,
Cpus_allowed_list, OMP_NUM_THREADS, the launcher's binding): what DeepSpeedCPUAdam's optimizer step runs on
with CPU offload."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import RankcoresBinding
from zdoctor.core.model import Finding, Remedy
from zdoctor.core.packages import managers
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check


def _binding_words(b: RankcoresBinding) -> str:
    parts = []
    if b.get("bind_cores_to_rank"):
        parts.append("deepspeed --bind_cores_to_rank" + (f" --bind_core_list {b['bind_core_list']}"
                                                         if b.get("bind_core_list") else ""))
    parts += [" ".join([x["tool"], *x.get("args", [])]) for x in b.get("binders") or []]
    if b.get("mpi"):
        parts.append(f"the MPI/Slurm binding {b['mpi']}")
    return ", ".join(parts)


def cores_summary(rc: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{cpus, ranks, per_rank, omp, bound, sentence}`` of the rankcores facts; None values are unknown."""
    if not rc:
        return {"sentence": None}
    cpus = (rc.get("cpus") or {}).get("count")
    ranks = rc.get("ranks_per_node")
    per = cpus // ranks if cpus and ranks else None
    omp = rc.get("omp_num_threads")
    bound = _binding_words(rc.get("binding") or RankcoresBinding())
    nodes = len((rc.get("numa") or {}).get("nodes") or []) or None
    sentence = (f"{'unknown' if ranks is None else count_of(ranks, 'rank')} on {cpus or 'unknown'} CPUs "
                f"({'unknown' if nodes is None else count_of(nodes, 'NUMA node')}): "
                f"{'unknown' if per is None else per} cores per rank, OMP_NUM_THREADS "
                f"{omp or 'not set'}, {'bound with ' + bound if bound else 'not bound to cores'}")
    return {"cpus": cpus, "ranks": ranks, "per_rank": per, "omp": omp, "bound": bound, "sentence": sentence}


@check("cores.ranks", title="Each rank's CPU cores against its threads", probes=("rankcores",),
       optional=("launch",), layer="rank-cores")
def check_rank_cores(facts: Facts, me: CheckSpec) -> list[Finding]:
    rc = me.require(facts.of("rankcores"), facts.why_not("rankcores"), sub="not-checked")
    ev = facts.evidence("rankcores")
    if (rc.get("cpus") or {}).get("count") is None:
        return [me.not_checked(f"the CPUs of {rc.get('cpus_of')} could not be read: "
                               f"{(rc.get('cpus') or {}).get('error')}", ev, sub="not-checked")]
    s = cores_summary(rc)
    if s["ranks"] is None:
        return [me.not_checked(f"how many ranks run on this node is {rc.get('ranks_how')}", ev, sub="not-checked")]
    binding = rc.get("binding") or {}
    detail = [f"{s['sentence']} (ranks: {rc.get('ranks_how')}; CPUs: {rc.get('cpus_of')}; OMP_NUM_THREADS: "
              f"{rc.get('omp_how')})."]
    numa = rc.get("numa") or {}
    if numa.get("error"):
        detail.append(f"NUMA nodes: unknown ({numa['error']}).")
    launch = facts.of("launch") or {}
    rules = (launch.get("rules") or {}).get("bind-cores-to-rank") or {}
    if binding.get("bind_cores_to_rank"):
        if rules.get("state") == "absent":
            ver = (launch.get("deepspeed") or {}).get("version") or "?"
            return [me.finding(status="fail", title=f"DeepSpeed {ver}'s launcher has no --bind_cores_to_rank",
                               detail=" ".join(detail) + " The option came with DeepSpeed PR 2881 (0.9.0): this "
                                      "release's launcher refuses it as an unknown argument.", evidence=ev)]
        nm = rc.get("numactl") or {}
        if not nm.get("path") or nm.get("runs") is False:
            distro = (facts.of("toolchain") or {}).get("distro") or {}
            return [me.finding(status="fail", title="--bind_cores_to_rank needs numactl, which "
                               + ("is not installed" if not nm.get("path") else "does not run") + " here",
                               detail=" ".join(detail) + " DeepSpeed's launcher starts each rank as `numactl -C "
                                      "CORES python ...` (deepspeed/utils/numa.py get_numactl_cmd): without numactl "
                                      "no rank starts.", evidence=ev,
                               remedies=[Remedy(title=f"Install numactl ({pm.label})", commands=pm.install("numactl"),
                                                requires_root=True) for pm in managers(distro)])]
    per, omp = s["per_rank"], s["omp"]
    if per == 0:
        return [me.finding(status="fail", title=f"{count_of(s['ranks'], 'rank')} share {s['cpus']} CPUs",
                           detail=" ".join(detail) + " Fewer CPUs than ranks: every CPU optimizer step and data "
                                  "loader competes.", evidence=ev)]
    remedies = _remedies(s)
    if omp == "1" and per and per > 1:
        return [me.finding(status="warn", title=f"OMP_NUM_THREADS=1: each rank's CPU optimizer uses one of "
                           f"its {per} cores", detail=" ".join(detail) + " DeepSpeedCPUAdam's step runs an OpenMP "
                           "loop over the parameters: with one thread it is the slowest part of an offloaded step.",
                           evidence=ev, remedies=remedies)]
    threads = per if omp in (None, "cores per rank") or not str(omp).isdigit() else int(omp)
    unbound = not s["bound"] and not rc.get("ranks")
    if omp is None and s["ranks"] > 1 and unbound:
        return [me.finding(status="warn", title=f"{count_of(s['ranks'], 'rank')}, each free to use all "
                           f"{s['cpus']} CPUs with one OpenMP thread per CPU", detail=" ".join(detail) +
                           f" Unset OMP_NUM_THREADS and no binding: each rank starts {s['cpus']} threads, "
                           f"{s['ranks'] * s['cpus']} in all on {s['cpus']} CPUs, and the CPU optimizer steps of the "
                           "ranks slow each other down.", evidence=ev, remedies=remedies)]
    if str(omp).isdigit() and int(omp) * s["ranks"] > s["cpus"]:
        return [me.finding(status="warn", title=f"OMP_NUM_THREADS={omp} x {count_of(s['ranks'], 'rank')} "
                           f"is more threads than the {s['cpus']} CPUs", detail=" ".join(detail) +
                           " The ranks' OpenMP threads are oversubscribed: each waits for a CPU.", evidence=ev,
                           remedies=remedies)]
    return [me.finding(status="ok", title=f"{count_of(s['ranks'], 'rank')} with {per} cores each, "
                       f"{threads} OpenMP threads per rank", detail=" ".join(detail), evidence=ev)]


def _remedies(s: dict[str, Any]) -> list[Remedy]:
    per = s["per_rank"] or 1
    return [Remedy(title="Bind each rank to its own cores with the DeepSpeed launcher",
                   commands=["# add to the deepspeed command line: --bind_cores_to_rank"],
                   explanation=f"Each rank then runs under numactl on its share ({per} cores here) and its "
                               "OMP_NUM_THREADS is set to that share (DeepSpeed 0.9.0 and later; needs numactl)."),
            Remedy(title="Or set the threads per rank yourself", commands=[f"export OMP_NUM_THREADS={per}"],
                   undo=["unset OMP_NUM_THREADS"],
                   explanation="One OpenMP thread per core of the rank's share: the ranks no longer compete.")]
