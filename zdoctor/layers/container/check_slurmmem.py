"""Check ``container.slurm-memory``: slurmstepd's OOM lines explained by the job's own memory request.

Under Slurm's cgroup task plugin the job's ``--mem`` / ``--mem-per-cpu`` / ``--mem-per-gpu`` is the limit of
its step's memory cgroup; when a task outgrows it the kernel kills it there and slurmstepd reports "Detected N
oom-kill event(s) in StepId=..." (srun: "task N: Out Of Memory"). The host's RAM did not run out: the request
did. The request is read from the job's ``SLURM_*`` variables and set beside the cgroup limit and OOM-kill
counter the ``container`` probe read; outside the job only the message speaks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zdoctor.core.causes import CGROUP_LIMIT
from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.container.slurmjob import MIB, option_text
from zdoctor.readers.hostlimits import human
from zdoctor.symptoms.match import symptoms_of

FID = "container.slurm-memory"
TITLE = "Slurm's memory limit of the job"
#: What to read of a job zdoctor did not run in.
READ_NEXT = ("sacct -j {job} -o JobID,ReqMem,MaxRSS,State (the request, the peak and OUT_OF_MEMORY) and "
             "scontrol show job {job} (MinMemoryNode / MinMemoryCPU)")
NOT_TRIED = "not tried: the limit is fixed when Slurm starts the job; it takes a new submission"


def _job_of(step: str | None) -> str:
    """``4242.0`` / ``4242.batch`` -> ``4242``; ``<job id>`` when unknown."""
    return step.split(".", 1)[0] if step else "<job id>"


def _remedies(slurm: Mapping[str, Any], limit: Any) -> list[Remedy]:
    """A larger request of the same kind (twice what was hit: the need above it is unknown, the task was killed on
    reaching it), and all of the node's memory."""
    req = slurm.get("request")
    out: list[Remedy] = []
    if req:
        bigger = option_text(req, req["mib"] * 2)
        out.append(Remedy(
            title=f"Ask Slurm for more memory: {bigger} instead of {option_text(req)}",
            commands=[f"#SBATCH {bigger}", f"# or on the command line: sbatch {bigger} ... / srun {bigger} ..."],
            note=NOT_TRIED,
            explanation="Twice the request that was hit: how much more the job wanted is not known, because the "
                        "kernel killed the task when it reached the limit. sacct's MaxRSS of a run that fits gives "
                        "the figure to settle on."))
    elif isinstance(limit, int):
        out.append(Remedy(
            title=f"Ask Slurm for memory explicitly: --mem={limit * 2 // MIB}M (the job ran under the partition's "
                  f"default, {human(limit)} here)",
            commands=[f"#SBATCH --mem={limit * 2 // MIB}M"], note=NOT_TRIED,
            explanation="No --mem, --mem-per-cpu or --mem-per-gpu was given, so the partition's DefMemPerNode / "
                        "DefMemPerCPU set the limit."))
    out.append(Remedy(title="Ask Slurm for all of the node's memory: --mem=0", commands=["#SBATCH --mem=0"],
                      note=NOT_TRIED, explanation="--mem=0 gives the job the whole memory of each node it runs on "
                                                  "(where the cluster's policy allows it)."))
    return out


@check(FID, title=TITLE, probes=("slurm_job",), optional=("container",), explains=("slurm-oom",), layer="container")
def check_slurm_memory(facts: Facts, me: CheckSpec) -> list[Finding]:
    slurm = facts.of("slurm_job")
    said = [s for s in symptoms_of(facts) if s.kind == "slurm-oom"]
    if slurm is None:
        return [me.not_checked(facts.why_not("slurm_job"))]
    ev = facts.evidence("slurm_job") + facts.evidence("container")
    mem = ((facts.of("container") or {}).get("cgroup") or {}).get("memory") or {}
    limit, kills = mem.get("limit"), mem.get("oom_kill")
    where = f"{mem.get('limit_file')} of {mem.get('limit_cgroup')}" if mem.get("limit_cgroup") else None
    lines = [f"{s.where or s.source}: {s.text}" for s in said[:3]]
    step = next((s.fields.get("step") for s in said if s.fields.get("step")), None)
    if not slurm.get("in_job"):
        if not said:
            return [me.finding(status="ok", evidence=ev, title="Not a Slurm job: no Slurm memory request applies",
                            detail="SLURM_JOB_ID is not set in the job's environment, and no Slurm OOM line was "
                                   "given.")]
        job = _job_of(step)
        return [me.finding(
            status="warn", cause=CGROUP_LIMIT, evidence=ev, explains=[s.id for s in said],
            title=f"Slurm's memory cgroup of {('StepId=' + step) if step else 'the step'} killed a task: the job's "
                  "--mem / --mem-per-cpu was too small (from the message only)",
            detail="\n".join(lines + [
                "slurmstepd counts the OOM kills in the step's memory cgroup, whose limit is the job's memory "
                "request; the node's RAM is not what ran out. zdoctor did not run inside that job (no SLURM_JOB_ID "
                "in its environment), so the request is not read here. Read next: " + READ_NEXT.format(job=job)
                + "."]),
            remedies=_remedies(slurm, None))]
    req = slurm.get("request")
    asked = (f"{option_text(req)} ({req['variable']}"
             + (f" x {req['per']} from {req['per_variable']} = {req['node_mib']}M on this node" if req["per"] else "")
             + ")") if req else "no --mem, --mem-per-cpu or --mem-per-gpu (the partition's default)"
    job = f"Slurm job {slurm.get('job_id')}" + (f" step {slurm['step_id']}" if slurm.get("step_id") else "")
    facts_line = (f"{job} asked for {asked}. The job's memory cgroup here: limit "
                  + (f"{human(limit)} ({where})" if isinstance(limit, int) else
                     "none" if limit == "max" else "not read")
                  + (f", {count_of(kills, 'OOM kill')} counted ({mem.get('events_file')})" if isinstance(kills, int)
                     else "")
                  + ".")
    if slurm.get("bad"):
        facts_line += " Not read as a number of megabytes: " + ", ".join(slurm["bad"]) + "."
    counted = isinstance(kills, int) and kills > 0
    if said or counted:
        what = (f"slurmstepd counted OOM kills in StepId={step}" if step else "Slurm reported the step Out Of Memory") \
            if said else f"the job's memory cgroup counted {count_of(int(kills or 0), 'OOM kill')}"
        return [me.finding(
            status="fail", cause=CGROUP_LIMIT, evidence=ev, explains=[s.id for s in said],
            title=f"The job's Slurm memory request ({option_text(req) if req else 'the partition default'}) was the "
                  f"limit that killed it: {what}",
            detail="\n".join(lines + [facts_line,
                                      "With Slurm's cgroup task plugin the request is the step's memory cgroup "
                                      "limit: a task that outgrows it is killed by the kernel there while the node "
                                      "has memory free. Pinned offload buffers, DataLoader workers and the page "
                                      "cache of files written count against it."]),
            remedies=_remedies(slurm, limit if isinstance(limit, int) else None))]
    if not isinstance(kills, int):
        return [me.not_checked(f"{facts_line} The job's OOM-kill counter was not read: "
                            f"{mem.get('error') or facts.why_not('container')}", ev)]
    return [me.finding(status="ok", evidence=ev, title=f"{job}: no OOM kill at its memory limit",
                    detail=facts_line)]
