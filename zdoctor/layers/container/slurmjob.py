"""What a Slurm job asked for, read from the ``SLURM_*`` variables Slurm puts in every task's environment.

Slurm writes the job's memory request into the environment of each task it starts (``sbatch``/``srun``'s
OUTPUT ENVIRONMENT VARIABLES): ``SLURM_MEM_PER_NODE`` for ``--mem``, ``SLURM_MEM_PER_CPU`` for
``--mem-per-cpu``, ``SLURM_MEM_PER_GPU`` for ``--mem-per-gpu``, each in megabytes (Slurm's M, 1024 KiB). With
the cgroup task plugin that request is the limit of the step's memory cgroup.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import SlurmJobFacts

MIB = 1024 * 1024
#: The request variables, the option each stands for and whether it counts per CPU or per GPU.
MEMORY_REQUESTS = (("SLURM_MEM_PER_NODE", "--mem", None), ("SLURM_MEM_PER_CPU", "--mem-per-cpu", "SLURM_CPUS_ON_NODE"),
                   ("SLURM_MEM_PER_GPU", "--mem-per-gpu", "SLURM_GPUS_ON_NODE"))
#: The variables shown as evidence (besides the requests).
JOB_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_JOB_NAME", "SLURM_JOB_PARTITION", "SLURM_CLUSTER_NAME",
                 "SLURM_CPUS_ON_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_NUM_NODES", "SLURMD_NODENAME")


def _mib(value: str | None) -> int | None:
    """``"4096"`` or ``"4096M"`` -> 4096; None when it is no number of megabytes."""
    m = re.fullmatch(r"\s*(\d+)\s*M?\s*", value or "")
    return int(m.group(1)) if m else None


def _count(value: str | None) -> int | None:
    m = re.fullmatch(r"\s*(\d+)\s*", value or "")
    return int(m.group(1)) if m else None


def job_memory(env: Mapping[str, str]) -> SlurmJobFacts:
    """The job's Slurm identity and memory request from ``env``.

    ``in_job``: SLURM_JOB_ID is set; ``variables``: the SLURM_* variables read; ``request``: {variable,
    option, mib, per (the count it is multiplied by, None for --mem), per_variable, node_mib (the request for
    this node in MiB, None when the count is unknown)} or None when no request variable is set (the
    partition's default applies); ``bad``: request variables whose value is not a number of megabytes.
    """
    variables = {k: env[k] for k in (*JOB_VARIABLES, *(r[0] for r in MEMORY_REQUESTS)) if k in env}
    out: SlurmJobFacts = {"in_job": bool(env.get("SLURM_JOB_ID")), "job_id": env.get("SLURM_JOB_ID"),
                          "step_id": env.get("SLURM_STEP_ID"), "variables": variables, "request": None, "bad": []}
    for var, option, per_var in MEMORY_REQUESTS:
        if var not in env:
            continue
        mib = _mib(env[var])
        if mib is None:
            out["bad"].append(f"{var}={env[var]!r}")
            continue
        per = _count(env.get(per_var)) if per_var else None
        node = mib if per_var is None else (mib * per if per is not None else None)
        out["request"] = {"variable": var, "option": option, "mib": mib, "per": per, "per_variable": per_var,
                          "node_mib": node}
        break
    return out


def option_text(request: dict[str, Any], mib: int | None = None) -> str:
    """``--mem=256M`` (or the same option with ``mib`` instead of the request's value)."""
    return f"{request['option']}={request['mib'] if mib is None else mib}M"
