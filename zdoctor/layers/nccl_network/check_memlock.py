"""Check ``nccl.memlock``: the locked-memory limit on the paths the ranks really start by (the launching shell,
a running rank, a host reached through ssh) is not what ends RDMA registration (``ibv_reg_mr``) with
ENOMEM."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.nccl_network.memlock import lower
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.limitsconf import limits_conf_remedy

CID = "nccl.memlock"
MEMLOCK = "memlock"
SSHD_DROPIN = "/etc/systemd/system/ssh.service.d/90-zdoctor-memlock.conf"


def _paths(mf: Mapping[str, Any]) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """``(where, soft, hard)`` for every path whose limit was read and binds, and the paths whose processes
    have CAP_IPC_LOCK (the kernel lets them lock and register memory beyond the limit)."""
    out, exempt = [], []
    shell = mf.get("shell") or {}
    if shell.get("soft_kb") is not None:
        out.append(("the training shell", shell["soft_kb"], shell.get("hard_kb")))
    found = [(f"running pid {r['pid']}", r) for r in mf.get("ranks") or []]
    found += [(f"a process ssh starts on {r['host']}", r) for r in mf.get("ssh") or []]
    for where, r in found:
        if r.get("soft_kb") is None:
            continue
        if r.get("ipc_lock"):
            exempt.append(where)
        else:
            out.append((where, r["soft_kb"], r.get("hard_kb")))
    return out, exempt


def _show(v: Any) -> str:
    return f"{v} KiB" if isinstance(v, int) else str(v)


def _remedies(mf: Mapping[str, Any], low: list[tuple[str, Any, Any]]) -> list[Remedy]:
    rem: list[Remedy] = []
    box = mf.get("container") or {}
    if box.get("in_container"):
        rem.append(Remedy(title="Start the container with no locked-memory limit",
                          commands=["# add to `docker run`: --ulimit memlock=-1:-1   (with --cap-add IPC_LOCK for "
                                    "RDMA devices)"],
                          note="not tried, because the container's limits are fixed when it starts",
                          explanation="A container's processes get the limit the runtime gives it (Docker: --ulimit; "
                                      "Kubernetes: the container runtime's own LimitMEMLOCK, e.g. containerd's "
                                      "systemd unit), whatever limits.d says inside it."))
    shell = next((x for x in low if x[0] == "the training shell"), None)
    if shell and (shell[2] == "unlimited" or (isinstance(shell[2], int) and lower(shell[1], shell[2]))):
        rem.append(Remedy(title="Raise the soft limit in the launching shell",
                          commands=[f"ulimit -l {shell[2]}"],
                          note="not tried, because it applies to the shell the training is launched from",
                          explanation="A process may raise its soft limit up to the hard one without root; ranks "
                                      "started from that shell inherit it (not those pdsh or mpirun start "
                                      "through ssh)."))
    rem.append(limits_conf_remedy("memlock", "unlimited", mf.get("limits_d")))
    hosts = [w.rsplit(" ", 1)[-1] for w, _, _ in low if w.startswith("a process ssh starts on ")]
    if hosts:
        body = "[Service]\nLimitMEMLOCK=infinity\n"
        step = (f"mkdir -p {shlex.quote(SSHD_DROPIN.rsplit('/', 1)[0])} && printf {shlex.quote(body)} > "
                f"{shlex.quote(SSHD_DROPIN)} && systemctl daemon-reload && systemctl restart ssh || "
                "systemctl restart sshd")
        rem.append(Remedy(title=f"On {', '.join(hosts[:4])}: let sshd hand its sessions no locked-memory limit",
                          commands=[f"ssh -t {shlex.quote(h)} {shlex.quote('sudo sh -c ' + shlex.quote(step))}"
                                    for h in hosts[:4]],
                          requires_root=True, note="not tried, because it changes another node's sshd",
                          explanation="pdsh and mpirun start the ranks through ssh: with UsePAM yes the session "
                                      "gets pam_limits' values (the limits.d drop-in above, on that host); without "
                                      "PAM it inherits sshd's own limit, which its systemd unit sets."))
    return rem


@check(CID, title="Locked memory for RDMA on the paths the ranks start by", probes=("memlock_paths",),
       explains=(MEMLOCK,), layer="nccl-network")
def check_memlock(facts: Facts, me: CheckSpec) -> list[Finding]:
    mf = me.require(facts.of("memlock_paths"), facts.why_not("memlock_paths"), sub="not-checked")
    ev = facts.evidence("memlock_paths")
    paths, exempt = _paths(mf)
    explains = ids_for(facts, MEMLOCK)
    caps = (" Not limited, having CAP_IPC_LOCK (root, or --cap-add IPC_LOCK): " + "; ".join(exempt) + "."
            if exempt else "")
    if not paths and not exempt:
        return [me.not_checked("no path's limit could be read (the shell, running ranks, ssh to the hosts)", ev,
                               sub="not-checked")]
    low = [p for p in paths if p[1] != "unlimited"]
    unread = [f"ssh {r['host']}: {r['error']}" for r in mf.get("ssh") or [] if r.get("error")]
    if not low:
        detail = "Every path read gives unlimited locked memory: " + "; ".join(w for w, _, _ in paths) + "." + caps
        if unread:
            detail += " Not read: " + "; ".join(unread) + "."
        if explains:
            detail += (" The ENOMEM of the registration is not this limit's: read the container's limit as the "
                       "ranks see it (/proc/RANK_PID/limits), and whether the host is out of memory.")
        return [me.finding(status="warn" if explains else "ok",
                        title="Locked memory is unlimited on every path the ranks start by", detail=detail,
                        evidence=ev)]
    least = min(low, key=lambda p: p[1] if isinstance(p[1], int) else 0)
    shell_soft = (mf.get("shell") or {}).get("soft_kb")
    worse = [p for p in low if p[0] != "the training shell" and lower(p[1], shell_soft)]
    detail = ("; ".join(f"{w}: {_show(s)} (hard {_show(h)})" for w, s, h in paths)
              + ". Every page an RDMA registration (ibv_reg_mr: NCCL's IB/RoCE buffers, UCX, MPI) pins counts "
                "against this limit; above it the kernel answers ENOMEM, which NCCL prints as 'Call to "
                "ibv_reg_mr failed with error Cannot allocate memory'.")
    if worse:
        detail += (f" The ranks started through {worse[0][0].split(' ', 1)[1]} get less than the launching shell "
                   f"({_show(shell_soft)}): the limit the shell shows is not theirs.")
    if unread:
        detail += " Not read: " + "; ".join(unread) + "."
    detail += caps
    if not explains and not worse:
        return [me.finding(status="ok", title=f"The ranks' paths get the launching shell's locked-memory "
                        f"limit ({_show(shell_soft)})", detail=detail + " The shell's own limit is judged by "
                        "gpu.limits.memlock.", evidence=ev)]
    return [me.finding(status="fail" if explains else "warn",
                    title=f"Locked memory is limited to {_show(least[1])} on {least[0]}"
                          + (": RDMA registration fails with ENOMEM" if explains else ""),
                    detail=detail, evidence=ev, explains=explains, remedies=_remedies(mf, low))]
