"""Check ``gpu.shm-access``: /dev/shm writable by the training user (see probe_shmaccess.py)."""

from __future__ import annotations

import shlex

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check


@check("gpu.shm-access", title="/dev/shm writable by the training user", probes=("shm_access",))
def check_shm_access(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("shm_access"), facts.why_not("shm_access"))
    ev = facts.evidence("shm_access")
    path = f.get("path") or "/dev/shm"
    who = f"{f['tested_as']} (uid {f.get('user_uid')})" if f.get("tested_as") and f.get("user_uid") is not None \
        else f"uid {f['euid']}"
    if f.get("skipped") or f.get("write_test") is None:
        return [me.not_checked(f.get("skipped") or f.get("error") or "no create test ran", ev)]
    if f.get("write_test"):
        return [me.finding(status="ok",
                           title=f"{path} is writable by {who} (mode {f['mode']})", evidence=ev)]
    return [me.finding(
        status="fail",
        title=f"{who} cannot create files in {path} (mode {f['mode']}, owner uid {f['uid']}): "
              f"{f.get('error')}",
        detail="NCCL's shared-memory transport, torch's DataLoader workers (shared tensors) and DeepSpeed's "
               "shm communication create files here; their size is not the problem, the permission is. /dev/shm "
               "is normally a tmpfs with mode 1777 (everyone may create, only owners may delete).",
        evidence=ev,
        remedies=[Remedy(title=f"Give {path} its usual mode 1777", commands=[f"chmod 1777 {shlex.quote(path)}"],
                         requires_root=True, undo=[f"chmod {f['mode'][2:] if f.get('mode') else '755'} "
                                                   f"{shlex.quote(path)}"],
                         explanation="Lost at reboot if the mount sets another mode: then fix the mode= option of "
                                     "its tmpfs line in /etc/fstab (or the container's --shm-size / --ipc=host)."),
                  Remedy(title="Workaround: keep NCCL off shared memory (slower intra-node transfers)",
                         commands=["export NCCL_SHM_DISABLE=1"], undo=["unset NCCL_SHM_DISABLE"])])]
