"""The environment each rank needs to join the job, what each launcher sets, and what a launch has.

torch.distributed's ``env://`` rendezvous and DeepSpeed's ``init_distributed`` read ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. The launchers set them in each rank;
MPI and Slurm set their own variables instead, which DeepSpeed maps through mpi4py. Pure.
"""

from __future__ import annotations

from typing import Any

#: The variables DeepSpeed's init_distributed requires before it skips MPI discovery.
REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
#: Prefixes of the variables MPI and Slurm give a rank.
MPI_PREFIXES = ("OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MV2_", "MPI_LOCALRANKID")
SLURM_KEYS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_NODELIST")

#: What each launcher gives a rank, and where that is written.
SETS: dict[str, dict[str, Any]] = {
    "deepspeed": {"sets": REQUIRED, "how": "deepspeed.launcher.launch sets RANK and LOCAL_RANK per rank and "
                  "WORLD_SIZE, MASTER_ADDR and MASTER_PORT for all of them",
                  "source": "DeepSpeed deepspeed/launcher/launch.py (current_env[\"RANK\"], [\"LOCAL_RANK\"])"},
    "torchrun": {"sets": (*REQUIRED, "LOCAL_WORLD_SIZE", "GROUP_RANK"),
                 "how": "torch.distributed.run's elastic agent sets them for each worker",
                 "source": "PyTorch torch/distributed/elastic/agent/server/local_elastic_agent.py (worker env)"},
    "accelerate": {"sets": REQUIRED, "how": "accelerate launch starts torch.distributed.run (or the deepspeed "
                   "launcher) with the config's process counts", "source": "Accelerate commands/launch.py"},
    "mpirun": {"sets": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
               "how": "mpirun gives MPI's variables, not RANK/WORLD_SIZE: DeepSpeed maps them through mpi4py "
                      "(mpi_discovery), so mpi4py must be installed",
               "source": "DeepSpeed deepspeed/comm/comm.py (init_distributed -> mpi_discovery: from mpi4py import "
                         "MPI)"},
    "srun": {"sets": SLURM_KEYS, "how": "srun gives Slurm's variables, not RANK/WORLD_SIZE: DeepSpeed's "
                                        "init_distributed then tries MPI discovery through mpi4py",
             "source": "DeepSpeed deepspeed/comm/comm.py (init_distributed: required_env)"},
    "python": {"sets": (), "how": "a plain interpreter sets nothing: each of the variables must come from the "
                                  "environment it is started with", "source": ""},
}


def rank_env(launcher: str | None, env: dict[str, str]) -> dict[str, Any]:
    """For a launch by ``launcher`` from environment ``env``: ``given`` (the required variables already in
    it), ``missing`` (those neither it nor the launcher provides), ``mpi`` / ``slurm`` (their variables in
    it), and ``falls_back_to_mpi``: DeepSpeed's init_distributed will run MPI discovery (mpi4py)."""
    given = [k for k in REQUIRED if env.get(k)]
    sets = SETS.get(launcher or "", {}).get("sets", ())
    missing = [k for k in REQUIRED if k not in given and k not in sets]
    mpi = sorted(k for k in env if k.startswith(MPI_PREFIXES))
    slurm = sorted(k for k in env if k in SLURM_KEYS)
    return {"given": given, "missing": missing, "launcher_sets": list(sets), "mpi": mpi, "slurm": slurm,
            "falls_back_to_mpi": bool(missing)}
