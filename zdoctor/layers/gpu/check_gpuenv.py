"""The check of the training's NCCL and CUDA environment variables: deprecated names, NCCL_DEBUG,
peer-to-peer, CUDA_VISIBLE_DEVICES and CUDA_LAUNCH_BLOCKING."""

from __future__ import annotations

import shlex
from typing import Any

from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of, noun_for
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.gpu import envreview
from zdoctor.readers.gpufacts import nvml_gpus


@check("gpu.env", title="NCCL / CUDA environment of the training", probes=("gpu_env", "nvml"),
       findings=("gpu.env.deprecated", "gpu.env.launch-blocking", "gpu.env.nccl-debug", "gpu.env.p2p",
                 "gpu.env.visible-devices"))
def check_env(facts: Facts, me: CheckSpec) -> list[Finding]:
    """The training's NCCL and CUDA variables: deprecated names, NCCL_DEBUG, peer-to-peer,
    CUDA_VISIBLE_DEVICES and CUDA_LAUNCH_BLOCKING, one finding each."""
    ge = me.require(facts.of("gpu_env"), facts.why_not("gpu_env"))
    env = ge.get("vars") or {}
    gpus = nvml_gpus(facts)
    return (_env_deprecated(me, env) + _env_nccl_debug(me, env) + _env_p2p(me, env, gpus, facts)
            + _env_visible_devices(me, env, gpus, ge.get("gpus_per_node")) + _env_launch_blocking(me, env))


def _env_deprecated(me: CheckSpec, env: dict[str, str]) -> list[Finding]:
    """Deprecated c10d/NCCL variable names, and the new names to use."""
    out: list[Finding] = []
    # deprecated names
    dep = envreview.deprecated(env)
    if dep:
        cmds, rows = [], []
        for d in dep:
            if not d["ignored"]:
                cmds.append(f"export {d['new']}={shlex.quote(d['value'])}")
            cmds.append(f"unset {d['old']}")
            rows.append([d["old"], d["value"], d["new"], d["new_value"] if d["new_value"] is not None else "unset",
                         "ignored (the new name wins)" if d["ignored"] else "read, with a deprecation warning"])
        out.append(Finding(
            id=me.id("deprecated"), status="warn",
            title=f"Deprecated NCCL variable {noun_for(len(dep), 'name')}: " + ", ".join(d["old"] for d in dep),
            detail="torch renamed these c10d variables (TORCH_ prefix, since torch 2.2); the old names still work "
                   "when the new one is unset but print a deprecation warning, and are ignored when both are set. "
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING: 0 no handling, 1 tear down the process on a collective "
                   "error or timeout, 2 clean up only, 3 skip clean-up (the default; torchrun sets 1).",
            evidence=[Evidence.of_table("Deprecated variables", ["old name", "value", "new name", "new value",
                                                                  "effect"], rows)],
            remedies=[Remedy(title="Use the new names", commands=cmds, verified=None)]))
    else:
        out.append(Finding(id=me.id("deprecated"), status="ok", title="No deprecated NCCL variable names",
                           detail="None of " + ", ".join(envreview.DEPRECATED) + " is set."))
    return out


def _env_nccl_debug(me: CheckSpec, env: dict[str, str]) -> list[Finding]:
    """NCCL_DEBUG: whether a hang or NCCL failure would say where."""
    out: list[Finding] = []
    # NCCL_DEBUG
    nd = envreview.nccl_debug(env)
    rem = []
    if nd["value"] is None or nd["status"] == "warn":
        rem.append(Remedy(title="When a run hangs or fails in NCCL: make it say where",
                          commands=["export NCCL_DEBUG=INFO", "export NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH"],
                          undo=["unset NCCL_DEBUG NCCL_DEBUG_SUBSYS"], verified=None,
                          explanation="Logs each rank's NCCL version, transports, network interfaces and rings at "
                                      "start. For a hang, compare the ranks' last lines, and look at the stuck "
                                      "processes themselves (zdoctor's hangs checks)."))
    out.append(Finding(id=me.id("nccl-debug"), status=nd["status"],
                       title="NCCL_DEBUG " + (f"= {nd['value']}" if nd["value"] else "not set"), detail=nd["text"],
                       remedies=rem))
    return out


