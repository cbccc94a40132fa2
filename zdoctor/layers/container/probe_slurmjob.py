"""Probe ``slurm_job``: the Slurm job the training runs in, and the memory it asked for.

Facts: :func:`zdoctor.layers.container.slurmjob.job_memory` of the job's environment (the ``--python`` run's
environment, which is zdoctor's own unless the job gives another): {in_job, job_id, step_id, variables,
request: {variable, option, mib, per, per_variable, node_mib} | None, bad}.
"""

from __future__ import annotations

from typing import Any

from zdoctor.core.factstypes import SlurmJobFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.container.slurmjob import job_memory
from zdoctor.proc.target import target_of


@probe("slurm_job", title="The Slurm job and its memory request (SLURM_* variables)", timeout=5,
       facts=SlurmJobFacts)
def slurm_job_probe(host: Any) -> tuple[SlurmJobFacts, list[Evidence]]:
    """Read the job's SLURM_* variables: its id and step, and --mem / --mem-per-cpu / --mem-per-gpu."""
    facts = job_memory(target_of(host).env)
    rows = [[k, v] for k, v in sorted(facts["variables"].items())] or [["SLURM_JOB_ID", "not set: not a Slurm job"]]
    return facts, [Evidence.of_table("Slurm variables of the job's environment", ["variable", "value"], rows)]
