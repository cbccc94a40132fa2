"""Check ``pyenv.fd-passing``: DataLoader workers passing tensors by file descriptor, against the job's
open-files limit and /dev/shm.

Under torch's default sharing strategy on Linux (``file_descriptor``) every tensor a DataLoader worker hands
over travels as a descriptor over a Unix socket (SCM_RIGHTS), and each one the receiver keeps holds a
descriptor open. When the receiver cannot take one more, the kernel drops it and Python's multiprocessing says
"received 0 items of ancdata". With a low ``ulimit -n`` the limit is the cause; with a high one, the job
holds more shared tensors than any limit allows, and the job must change: ``file_system`` passes file names
(kept in /dev/shm) instead of descriptors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.readers import hostlimits as limits
from zdoctor.symptoms.match import symptoms_of

FID = "pyenv.fd-passing"
TITLE = "How DataLoader workers pass tensors, against the open-files limit"
KIND = "ancdata"
SET_STRATEGY = "torch.multiprocessing.set_sharing_strategy('file_system')"
NOT_TRIED = "not tried: it is a line of the training script"


def _strategy_remedy(shm: Mapping[str, Any]) -> Remedy:
    free, total = shm.get("free"), shm.get("total")
    room = (f" /dev/shm here: {limits.human(free)} free of {limits.human(total)}"
            + (" - too small for a DataLoader's tensors; grow it first (gpu.limits.shm)." if isinstance(total, int)
               and total < limits.SHM_WARN else ".")) if isinstance(total, int) else " /dev/shm was not measured."
    return Remedy(title="Pass tensors by file name: set the sharing strategy to file_system at the top of the "
                        "training script", commands=["import torch.multiprocessing", SET_STRATEGY],
                  note=NOT_TRIED,
                  explanation="Before the first DataLoader is made. Workers then hand over the name of a file in "
                              "/dev/shm instead of a descriptor, so the open-files limit no longer caps how many "
                              "shared tensors the job holds; the files take /dev/shm room while the tensors live "
                              "(a killed job may leave torch_* files there)." + room)


@check(FID, title=TITLE, probes=("pyenv",), optional=("host_limits",), explains=(KIND,))
def check_fd_passing(facts: Facts, me: CheckSpec) -> list[Finding]:
    said = [s for s in symptoms_of(facts) if s.kind == KIND]
    torch = (facts.of("pyenv") or {}).get("torch") or {}
    strategy = torch.get("sharing_strategy") if isinstance(torch.get("sharing_strategy"), str) else None
    lf = facts.of("host_limits") or {}
    target = lf.get("target") or {}
    soft, hard = target.get("nofile_soft"), target.get("nofile_hard")
    shm = lf.get("shm") or {}
    ev = facts.evidence("pyenv") + facts.evidence("host_limits")
    how = (f"The training environment's torch passes tensors by {strategy} (torch.multiprocessing."
           "get_sharing_strategy(), before the job's own code runs)" if strategy else
           "The training environment's sharing strategy is unknown (torch was not imported there)")
    limit_text = ("not read" if soft is None else str(soft))
    lines = [f"{s.where or s.source}: {s.text}" for s in said[:3]] + [
        f"{how}; the training shell's open-files limit (ulimit -n) is {limit_text}"
        + (f" (hard {hard})" if hard is not None else "") + "."]
    if not said:
        if strategy is None:
            return [me.not_checked(how, ev)]
        return [me.finding(status="ok", evidence=ev, title=f"DataLoader workers pass tensors by {strategy}",
                        detail="\n".join(lines))]
    explains = [s.id for s in said]
    if strategy == "file_system":
        return [me.finding(status="warn", evidence=ev, explains=explains,
                        title="Tensors were passed by descriptor, yet this environment's torch defaults to "
                              "file_system: the job sets file_descriptor itself (from the message only)",
                        detail="\n".join(lines + ["Read next: set_sharing_strategy calls in the training code."]),
                        remedies=[_strategy_remedy(shm)])]
    if soft is None:
        return [me.finding(status="warn", evidence=ev, explains=explains,
                        title="A DataLoader's tensor descriptors could not be received: the open-files limit or the "
                              "job's sharing strategy (from the message only)",
                        detail="\n".join(lines + ["Read next: ulimit -n in the shell that starts the job."]),
                        remedies=[_strategy_remedy(shm)])]
    if soft != "unlimited" and isinstance(soft, int) and soft < limits.NOFILE_LOW:
        raised = limits.raised_nofile(soft, hard)
        rem = [Remedy(title=f"Raise the open-files limit in the launching shell: ulimit -n {raised}",
                      commands=[f"ulimit -n {raised}"], note="not tried: it applies to the shell that starts the job",
                      explanation="Up to the hard limit, no root needed; each shared tensor the job holds keeps a "
                                  "descriptor open.")] if raised else []
        return [me.finding(status="fail", evidence=ev, explains=explains,
                        title=f"DataLoader workers pass every tensor as a file descriptor and the open-files limit "
                              f"is only {soft}: the receiver ran out of descriptors",
                        detail="\n".join(lines), remedies=rem + [_strategy_remedy(shm)])]
    return [me.finding(status="fail", evidence=ev, explains=explains,
                    title=f"The open-files limit ({soft}) is fine: the job holds more tensors passed by file "
                          "descriptor than any limit allows; change the job's sharing strategy to file_system",
                    detail="\n".join(lines + ["Raising ulimit -n further only moves the point where it fails: each "
                                              "tensor received from a worker and still alive keeps a descriptor."]),
                    remedies=[_strategy_remedy(shm)])]