def _env_p2p(me: CheckSpec, env: dict[str, str], gpus: list[dict[str, Any]] | None, facts: Facts) -> list[Finding]:
    """NCCL peer-to-peer against the GPU models (consumer boards hang with it on)."""
    out: list[Finding] = []
    # peer-to-peer
    if gpus is None:
        out.append(me.not_checked("the GPU models are unknown: " + facts.why_not("nvml"), sub="p2p",
                                   part="NCCL peer-to-peer setting for these GPUs"))
    else:
        pp = envreview.p2p(env, [g.get("name") or "" for g in gpus])
        rem = []
        if pp["status"] == "warn" and pp["consumer"]:
            rem.append(Remedy(title="Disable NCCL peer-to-peer (if a collective hangs)",
                              commands=["export NCCL_P2P_DISABLE=1"], undo=["unset NCCL_P2P_DISABLE"], verified=None))
        elif pp["status"] == "warn":
            rem.append(Remedy(title="Let NCCL use peer-to-peer again", commands=["unset NCCL_P2P_DISABLE"],
                              undo=["export NCCL_P2P_DISABLE=1"], verified=None))
        kinds = [[str(x["index"]), x.get("name") or "?",
                  "consumer" if envreview.is_consumer(x.get("name")) else "datacenter/workstation"] for x in gpus]
        kinds.append(["NCCL_P2P_DISABLE", env.get("NCCL_P2P_DISABLE", "unset"), "-"])
        p2p_ev = [Evidence.of_table("GPUs and peer-to-peer", ["GPU", "name", "kind"], kinds)]
        out.append(Finding(id=me.id("p2p"), status=pp["status"], evidence=p2p_ev,
                           title="NCCL peer-to-peer: " + ("risk of hangs on consumer GPUs" if pp["status"] == "warn"
                                                         and pp["consumer"] else "disabled on datacenter GPUs"
                                                         if pp["status"] == "warn" else "nothing to change"),
                           detail=pp["text"], remedies=rem))
    return out


def _env_visible_devices(me: CheckSpec, env: dict[str, str], gpus: list[dict[str, Any]] | None,
                         want: Any) -> list[Finding]:
    """CUDA_VISIBLE_DEVICES against the GPUs present and the GPUs per node the job expects."""
    out: list[Finding] = []
    # CUDA_VISIBLE_DEVICES
    vd = envreview.visible_devices(env.get("CUDA_VISIBLE_DEVICES"), gpus)
    rem = []
    lines = [vd["text"]]
    status = vd["status"]
    if gpus is not None and isinstance(want, int) and vd["status"] in ("ok", "warn"):
        n_vis = len(vd["visible"]) if vd["visible"] is not None else len(gpus)
        if want > n_vis:
            status = "fail" if status == "ok" else status
            lines.append(f"The job expects {count_of(want, 'GPU')} per node but only {n_vis} "
                         f"{noun_for(n_vis, 'is', 'are')} visible here.")
    if status in ("warn", "fail") and gpus:
        rem.append(Remedy(title="Show every GPU of the node to the training", commands=["unset CUDA_VISIBLE_DEVICES"],
                          verified=None, explanation="Or list valid indices (0-" f"{len(gpus) - 1}) or GPU UUIDs "
                                                     "only; `nvidia-smi -L` prints both."))
    vis_ev = []
    if vd["set"] and gpus is not None:
        rows: list[list[str]] = []
        hl = []
        cut = False
        for e in vd["entries"]:
            bad = vd["invalid"] is not None and e == vd["invalid"]["entry"] and not cut
            if bad:
                hl.append(len(rows))
            rows.append([e, vd["invalid"]["why"] if bad else "dropped (after the invalid entry)" if cut
                         else "visible"])
            cut = cut or bad
        rows += [[f"GPU {x['index']}", f"{x.get('name')} {x.get('uuid') or ''}".strip()] for x in gpus]
        vis_ev = [Evidence.of_table("CUDA_VISIBLE_DEVICES vs the GPUs present",
                                    ["entry / GPU", "what CUDA makes of it"], rows, hl)]
    if vd["status"] == "skip" and status == "skip":
        out.append(me.not_checked(vd["text"], sub="visible-devices", part="CUDA_VISIBLE_DEVICES"))
    else:
        out.append(Finding(id=me.id("visible-devices"), status=status, evidence=vis_ev,
                           title="CUDA_VISIBLE_DEVICES "
                           + ("not set" if not vd["set"] else f"= {env.get('CUDA_VISIBLE_DEVICES')!r}")
                           + ("" if status == "ok" else ": GPUs missing"), detail="\n".join(lines), remedies=rem))
    return out


def _env_launch_blocking(me: CheckSpec, env: dict[str, str]) -> list[Finding]:
    """CUDA_LAUNCH_BLOCKING left on (a debugging switch that slows training)."""
    out: list[Finding] = []
    if env.get("CUDA_LAUNCH_BLOCKING", "0").strip() not in ("", "0"):
        out.append(Finding(id=me.id("launch-blocking"), status="warn", title="CUDA_LAUNCH_BLOCKING is set",
                           detail="Every CUDA kernel launch waits for the kernel to finish: a debugging switch that "
                                  "makes errors point at the right line, and makes training much slower.",
                           remedies=[Remedy(title="Turn synchronous launches off",
                                            commands=["unset CUDA_LAUNCH_BLOCKING"], verified=None)]))
    return out
