"""The host limits check of the training: /dev/shm, locked memory (ulimit -l) and open files (ulimit -n)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import HostLimitsFacts
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.readers import hostlimits as limits
from zdoctor.readers.gpufacts import nvml_gpus
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.limitsconf import limits_conf_remedy


def _gpus_on_node(facts: Facts, lf: Mapping[str, Any]) -> int | None:
    gpus = nvml_gpus(facts)
    if gpus is not None:
        return len(gpus)
    n = lf.get("gpus_per_node")
    return n if isinstance(n, int) else None


@check("gpu.limits", title="/dev/shm, locked memory and open files of the training", probes=("host_limits", "nvml"),
       explains=("nofile", "shm"), optional=("limitfix",),
       findings=("gpu.limits.memlock", "gpu.limits.nofile", "gpu.limits.shm"))
def check_limits(facts: Facts, me: CheckSpec) -> list[Finding]:
    lf = me.require(facts.of("host_limits"), facts.why_not("host_limits"))
    ev = facts.evidence("host_limits")
    return [_shm(me, facts, lf, ev), _memlock(me, lf, ev), _nofile(me, facts, lf, ev)]


def _shm(me: CheckSpec, facts: Facts, lf: HostLimitsFacts, ev: list[Evidence]) -> Finding:
    fid = me.id("shm")
    shm = lf.get("shm") or {}
    box = lf.get("container") or {}
    n = _gpus_on_node(facts, lf)
    if shm.get("total") is None:
        return me.not_checked(shm.get("error") or "/dev/shm could not be measured", ev, sub="shm", part="/dev/shm size")
    size = shm["total"]
    if size >= limits.SHM_WARN:
        return Finding(id=fid, status="ok", title=f"/dev/shm is {limits.human(size)}",
                       detail=f"{limits.human(shm.get('free'))} free. NCCL's shared-memory transport and DataLoader "
                              "workers have room.", evidence=ev)
    many = n is not None and n > 1
    status = "fail" if many else "warn"
    docker = " (docker's default)" if size == limits.DOCKER_SHM and box.get("in_container") else ""
    detail = (f"/dev/shm is {limits.human(size)}{docker}; DeepSpeed's ds_report warns below 512 MiB. NCCL puts its "
              "intra-node buffers there: with several GPUs it fails with 'NCCL WARN Error while creating shared "
              "memory segment' / 'unhandled system error', and DataLoader workers die with 'bus error' or "
              "'No space left on device'.")
    if n is not None:
        detail += f" This node has {count_of(n, 'GPU')}."
    rem = [Remedy(title="Fall back from NCCL's shared-memory transport (slower)",
                  commands=["export NCCL_SHM_DISABLE=1"],
                  undo=["unset NCCL_SHM_DISABLE"], verified=None,
                  explanation="A workaround for this run only: NCCL then moves intra-node data through other paths.")]
    if box.get("in_container"):
        rem.insert(0, Remedy(title="Restart the container with a larger /dev/shm",
                             commands=["# add to `docker run`: --shm-size=16g   (or --ipc=host to share the host's)"],
                             verified=None,
                             explanation="The size of /dev/shm is fixed when the container starts. Kubernetes: "
                                         "mount an emptyDir with medium: Memory at /dev/shm."))
    else:
        rem.insert(0, Remedy(title="Grow /dev/shm (until reboot)", commands=["mount -o remount,size=16G /dev/shm"],
                             requires_root=True, verified=None,
                             explanation="tmpfs uses RAM only as files are written; the size is a cap. For a "
                                         "permanent change, set the size on the /dev/shm line of /etc/fstab."))
    return Finding(id=fid, status=status, title=f"/dev/shm is only {limits.human(size)}", detail=detail, evidence=ev,
                   remedies=rem, explains=ids_for(facts, "shm"))


def _tried_ulimit(facts: Facts, remedy: Remedy) -> Remedy:
    """The ``ulimit -n`` remedy with what its trial on the failing command showed (the ``limitfix`` probe)."""
    trial = facts.of("limitfix") or {}
    if "fixed" not in trial:
        return remedy
    remedy.tried = True
    remedy.verified = bool(trial["fixed"])
    if trial["fixed"]:
        remedy.note = f"the failing command ran to the end with ulimit -n {trial['limit']}"
    else:
        how = trial.get("error") or f"exit code {trial.get('exit_code')}"
        remedy.note = (f"the failing command still failed with ulimit -n {trial['limit']} ({how}"
                       + (", still 'Too many open files'" if trial.get("still_emfile") else "") + ")")
    return remedy


def _memlock(me: CheckSpec, lf: HostLimitsFacts, ev: list[Evidence]) -> Finding:
    fid = me.id("memlock")
    t = lf.get("target") or {}
    soft, hard = t.get("memlock_soft_kb"), t.get("memlock_hard_kb")
    if soft is None:
        return me.not_checked(t.get("error") or "the training shell did not report ulimit -l", ev,
                              sub="memlock", part="ulimit -l")
    if soft == "unlimited":
        return Finding(id=fid, status="ok", title="ulimit -l (locked memory) is unlimited",
                       detail="Pinned host buffers and RDMA registration are not capped.", evidence=ev)
    rem = []
    if hard == "unlimited" or (isinstance(hard, int) and isinstance(soft, int) and hard > soft):
        rem.append(Remedy(title="Raise the soft limit in the launching shell",
                          commands=[f"ulimit -l {'unlimited' if hard == 'unlimited' else hard}"], verified=None,
                          explanation="A process may raise its soft limit up to the hard limit without root."))
    rem.append(limits_conf_remedy("memlock", "unlimited", lf.get("limits_d")))
    nodes = lf.get("nodes")
    return Finding(
        id=fid, status="warn", title=f"ulimit -l (locked memory) is {soft} KiB in the training shell",
        detail="DeepSpeed >= 0.19.5 pins the offload buffers by default (offload_param/offload_optimizer "
               "pin_memory=True). Memory registered with an InfiniBand/RoCE NIC always counts against this "
               "limit: multi-node NCCL fails with 'ibv_reg_mr failed' or 'RLIMIT_MEMLOCK' warnings. Whether CUDA's "
               "own pinned allocations count depends on the driver; mlock-based pinning always does."
               + (f" The job spans {nodes} nodes." if isinstance(nodes, int) and nodes > 1 else ""),
        evidence=ev, remedies=rem)


def _nofile(me: CheckSpec, facts: Facts, lf: HostLimitsFacts, ev: list[Evidence]) -> Finding:
    fid = me.id("nofile")
    t = lf.get("target") or {}
    soft, hard = t.get("nofile_soft"), t.get("nofile_hard")
    if soft is None:
        return me.not_checked(t.get("error") or "the training shell did not report ulimit -n", ev,
                              sub="nofile", part="ulimit -n")
    if soft == "unlimited" or soft >= limits.NOFILE_LOW:
        return Finding(id=fid, status="ok", title=f"ulimit -n (open files) is {soft}", evidence=ev)
    rem = []
    new = limits.raised_nofile(soft, hard)
    if new is not None:
        rem.append(_tried_ulimit(facts, Remedy(title="Raise the soft limit in the launching shell",
                                               commands=[f"ulimit -n {new}"], verified=None)))
    rem.append(limits_conf_remedy("nofile", str(limits.NOFILE_TARGET), lf.get("limits_d")))
    return Finding(id=fid, status="warn", title=f"ulimit -n (open files) is only {soft}",
                   detail="Each rank opens sockets to its peers, DataLoader workers pass tensors as file descriptors, "
                          "and NVMe offload opens swap files: a low limit ends in 'Too many open files'.",
                   evidence=ev, remedies=rem, explains=ids_for(facts, "nofile"))
