"""Checks and predicates of the GPU stack: driver and GPUs, driver vs torch's CUDA runtime, nvcc vs torch
(DeepSpeed's rule), nvcc's host compiler, NCCL providers, the NCCL/CUDA environment and host limits.

Every check says what it could not check and why (a ``skip`` finding with the reason) instead of
guessing; every mismatch comes with a side-by-side table and remedies whose shell text is quoted.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from ..forensics.gccver import parse_torch_config, version_tuple
from ..gpu import cuda, envreview, kmod, limits, nvml
from ..gpu import nccl as ncclmod
from ..model import Evidence, Finding, Remedy
from ..plural import count_of
from ..registry import Facts, check, predicate
from ..shellquote import shell_quote
from ..symptoms.match import ids_for
from ..sysfile import LIMITS_D, create_file_remedy, free_name
from ..target import DEFAULT_PYTHON
from . import evaluate_check, not_checked

#: A driver branch that supports every CUDA 12.x and 13.0 runtime.
DRIVER_BRANCH = "580"
HOT_C = 85
IDLE_UTIL = 10


# -- facts access -------------------------------------------------------------------------------------


def _result_facts(facts: Facts, name: str) -> dict[str, Any] | None:
    """Facts of a probe that ran (``ok``) or skipped with a reason (``skip``); None otherwise."""
    res = facts.get(name)
    if res is None or res.status not in ("ok", "skip"):
        return None
    return res.facts








def _gpus(facts: Facts) -> list[dict[str, Any]] | None:
    """The GPUs the nvml probe found (None when it found none or did not run)."""
    f = facts.of("nvml")
    return list(f.get("gpus") or []) if f and f.get("count") else None


def _python(facts: Facts) -> str:
    py = facts.of("pyenv") or {}
    return (py.get("target") or {}).get("resolved") or (py.get("python") or {}).get("executable") or DEFAULT_PYTHON


def _pip(facts: Facts, *args: str) -> str:
    return " ".join([shell_quote(_python(facts)), "-m", "pip", *(shlex.quote(a) for a in args)])


def torch_cuda(facts: Facts) -> dict[str, Any]:
    """What torch says about CUDA: ``state`` (ok | missing | cpu | rocm | import_failed | unknown),
    ``cuda`` (torch.version.cuda or guessed from the +cuXYZ wheel tag), ``runtime`` (torch's config
    "CUDA Runtime"), ``source``, ``version``, ``available``, ``why``."""
    py = facts.of("pyenv")
    out: dict[str, Any] = {"state": "unknown", "cuda": None, "runtime": None, "source": None, "version": None,
                           "available": None, "why": None}
    if py is None:
        out["why"] = facts.why_not("pyenv")
        return out
    if py.get("error"):
        out["why"] = f"the training interpreter could not be probed: {py['error']}"
        return out
    torch = py.get("torch") or {}
    where = (py.get("target") or {}).get("resolved") or "the training interpreter"
    if not torch.get("installed"):
        out.update(state="missing", why=f"torch is not installed in {where}")
        return out
    imp = (torch.get("import") or {}).get("state")
    out["version"] = torch.get("version") or torch.get("dist_version")
    if imp != "ok":
        tag = (torch.get("dist_version") or "").partition("+")[2]
        if tag.startswith("cu") and tag[2:].isdigit() and len(tag) >= 4:
            out.update(state="import_failed", cuda=wheel_tag_cuda(tag), source=f"wheel tag +{tag}")
        else:
            out.update(state="import_failed")
        out["why"] = f"import torch failed in {where} ({imp})"
        return out
    if torch.get("hip"):
        out.update(state="rocm", why=f"torch {out['version']} is a ROCm build (HIP {torch['hip']})")
        return out
    if not torch.get("cuda"):
        out.update(state="cpu", why=f"torch {out['version']} is a CPU build (torch.version.cuda is None)")
        return out
    out.update(state="ok", cuda=str(torch["cuda"]), source="torch.version.cuda",
               runtime=parse_torch_config(torch.get("config")).get("cuda_runtime"),
               available=(torch.get("cuda_check") or {}).get("available"),
               init_error=(torch.get("cuda_check") or {}).get("init_error"))
    return out


def wheel_tag_cuda(tag: str) -> str:
    """``cu130`` -> ``13.0``, ``cu92`` -> ``9.2``, ``cu1210`` -> ``12.10``: a two-digit major from CUDA 10 on,
    and a minor that may have two digits."""
    digits = tag[2:]
    major, minor = (digits[:-1], digits[-1]) if len(digits) <= 3 else (digits[:2], digits[2:])
    return f"{int(major)}.{int(minor)}"


def _deepspeed(facts: Facts) -> dict[str, Any]:
    py = facts.of("pyenv") or {}
    return py.get("deepspeed") or {}


# -- gpu.driver -----------------------------------------------------------------------------------------


@check("gpu.driver", title="NVIDIA driver and GPUs", probes=("nvml",),
       explains=("driver-mismatch", "xid", "cuda-error"))
def check_driver(facts: Facts) -> list[Finding]:
    fid = "gpu.driver"
    nv = _result_facts(facts, "nvml")
    ev = facts.evidence("nvml")
    if nv is not None and _driver_mismatch(nv):
        found = _mismatch_finding(nv, ev)
        # CUDA's 803 (cudaErrorSystemDriverMismatch) is the same mismatch seen from the runtime
        found.explains = ids_for(facts, "driver-mismatch") + ids_for(facts, "cuda-error", number="803")
        return [found]
    if nv is not None and (nv.get("library") or {}).get("error_kind") == "gpu_lost" and nv.get("skipped"):
        return [Finding(id=fid, status="fail", title="A GPU has fallen off the bus: NVML cannot start",
                        detail=f"{(nv.get('library') or {}).get('error')}. No CUDA program can use the node's "
                               "GPUs until the lost GPU is reset or the node rebooted; `dmesg | grep -i xid` "
                               "shows the Xid error (79: fallen off the bus) and when it happened.",
                        evidence=ev, remedies=[_reboot_remedy()])]
    if nv is None or nv.get("skipped"):
        why = (nv or {}).get("skipped") or facts.why_not("nvml")
        return [not_checked(fid, "NVIDIA driver and GPUs", why + ". The GPU checks that need the driver are skipped.",
                      ev)]
    gpus = nv.get("gpus") or []
    lost = unreachable_gpus(gpus)
    names: dict[str, int] = {}
    for g in gpus:
        if g in lost:
            continue
        names[g.get("name") or "?"] = names.get(g.get("name") or "?", 0) + 1
    title = (f"NVIDIA driver {nv.get('driver') or '?'} (CUDA up to {nv.get('cuda_driver_version') or '?'}), "
             f"{count_of(len(gpus), 'GPU')}: " + ", ".join([f"{n}x {k}" for k, n in names.items()]
                                                          + ([f"{len(lost)} unreachable"] if lost else [])))
    lines = [f"Source: {nv.get('source')}."]
    status = "ok"
    remedies: list[Remedy] = []
    if lost:
        status = "fail"
        title = f"GPU {', '.join(str(g['index']) for g in lost)} cannot be reached through the driver; {title}"
        for g in lost:
            lines.append(f"GPU {g['index']}: {gpu_error(g)}: NVML has no working handle for it, so nothing about "
                         "it is known and CUDA cannot use it ('GPU is lost' means it fell off the PCIe bus: "
                         "`dmesg | grep -i xid` shows Xid 79).")
        remedies = [_reset_remedy(lost), _reboot_remedy()]
    smi = nv.get("smi") or {}
    if nv.get("source") == "nvidia-smi":
        status = "warn"
        lines.append(f"NVML could not be used from zdoctor ({(nv.get('library') or {}).get('error')}); these facts "
                     "come from nvidia-smi.")
    if smi.get("disagree"):
        status = "warn"
        lines.append("nvidia-smi and NVML disagree: " + "; ".join(smi["disagree"]))
    elif smi.get("ran") and not smi.get("error"):
        lines.append("nvidia-smi agrees with NVML (driver, CUDA version, GPU count and UUIDs).")
    elif smi.get("error"):
        lines.append(f"nvidia-smi cross-check not possible: {smi['error']}.")
    bad = [g for g in gpus if g.get("errors") and g not in lost]
    for g in bad:
        lines.append(f"GPU {g['index']}: NVML errors (those fields are unknown): "
                     + "; ".join(f"{k}: {v}" for k, v in g["errors"].items()))
    ns = sorted({f for g in gpus for f in g.get("not_supported") or []})
    if ns:
        lines.append("Not supported by this GPU/driver (shown as n/a): " + ", ".join(ns) + ".")
    return [Finding(id=fid, status=status, title=title, detail="\n".join(lines), evidence=ev, remedies=remedies,
                    explains=ids_for(facts, "xid", xid="79") if lost else [])]


#: NVML answers on a GPU that mean the GPU itself is gone, whatever field was asked.
LOST_WORDS = ("GPU is lost", "GPU requires restart")


def unreachable_gpus(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPUs NVML gave no handle for, or answered 'GPU is lost' / 'requires restart' on."""
    return [g for g in gpus if "handle" in (g.get("errors") or {})
            or any(w in str(v) for v in (g.get("errors") or {}).values() for w in LOST_WORDS)]


def gpu_error(g: dict[str, Any]) -> str:
    errs = g.get("errors") or {}
    return f"handle: {errs['handle']}" if "handle" in errs else "; ".join(f"{k}: {v}" for k, v in errs.items())


def _reboot_remedy() -> Remedy:
    return Remedy(title="Drain the node and reboot it", commands=["systemctl reboot"], requires_root=True,
                  note="not tried: it stops every process on the node",
                  explanation="Move the jobs off the node first. A reboot loads the kernel module that matches the "
                              "installed driver and re-initialises every GPU.")


def _driver_mismatch(nv: dict[str, Any]) -> bool:
    return (nv.get("library") or {}).get("error_kind") == "driver_mismatch" \
        or kmod.MISMATCH_TEXT in str((nv.get("smi") or {}).get("error") or "")


def _mismatch_finding(nv: dict[str, Any], ev: list[Evidence]) -> Finding:
    """The loaded kernel module is another release than the user-space libraries: nothing CUDA starts."""
    km = nv.get("kernel_module") or {}
    kv, lv = km.get("kernel_version"), km.get("library_version")
    rows = [["loaded kernel module (nvidia)", "/sys/module/nvidia/version, /proc/driver/nvidia/version",
             kv or "unknown"],
            ["user-space library", km.get("library") or "libnvidia-ml.so.1 (not found in ld.so.cache)",
             lv or "unknown"],
            ["NVML", "nvmlInit", (nv.get("library") or {}).get("error") or "-"],
            ["nvidia-smi", (nv.get("smi") or {}).get("path") or "-", (nv.get("smi") or {}).get("error") or "-"]]
    evidence = [Evidence.of_table("NVIDIA kernel module vs user-space driver", ["what", "from", "value"], rows,
                                  [0, 1])] + list(ev)
    versions = f" (kernel module {kv}, libraries {lv})" if kv and lv and kv != lv else ""
    order = km.get("unload_order")
    remedies = []
    if order:
        remedies.append(Remedy(
            title="Reload the NVIDIA kernel modules (no reboot)",
            commands=["fuser -v /dev/nvidia* || true",
                      "systemctl stop nvidia-persistenced nvidia-fabricmanager 2>/dev/null || true",
                      "modprobe -r " + " ".join(shlex.quote(m) for m in order),
                      "modprobe nvidia", "nvidia-smi"],
            requires_root=True, note="not tried: it needs root and every process on the GPUs stopped",
            explanation="The first line lists the processes that hold a GPU: stop them (training, nvidia-smi "
                        "loops, monitoring agents) or the unload fails with 'Module nvidia is in use'. The "
                        "modules are removed users first (" + " -> ".join(order) + ", as /proc/modules lists "
                        "them); loading nvidia again loads the installed release. With a desktop on the "
                        "GPU (nvidia_drm in use by the display server), reboot instead. Restart the services "
                        "stopped above afterwards."))
    remedies.append(_reboot_remedy())
    mods = ("Loaded NVIDIA modules: " + ", ".join(order) + ".") if order else \
        f"The loaded modules are unknown: {km.get('modules_error') or 'not read'}."
    return Finding(
        id="gpu.driver", status="fail",
        title="NVIDIA kernel module and driver libraries differ: Driver/library version mismatch" + versions,
        detail="The NVIDIA kernel module in memory is another release than the user-space driver libraries on "
               "disk: the driver was upgraded and the old module is still loaded. NVML and nvidia-smi refuse "
               "to start ('Failed to initialize NVML: Driver/library version mismatch') and CUDA fails the "
               "same way, so no GPU can be used until the new module is loaded. " + mods,
        evidence=evidence, remedies=remedies)


# -- gpu.pcie -------------------------------------------------------------------------------------------


def _load(g: dict[str, Any]) -> str:
    """``busy``, ``idle`` or ``unknown load`` (sampled utilisation first, then the snapshot's)."""
    s = g.get("sample") or {}
    util = s.get("util_max") if s.get("util_max") is not None else (g.get("utilization") or {}).get("gpu")
    if util is not None and util >= IDLE_UTIL:
        return "busy"
    if util is not None or "gpu_idle" in ((g.get("throttle") or {}).get("reasons") or []):
        return "idle"
    return "unknown load"


@check("gpu.pcie", title="PCIe links of the GPUs", probes=("nvml",))
def check_pcie(facts: Facts) -> list[Finding]:
    fid = "gpu.pcie"
    gpus = _gpus(facts)
    if gpus is None:
        return [not_checked(fid, "PCIe links", facts.why_not("nvml"))]
    rows, highlight, narrow, slow_busy, slow_idle, unknown = [], [], [], [], [], []
    for g in gpus:
        p = g.get("pcie") or {}
        s = g.get("sample") or {}
        util = (g.get("utilization") or {}).get("gpu")
        state = _load(g)
        note = "at maximum"
        if None in (p.get("gen"), p.get("gen_max"), p.get("width"), p.get("width_max")):
            unknown.append(g["index"])
            note = "not reported"
        else:
            gen = s.get("pcie_gen_max") if state == "busy" and s.get("pcie_gen_max") else p["gen"]
            if p["width"] < p["width_max"]:
                narrow.append(g)
                note = f"width x{p['width']} of x{p['width_max']}"
            if gen < p["gen_max"]:
                (slow_busy if state == "busy" else slow_idle).append(g)
                note = (note + "; " if note != "at maximum" else "") + f"Gen{gen} of Gen{p['gen_max']} while {state}"
        if note not in ("at maximum", "not reported"):
            highlight.append(len(rows))
        rows.append([str(g["index"]), g.get("name") or "?", f"Gen{p.get('gen')} x{p.get('width')}",
                     f"Gen{p.get('gen_max')} x{p.get('width_max')}",
                     "n/a" if util is None else f"{util}%" + (f" (max {s['util_max']}% over {s['seconds']:g} s)"
                                                              if s.get("util_max") is not None else ""), note])
    ev = [Evidence.of_table("PCIe link per GPU: now vs maximum", ["#", "GPU", "now", "maximum", "utilisation",
                                                                   "verdict"], rows, highlight)]
    sampled = any(g.get("sample") for g in gpus)
    how = ("Re-check while training runs: `zdoctor check --gpu-sample 10` samples for 10 s, or watch "
           "`nvidia-smi --query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
           "utilization.gpu --format=csv -l 1`.")
    lines = []
    status = "ok"
    if narrow:
        status = "warn"
        lines.append("Link width below the maximum on GPU " + ", ".join(str(g["index"]) for g in narrow) + ": "
                     "the width does not drop to save power the way the generation does; a narrower link means the "
                     "card trained down (seated in a narrower or shared slot, a riser, bifurcation, a bad "
                     "contact). Each halving halves host<->GPU bandwidth, which ZeRO-Offload lives on.")
    if slow_busy:
        status = "warn"
        lines.append("Link generation below the maximum while the GPU is busy on GPU "
                     + ", ".join(str(g["index"]) for g in slow_busy) + ": each generation down halves the "
                     "bandwidth (Gen1 x16 is about 4 GB/s, Gen4 x16 about 32 GB/s). Check BIOS PCIe settings and "
                     "reseat the card.")
    if slow_idle:
        lines.append("Link generation below the maximum on GPU " + ", ".join(str(g["index"]) for g in slow_idle)
                     + ", idle (or of unknown load): idle GPUs lower the link generation to save power, so this "
                       "proves nothing. " + how)
    if unknown:
        lines.append("PCIe link not reported for GPU " + ", ".join(str(i) for i in unknown) + ".")
    if status == "ok" and not slow_idle:
        lines.append("Every link runs at its maximum generation and width"
                     + (" (sampled under the current load)." if sampled else "."))
    title = {"ok": "PCIe links at their maximum" if not slow_idle else
             "PCIe links: widths at maximum; generation lower only while idle (power saving)",
             "warn": "PCIe link below its maximum: host<->GPU transfers are slower"}[status]
    return [Finding(id=fid, status=status, title=title, detail="\n".join(lines), evidence=ev)]


# -- gpu.health -----------------------------------------------------------------------------------------


def _reset_remedy(gpus: list[dict[str, Any]]) -> Remedy:
    idx = ",".join(str(g["index"]) for g in gpus)
    return Remedy(title="Drain the node, then reset the GPU(s)", commands=[f"nvidia-smi -r -i {idx}"],
                  requires_root=True, verified=None,
                  explanation="A GPU reset needs every process on the GPU stopped (and persistence daemons "
                              "that hold it). Move jobs off the node first; if the reset fails or errors come "
                              "back, the GPU needs a reboot or an RMA.")


@check("gpu.health", title="GPU health: ECC, clocks, persistence, processes", probes=("nvml",),
       findings=("gpu.health.compute-mode", "gpu.health.ecc", "gpu.health.persistence", "gpu.health.processes",
                 "gpu.health.reachable", "gpu.health.throttle"))
def check_health(facts: Facts) -> list[Finding]:
    gpus = _gpus(facts)
    if gpus is None:
        return [not_checked("gpu.health", "GPU health", facts.why_not("nvml"))]
    lost = unreachable_gpus(gpus)
    out: list[Finding] = []
    if lost:
        out.append(Finding(id="gpu.health.reachable", status="fail",
                           title="GPU " + ", ".join(str(g["index"]) for g in lost) + " unreachable: its health "
                                 "is unknown and CUDA cannot use it",
                           detail="\n".join(f"GPU {g['index']}: {gpu_error(g)}" for g in lost)
                                  + "\nThe health checks below cover only the GPUs NVML could read.",
                           remedies=[_reset_remedy(lost), _reboot_remedy()]))
    gpus = [g for g in gpus if g not in lost]
    if not gpus:
        return out
    return out + [_ecc(gpus), _throttle(gpus), _persistence(gpus), _processes(gpus), _compute_mode(gpus)]


def _ecc(gpus: list[dict[str, Any]]) -> Finding:
    fid = "gpu.health.ecc"
    rows, hl, fail, warn = [], [], [], []
    for g in gpus:
        e = g.get("ecc") or {}
        why = []
        if (e.get("volatile_uncorrected") or 0) > 0:
            why.append(f"{e['volatile_uncorrected']} uncorrectable since the driver loaded")
            fail.append(g)
        if e.get("remap_failure"):
            why.append("row remapping failed")
            fail.append(g)
        if e.get("remap_pending"):
            why.append("row remapping pending (applied at the next GPU reset)")
            warn.append(g)
        if (e.get("aggregate_uncorrected") or 0) > 0 and not (e.get("volatile_uncorrected") or 0):
            why.append(f"{e['aggregate_uncorrected']} uncorrectable in the GPU's lifetime")
            warn.append(g)
        if e.get("current") is not None and e.get("pending") is not None and e["current"] != e["pending"]:
            why.append(f"ECC mode changes to {'on' if e['pending'] else 'off'} at the next reboot")
            warn.append(g)
        if why:
            hl.append(len(rows))
        mode = "on" if e.get("current") else "off" if e.get("current") is False else "n/a"
        rows.append([str(g["index"]), g.get("name") or "?", mode, _n(e.get("volatile_uncorrected")),
                     _n(e.get("volatile_corrected")), _n(e.get("aggregate_uncorrected")), "; ".join(why) or "-"])
    ev = [Evidence.of_table("ECC per GPU", ["#", "GPU", "ECC", "uncorrected (volatile)", "corrected (volatile)",
                                             "uncorrected (lifetime)", "note"], rows, hl)]
    if fail:
        bad = _unique(fail)
        return Finding(id=fid, status="fail", title="Uncorrectable GPU memory errors on GPU "
                       + ", ".join(str(g["index"]) for g in bad),
                       detail="An uncorrectable ECC error means data in GPU memory was lost: CUDA calls on that GPU "
                              "fail with 'uncorrectable ECC error encountered' and training results cannot be "
                              "trusted. This is hardware, not configuration.", evidence=ev,
                       remedies=[_reset_remedy(bad)])
    if warn:
        return Finding(id=fid, status="warn", title="GPU memory (ECC) needs attention on GPU "
                       + ", ".join(str(g["index"]) for g in _unique(warn)),
                       detail="See the notes in the table: pending row remapping and ECC mode changes take effect "
                              "only after a GPU reset or reboot; lifetime uncorrectable errors mean the GPU had "
                              "trouble before.", evidence=ev, remedies=[_reset_remedy(_unique(warn))])
    off = [g for g in gpus if (g.get("ecc") or {}).get("current") is False]
    detail = "No uncorrectable ECC errors."
    if off:
        detail += (" ECC is off on GPU " + ", ".join(str(g["index"]) for g in off) + " (normal on consumer cards; on "
                   "datacenter GPUs it trades error detection for a little more memory).")
    return Finding(id=fid, status="ok", title="GPU memory: no uncorrectable ECC errors", detail=detail, evidence=ev)


def _n(v: Any) -> str:
    return "n/a" if v is None else str(v)


def _unique(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for g in gpus:
        seen.setdefault(g["index"], g)
    return [seen[k] for k in sorted(seen)]


def _throttle(gpus: list[dict[str, Any]]) -> Finding:
    fid = "gpu.health.throttle"
    rows, hl, bad = [], [], []
    for g in gpus:
        reasons = (g.get("throttle") or {}).get("reasons") or []
        worst = [r for r in reasons if nvml.reason_severity(r) == "bad"]
        hot = g.get("temperature_c") is not None and g["temperature_c"] >= HOT_C
        if worst or hot:
            bad.append(g)
            hl.append(len(rows))
        rows.append([str(g["index"]), g.get("name") or "?", _n(g.get("temperature_c")),
                     f"{_n(g.get('power_w'))} / {_n(g.get('power_limit_w'))} W",
                     "; ".join(f"{r}: {nvml.reason_text(r)}" for r in reasons) or "none"])
    ev = [Evidence.of_table("Clock event (throttle) reasons", ["#", "GPU", "temp (C)", "power / limit",
                                                               "active reasons"], rows, hl)]
    if bad:
        return Finding(id=fid, status="warn", title="GPU clocks held down by heat or power on GPU "
                       + ", ".join(str(g["index"]) for g in bad),
                       detail="Thermal or hardware slowdowns lower the clocks of the whole GPU: every step of the "
                              "training runs slower, and one slow GPU holds back all ranks at each collective. "
                              "Check the cooling (fans, airflow, inlet temperature) and the power supply; "
                              "`nvidia-smi -q -d PERFORMANCE` shows the counters.", evidence=ev)
    return Finding(id=fid, status="ok", title="No thermal or hardware clock slowdowns",
                   detail="Idle and power-cap reasons are normal (a GPU at full load sits at its power cap).",
                   evidence=ev)


def _persistence(gpus: list[dict[str, Any]]) -> Finding:
    fid = "gpu.health.persistence"
    off = [g for g in gpus if g.get("persistence") is False]
    if not off:
        known = any(g.get("persistence") is not None for g in gpus)
        return Finding(id=fid, status="ok" if known else "skip",
                       title="Persistence mode on" if known else "Persistence mode: not reported",
                       detail="The driver keeps the GPUs initialised between processes." if known else
                       "NVML did not report persistence mode for these GPUs.")
    return Finding(
        id=fid, status="warn", title="Persistence mode off on GPU " + ", ".join(str(g["index"]) for g in off),
        detail="Without persistence mode the driver tears the GPU state down whenever no process uses it, and the "
               "next CUDA start (each rank of every launch, and every nvidia-smi) pays seconds per GPU to bring it "
               "back. On 8-GPU nodes this adds up and can trip launch timeouts.",
        remedies=[Remedy(title="Turn persistence on (until reboot)", commands=["nvidia-smi -pm 1"], requires_root=True,
                         undo=["nvidia-smi -pm 0"],
                         explanation="For a setting that survives reboots, enable NVIDIA's daemon instead: "
                                     "`systemctl enable --now nvidia-persistenced`.")])


def _processes(gpus: list[dict[str, Any]]) -> Finding:
    fid = "gpu.health.processes"
    rows, procs = [], []
    for g in gpus:
        for p in g.get("processes") or []:
            procs.append(p)
            rows.append([str(g["index"]), str(p.get("pid")), p.get("name") or "(not visible here)",
                         limits.human(p.get("used_bytes")), p.get("type") or "?"])
    if not procs:
        return Finding(id=fid, status="ok", title="No process holds a GPU",
                       detail="NVML lists no compute or graphics process on any GPU.")
    pids = sorted({p["pid"] for p in procs if isinstance(p.get("pid"), int)})
    ev = [Evidence.of_table("Processes on the GPUs", ["GPU", "pid", "name", "memory", "type"], rows)]
    return Finding(
        id=fid, status="warn", title=f"{count_of(len(pids), 'process')} hold{'s' if len(pids) == 1 else ''} GPU memory",
        detail="Memory held by another process is not available to the training: a leftover rank of a killed "
               "run is the usual culprit, and the next launch fails with CUDA out of memory or hangs waiting for "
               "peers. If this node runs the training right now, these may be its own ranks. A pid shown as "
               "'not visible here' lives in another PID namespace (another container).",
        evidence=ev,
        remedies=[Remedy(title="Look at the processes, then stop the leftovers",
                         commands=[f"ps -o pid,user,etime,args -p {','.join(str(p) for p in pids)}"]
                         + [f"kill {p}" for p in pids], verified=None,
                         explanation="Stop only processes that are leftovers of your own runs; `kill` sends "
                                     "SIGTERM, `kill -9` is for processes that ignore it.")])


def _compute_mode(gpus: list[dict[str, Any]]) -> Finding:
    fid = "gpu.health.compute-mode"
    prohibited = [g for g in gpus if g.get("compute_mode") == "prohibited"]
    exclusive = [g for g in gpus if g.get("compute_mode") in ("exclusive_process", "exclusive_thread")]
    if prohibited:
        return Finding(id=fid, status="fail", title="Compute prohibited on GPU "
                       + ", ".join(str(g["index"]) for g in prohibited),
                       detail="No process can create a CUDA context on these GPUs (compute mode PROHIBITED): "
                              "torch sees them but every CUDA call fails with 'all CUDA-capable devices are busy "
                              "or unavailable'.",
                       remedies=[Remedy(title="Back to the default compute mode",
                                        commands=[f"nvidia-smi -i {g['index']} -c DEFAULT" for g in prohibited],
                                        requires_root=True)])
    if exclusive:
        return Finding(id=fid, status="ok", title="GPU(s) in exclusive-process compute mode",
                       detail="Only one process at a time may use each of GPU "
                              + ", ".join(str(g["index"]) for g in exclusive)
                              + ": fine for one rank per GPU; a second process on the same GPU fails with "
                                "'all CUDA-capable devices are busy or unavailable'.")
    known = any(g.get("compute_mode") for g in gpus)
    return Finding(id=fid, status="ok" if known else "skip",
                   title="Compute mode default" if known else "Compute mode: not reported",
                   detail="Any process may use the GPUs." if known else "NVML did not report the compute mode.")


# -- gpu.runtime ----------------------------------------------------------------------------------------


def _wheel_remedy(facts: Facts, max_cuda: str | None) -> Remedy | None:
    wv = cuda.wheel_variant(max_cuda)
    if wv is None:
        return None
    return Remedy(
        title=f"Install a torch built for CUDA {wv['cuda']} (the newest this driver supports)",
        commands=[_pip(facts, "install", "--upgrade", "--force-reinstall", "torch", "--index-url", wv["index"])],
        verified=None,
        explanation=f"PyTorch publishes CUDA {wv['cuda']} wheels at {wv['index']}. Without a version pin pip "
                    "takes the newest torch that index has; to keep your torch release add `torch==X.Y.Z` if "
                    "that release was built for this CUDA. Reinstall torchvision/torchaudio from the same index, "
                    "and rebuild DeepSpeed's JIT ops afterwards (they are built per torch and CUDA version).")


def _driver_remedy(gpus: list[dict[str, Any]] | None = None) -> Remedy:
    from ..rules.drivers import driver_ceiling

    ceil = driver_ceiling([g.get("name") or "" for g in gpus or []])
    if ceil["branch"] is not None and ceil["branch"] < int(DRIVER_BRANCH):
        b = ceil["branch"]
        return Remedy(
            title=f"Upgrade the NVIDIA driver to the {b} branch, the last that supports {ceil['arch']} GPUs "
                  f"(CUDA up to {ceil['max_cuda'] or '?'})",
            commands=[f"apt-get install -y nvidia-driver-{b}"], requires_root=True, verified=None,
            explanation=f"Later branches ({DRIVER_BRANCH} included) dropped the {ceil['arch']} architecture: they "
                        f"would not drive this GPU. With the {b} branch torch must be built for CUDA "
                        f"{ceil['max_cuda'] or '(unknown)'} or older; a newer CUDA needs newer GPUs.")
    return Remedy(
        title=f"Upgrade the NVIDIA driver (branch {DRIVER_BRANCH} supports CUDA 12.x and 13.0)",
        commands=[f"apt-get install -y nvidia-driver-{DRIVER_BRANCH}"], requires_root=True, verified=None,
        explanation="Debian/Ubuntu package name shown; other distributions ship it as their NVIDIA driver package. "
                    "A reboot (or reloading the nvidia modules with no process on the GPUs) is needed. Datacenter "
                    "GPUs can instead run a newer CUDA on an older driver through NVIDIA's forward-compatibility "
                    "package (cuda-compat-<major>-<minor>), put first on LD_LIBRARY_PATH.")


@check("gpu.runtime", title="Driver's CUDA version vs torch's CUDA runtime", probes=("nvml", "pyenv"),
       explains=("cuda-error",))
def check_runtime(facts: Facts) -> list[Finding]:
    fid = "gpu.runtime"
    tc = torch_cuda(facts)
    nv = facts.of("nvml")
    gpus = _gpus(facts)
    drv_cuda = (nv or {}).get("cuda_driver_version")
    if tc["state"] in ("unknown", "missing", "rocm"):
        return [not_checked(fid, "Driver vs torch CUDA runtime", tc["why"] or "torch unknown")]
    if tc["state"] == "cpu":
        if gpus:
            rem = [r for r in [_wheel_remedy(facts, drv_cuda)] if r]
            return [Finding(id=fid, status="fail",
                            title=f"torch is a CPU build on a node with {count_of(len(gpus), 'GPU')}",
                            detail=f"{tc['why']}: DeepSpeed cannot use the GPUs ('DeepSpeed requires CUDA' / "
                                   "'Torch not compiled with CUDA enabled').", evidence=facts.evidence("nvml"),
                            remedies=rem)]
        return [not_checked(fid, "Driver vs torch CUDA runtime", f"{tc['why']}, and {facts.why_not('nvml')}")]
    if not tc["cuda"]:
        return [not_checked(fid, "Driver vs torch CUDA runtime",
                            f"{tc['why']}, and its wheel tag names no CUDA version")]
    if not drv_cuda:
        return [not_checked(fid, "Driver vs torch CUDA runtime",
                      f"torch is built for CUDA {tc['cuda'] or '?'}, but the driver's CUDA version is unknown: "
                      f"{facts.why_not('nvml')}")]
    v = cuda.driver_runtime_verdict(drv_cuda, tc["cuda"])
    rows = [["driver", "NVML nvmlSystemGetDriverVersion", nv.get("driver") or "?"],
            ["CUDA the driver supports", "nvmlSystemGetCudaDriverVersion_v2", v["driver"] or "?"],
            ["torch.version.cuda", tc["source"] or "-", tc["cuda"] or "?"],
            ["torch config 'CUDA Runtime'", "torch.__config__.show()", tc["runtime"] or "n/a"],
            ["torch.cuda.is_available()", "pyenv probe", _n(tc["available"])]]
    hl = [1, 2] if v["verdict"] in ("too_old", "minor") else []
    ev = [Evidence.of_table("CUDA: driver vs torch", ["what", "from", "value"], rows, hl)]
    drv_int = nv.get("cuda_driver")
    if v["verdict"] == "too_old":
        rem = [r for r in [_wheel_remedy(facts, drv_cuda), _driver_remedy(gpus)] if r]
        from ..rules.drivers import min_driver_pre11

        pre11 = min_driver_pre11(v["runtime"]) if v.get("no_minor_compat") else None
        return [Finding(
            id=fid, status="fail",
            title=f"torch needs CUDA {v['runtime']} but driver {nv.get('driver')} supports only CUDA {v['driver']}",
            detail=(f"Before CUDA 11 there is no minor-version compatibility: CUDA {v['runtime']} needs driver "
                    f">= {pre11 or '(unknown)'} (NVIDIA's table of CUDA releases and their drivers), whatever the "
                    "minor. " if v.get("no_minor_compat") else "") +
                   "A CUDA runtime newer than the driver supports cannot start: CUDA reports "
                   "'CUDA driver version is insufficient for CUDA runtime version' and torch says 'The NVIDIA "
                   f"driver on your system is too old (found version {drv_int})'; torch.cuda.is_available() is "
                   "False and DeepSpeed stops. Either install a torch built for the driver's CUDA, or upgrade the "
                   "driver.", evidence=ev, remedies=rem)]
    lines = []
    status = "ok"
    if v["verdict"] == "minor":
        status = "warn"
        major = cuda.parse_cuda(v["runtime"])[0]  # type: ignore[index]
        need = cuda.MIN_DRIVER_FOR_MAJOR.get(major)
        lines.append(f"torch's CUDA {v['runtime']} is newer than the driver's CUDA {v['driver']} within the same "
                     "major: it runs through CUDA minor-version compatibility (driver >= "
                     f"{need or '?'} for CUDA {major}.x), but kernels that must be JIT-compiled from newer PTX fail "
                     "with 'the provided PTX was compiled with an unsupported toolchain', and features of the newer "
                     "release are missing.")
        if need and version_tuple(nv.get("driver")) < version_tuple(need):
            status = "fail"
            lines.append(f"Driver {nv.get('driver')} is older than {need}, the minimum for CUDA {major}.x: CUDA "
                         "will not start.")
    else:
        lines.append(f"torch's CUDA {v['runtime']} runs on this driver (it supports CUDA up to {v['driver']}).")
    if tc["runtime"] and cuda.parse_cuda(tc["runtime"]) != cuda.parse_cuda(tc["cuda"]):
        lines.append(f"torch's config says 'CUDA Runtime {tc['runtime']}' while torch.version.cuda is {tc['cuda']}.")
    if tc["available"] is False and gpus and v["verdict"] == "ok":
        return [_cuda_start_failed(facts, tc, v, nv, ev)]
    if tc["available"] is False and gpus:
        lines.append("torch.cuda.is_available() returned False although the driver lists GPUs.")
    if tc["state"] == "import_failed":
        lines.append(f"{tc['why']}; the CUDA version comes from the {tc['source']}.")
    title = {"ok": f"torch's CUDA {v['runtime']} fits driver {nv.get('driver')} (CUDA {v['driver']})",
             "warn": f"torch's CUDA {v['runtime']} is newer than the driver's CUDA {v['driver']}",
             "fail": f"torch's CUDA {v['runtime']} cannot run on driver {nv.get('driver')}"}[status]
    rem = [r for r in [_wheel_remedy(facts, drv_cuda), _driver_remedy(gpus)] if r] if status != "ok" else []
    return [Finding(id=fid, status=status, title=title, detail="\n".join(lines), evidence=ev, remedies=rem)]


def _cuda_start_failed(facts: Facts, tc: dict[str, Any], v: dict[str, Any], nv: dict[str, Any],
                       ev: list[Evidence]) -> Finding:
    """CUDA does not start although torch's CUDA fits the driver: the versions are not the cause."""
    err = cuda.cuda_init_error(tc.get("init_error"))
    lines = [f"torch's CUDA {v['runtime']} runs on driver {nv.get('driver')} (it supports CUDA up to "
             f"{v['driver']}), so the versions are not the cause: the cause is elsewhere.",
             "torch.cuda.is_available() returned False although the driver lists the GPUs."]
    if err is None:
        lines.append("torch gave no error text (the probe recorded none), so the CUDA error number is unknown.")
        head = "CUDA error unknown"
    else:
        lines.append(f"torch said: {err['text']}")
        if err["code"] is not None:
            lines.append(f"CUDA error {err['code']}" + (f" ({err['name']}, '{err['message']}')" if err["name"] else "")
                         + (f": {err['meaning']}." if err["meaning"] else "."))
        head = f"CUDA error {err['code']}" if err["code"] is not None else "CUDA error (number not given)"
    lines.append("Also look at CUDA_VISIBLE_DEVICES (gpu.env.visible-devices) and the device nodes /dev/nvidia*.")
    return Finding(id="gpu.runtime", status="fail",
                   explains=ids_for(facts, "cuda-error", number=str(err["code"])) if err and err["code"] else [],
                   title=f"CUDA cannot start on driver {nv.get('driver')} ({head}); torch's CUDA {v['runtime']} fits "
                         f"the driver's CUDA {v['driver']}",
                   detail="\n".join(lines), evidence=ev + [Evidence.of_table(
                       "torch's CUDA start error (torch.cuda.is_available() / torch.cuda.init() in the pyenv probe)",
                       ["what", "value"],
                       [["text", (err or {}).get("text") or "none recorded"],
                        ["CUDA error number", _n((err or {}).get("code"))],
                        ["CUDA error name", (err or {}).get("name") or "unknown"]], [1])])


# -- gpu.toolkit ----------------------------------------------------------------------------------------


def _toolkit_for(cs: dict[str, Any], torch_cuda_v: str, env: dict[str, str],
                 installed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Installed toolkits (with headers) DeepSpeed would accept next to torch's CUDA; exact matches first."""
    good = []
    for t in cs.get("toolkits") or []:
        if not t.get("version") or not t.get("headers"):
            continue
        verdict = cuda.deepspeed_nvcc_rule(t["version"], torch_cuda_v, {}, installed)["verdict"]
        if verdict in ("match", "compatible"):
            good.append((0 if verdict == "match" else 1, t))
    return [t for _, t in sorted(good, key=lambda x: x[0])]


def _cuda_home_remedy(t: dict[str, Any]) -> Remedy:
    path = t["path"]
    return Remedy(title=f"Point CUDA_HOME at {path} (CUDA {t['version']})",
                  commands=[f"export CUDA_HOME={shell_quote(path)}",
                            f"export PATH={shell_quote(os.path.join(path, 'bin'))}:\"$PATH\""],
                  verified=None,
                  explanation="torch and DeepSpeed take $CUDA_HOME first, and run $CUDA_HOME/bin/nvcc. Put both "
                              "lines in the job's launch script; DeepSpeed rebuilds JIT ops when the toolkit changes.")


def _install_toolkit_remedy(torch_cuda_v: str, distro: dict[str, Any] | None) -> Remedy:
    ti = cuda.toolkit_install(torch_cuda_v, distro)
    return Remedy(title=f"Install the CUDA {cuda.cuda_str(torch_cuda_v)} toolkit ({ti['package']})",
                  commands=[ti["command"], f"export CUDA_HOME={shell_quote(ti['prefix'] or '/usr/local/cuda')}"],
                  requires_root=True, verified=None,
                  explanation="The package comes from NVIDIA's CUDA repository (developer.download.nvidia.com/compute/"
                              "cuda/repos), which must be configured; it installs next to other toolkits, without "
                              "touching the driver. In a conda env, `conda install -c nvidia cuda-toolkit` with a "
                              f"{cuda.cuda_str(torch_cuda_v)} version label works without root.")


def _installed_nvcc_rule(facts: Facts) -> dict[str, Any] | None:
    """The nvcc rule read from the installed DeepSpeed (dsrelease probe), when that probe ran."""
    from ..rules.deepspeed import CURRENT_READ_FROM, parse_version
    from .dsrelease import nvcc_rule_of_installed

    rule = nvcc_rule_of_installed(facts)
    if rule is None:
        ver = parse_version(_deepspeed(facts).get("version"))
        if ver is not None and ver >= CURRENT_READ_FROM:
            return {"state": "current", "skip_env": True}
    return rule


def _why_rule_unread(facts: Facts) -> str:
    rec = (facts.get_fact("dsrelease", "rules") or {}).get("nvcc-minor-tolerance") or {}
    return rec.get("why") or ("its files were not read" if "dsrelease" in facts else "the dsrelease probe did not run")


@check("gpu.toolkit", title="CUDA toolkit (nvcc) vs torch's CUDA", probes=("cuda_stack", "pyenv"),
       explains=("cuda-version-mismatch",),
       findings=("gpu.toolkit.cuda-home", "gpu.toolkit.nvcc-version"))
def check_toolkit(facts: Facts) -> list[Finding]:
    tc = torch_cuda(facts)
    cs = facts.of("cuda_stack")
    if cs is None:
        return [not_checked("gpu.toolkit", "CUDA toolkit", facts.why_not("cuda_stack"))]
    home, nv = cs.get("cuda_home") or {}, cs.get("nvcc") or {}
    found = f"(CUDA_HOME would be {home.get('path')}, nvcc {nv.get('release') or 'not run'})" if home.get("path") \
        else "(no CUDA toolkit found)"
    if tc["state"] not in ("ok", "import_failed") or not tc["cuda"]:
        return [not_checked("gpu.toolkit", "CUDA toolkit vs torch",
                            f"{tc['why'] or 'torch CUDA unknown'}: DeepSpeed builds "
                            f"no CUDA ops {found}", facts.evidence("cuda_stack"))]
    ds = _deepspeed(facts)
    env = {**(cs.get("env") or {})}
    ev = facts.evidence("cuda_stack")
    rows = [["CUDA_HOME", home.get("source") or "-", home.get("path") or "none"],
            ["nvcc release", nv.get("path") or "-", nv.get("release") or nv.get("error") or "-"],
            ["torch.version.cuda", tc["source"] or "-", tc["cuda"]],
            ["DeepSpeed", "pyenv probe",
             (ds.get("version") or "installed") if ds.get("installed") else "not installed"],
            ["DS_SKIP_CUDA_CHECK", "environment", env.get("DS_SKIP_CUDA_CHECK", "unset")]]
    installed_rule = _installed_nvcc_rule(facts)
    good = _toolkit_for(cs, tc["cuda"], env, installed_rule)
    out: list[Finding] = []
    uses = ("DeepSpeed JIT-builds its CUDA ops (fused_adam, fused_lamb, quantizer, transformer kernels ...) "
            "with this toolkit on first use; cpu_adam and async_io are C++ ops on current DeepSpeed releases and "
            "build without it (older releases ran the CUDA check for cpu_adam too).")
    prebuilt = ds.get("prebuilt_ops") or []
    if prebuilt:
        uses += f" {len(prebuilt)} op(s) were prebuilt at install time and need no toolkit."
    remedies = [_cuda_home_remedy(t) for t in good[:1]] + [_install_toolkit_remedy(tc["cuda"], cs.get("distro"))]
    # where the toolkit is
    fid = "gpu.toolkit.cuda-home"
    status = "warn"
    if not home.get("path"):
        out.append(Finding(id=fid, status=status, title="No CUDA toolkit: CUDA ops cannot be compiled",
                           detail=f"torch finds no CUDA_HOME ($CUDA_HOME, $CUDA_PATH, nvcc on PATH, /usr/local/cuda), "
                                  f"so DeepSpeed stops a CUDA op build with '{cuda.DS_MISSING_CUDA}' and torch with "
                                  "'CUDA was not found on the system'. " + uses,
                           evidence=ev, remedies=remedies))
    elif not nv.get("exists") or nv.get("error"):
        out.append(Finding(id=fid, status=status, title=f"CUDA_HOME={home['path']} has no working nvcc",
                           detail=f"CUDA_HOME comes from {home.get('source')}. DeepSpeed runs {nv.get('path')} -V and "
                                  f"fails with 'Unable to run {nv.get('path')}, unable to compile CUDA op(s)' "
                                  f"({nv.get('error')}): a runtime-only install has no compiler. " + uses,
                           evidence=ev, remedies=remedies))
    elif not home.get("headers"):
        out.append(Finding(id=fid, status=status,
                           title=f"CUDA_HOME={home['path']} has no CUDA headers (include/cuda_runtime.h)",
                           detail=f"CUDA_HOME comes from {home.get('source')}: torch takes two directories up from "
                                  "the first nvcc on PATH, which is wrong when that nvcc is a wrapper script or a "
                                  "symlink outside the toolkit. nvcc itself runs, but a CUDA op build includes "
                                  f"{home['path']}/include and fails with 'cuda_runtime.h: No such file or "
                                  "directory'. " + uses, evidence=ev, remedies=remedies))
    else:
        out.append(Finding(id=fid, status="ok", title=f"CUDA toolkit at {home['path']} ({home.get('source')})",
                           detail=f"nvcc {nv.get('release')} ({nv.get('build') or '?'}) and the CUDA headers "
                                  "are there.",
                           evidence=ev))
    # nvcc release vs torch
    fid = "gpu.toolkit.nvcc-version"
    if not nv.get("release"):
        out.append(not_checked(fid, "nvcc release vs torch", "no nvcc release to compare (see gpu.toolkit.cuda-home)"))
        return out
    ds_rule = cuda.deepspeed_nvcc_rule(nv["release"], tc["cuda"], env, installed_rule)
    t_rule = cuda.torch_nvcc_rule(nv["release"], tc["cuda"])
    rows += [["DeepSpeed's rule", "assert_no_cuda_mismatch", ds_rule["verdict"]],
             ["torch's rule", "cpp_extension._check_cuda_version", t_rule["verdict"]]]
    hl = [1, 2] if ds_rule["verdict"] in ("mismatch", "skipped") or t_rule["verdict"] == "mismatch" else []
    table = Evidence.of_table("nvcc vs torch", ["what", "from", "value"], rows, hl)
    lines = []
    if ds_rule["message"]:
        lines.append(f"DeepSpeed: {ds_rule['message']}")
    if t_rule["message"]:
        lines.append(f"torch: {t_rule['message']}")
    if ds_rule["verdict"] == "mismatch":
        status = "fail" if ds.get("installed") else "warn"
        title = f"nvcc {nv['release']} does not match torch's CUDA {tc['cuda']}: CUDA op builds fail"
        lines.append("DeepSpeed compares nvcc's major.minor with torch.version.cuda before building any CUDA op; "
                     + (f"DeepSpeed {ds.get('version') or ''} predates the minor-version table (DeepSpeed PR 1139, "
                        "June 2021): it accepts only the same major.minor. "
                        if ds_rule.get("rule") == "old" else
                        "only the same release, or two minors of one major in its compatibility list, pass. ") + uses)
        lines.append("DS_SKIP_CUDA_CHECK=1 silences the check but builds ops against the wrong toolkit: a last "
                     "resort, not a fix.")
        out.append(Finding(id=fid, status=status, title=title, detail="\n".join(lines), evidence=[table, *ev],
                           remedies=remedies, explains=ids_for(facts, "cuda-version-mismatch", nvcc=nv["release"],
                                                               torch=tc["cuda"])))
    elif ds_rule["verdict"] == "skipped":
        out.append(Finding(id=fid, status="warn", title=f"nvcc {nv['release']} vs torch's CUDA {tc['cuda']}: "
                           "mismatch allowed by DS_SKIP_CUDA_CHECK=1", detail="\n".join(lines), evidence=[table, *ev],
                           remedies=remedies))
    elif ds_rule["verdict"] == "compatible" and installed_rule is None and ds.get("installed"):
        lines.append(f"The installed DeepSpeed's own rule was not read ({_why_rule_unread(facts)}): releases before "
                     "DeepSpeed PR 1139 (June 2021) refuse any minor mismatch, and the table grew later (11.7 in "
                     "PR 2211): the current table accepts this pair; the installed release's is unknown.")
        out.append(Finding(id=fid, status="warn", title=f"nvcc {nv['release']} vs torch's CUDA {tc['cuda']}: "
                           "accepted by current DeepSpeed releases; the installed release's rule is unknown",
                           detail="\n".join(lines), evidence=[table], remedies=remedies))
    else:
        title = (f"nvcc {nv['release']} matches torch's CUDA {tc['cuda']}" if ds_rule["verdict"] == "match" else
                 f"nvcc {nv['release']} and torch's CUDA {tc['cuda']}: accepted as compatible by DeepSpeed "
                 f"{ds.get('version') or ''}".rstrip())
        out.append(Finding(id=fid, status="ok", title=title, detail="\n".join(lines) or "Same CUDA release.",
                           evidence=[table]))
    return out


# -- gpu.host-compiler ----------------------------------------------------------------------------------


def _compiler_remedy(cs: dict[str, Any], lo: int, hi: int) -> list[Remedy]:
    pairs = [c for c in cs.get("versioned_compilers") or [] if c.get("gcc") and c.get("gxx") and lo <= c["major"] <= hi]
    if pairs:
        c = pairs[-1]
        return [Remedy(title=f"Build CUDA ops with GCC {c['major']} (already installed)",
                       commands=[f"export CC={shell_quote(c['gcc'])}", f"export CXX={shell_quote(c['gxx'])}"],
                       undo=["unset CC CXX"], verified=None,
                       explanation="torch passes -ccbin $CC to nvcc and compiles C++ with $CXX. Set both in the job's "
                                   "launch script; JIT-built ops are rebuilt when the compiler changes.")]
    want = hi
    return [Remedy(title=f"Install GCC {want} next to the system compiler",
                   commands=[f"apt-get install -y gcc-{want} g++-{want}", f"export CC=/usr/bin/gcc-{want}",
                             f"export CXX=/usr/bin/g++-{want}"], requires_root=True, verified=None,
                   explanation="Debian/Ubuntu names shown (on RHEL use a gcc-toolset-N). As a last resort nvcc accepts "
                               "an unsupported compiler with NVCC_APPEND_FLAGS=-allow-unsupported-compiler, at the "
                               "risk of miscompiled kernels.")]


@check("gpu.host-compiler", title="Host compiler vs the GCC range nvcc supports",
       probes=("cuda_stack", "toolchain", "pyenv"))
def check_host_compiler(facts: Facts) -> list[Finding]:
    fid = "gpu.host-compiler"
    tc = torch_cuda(facts)
    cs, tch = facts.of("cuda_stack"), facts.of("toolchain")
    if cs is None or tch is None:
        return [not_checked(fid, "Host compiler vs nvcc", facts.why_not("cuda_stack" if cs is None else "toolchain"))]
    if tc["state"] not in ("ok", "import_failed") or not tc["cuda"]:
        return [not_checked(fid, "Host compiler vs nvcc",
                            f"{tc['why'] or 'torch CUDA unknown'}: no CUDA op is compiled")]
    nv = cs.get("nvcc") or {}
    if not nv.get("release"):
        return [not_checked(fid, "Host compiler vs nvcc", "no working nvcc (see gpu.toolkit.cuda-home)")]
    hc = cs.get("host_config") or {}
    host, jit = tch.get("cuda_host") or {}, tch.get("jit") or {}
    if hc.get("gcc_max"):
        gmax, src = hc["gcc_max"], f"{hc['path']} (#if __GNUC__ > {hc['gcc_max']})"
    else:
        gmax, src = cuda.gcc_max_for(nv["release"])
    gmin = hc.get("gcc_min")
    rows, hl, lines = [], [], []
    status = "ok"
    env = cs.get("env") or {}
    # nvcc's host compiler ($CC, else gcc on PATH)
    label = "nvcc host compiler (-ccbin $CC)" if host.get("source") == "CC" else "nvcc host compiler (gcc on PATH)"
    hmaj = host.get("major")
    verdict = "-"
    if host.get("family") == "gcc" and hmaj is not None and gmax is not None:
        if hmaj > gmax or (gmin and hmaj < gmin):
            status = "fail"
            verdict = f"outside GCC {gmin or ''}..{gmax}"
            hl.append(len(rows))
            err = hc.get("error_line") or (f"#error -- unsupported GNU version! gcc versions later than {gmax} are "
                                          "not supported!")
            lines.append(f"nvcc {nv['release']} accepts GCC up to {gmax} ({src}); the host compiler is GCC "
                         f"{host.get('version')} ({host.get('path')}). Every CUDA op build stops with: {err}")
        else:
            verdict = "supported"
    elif host.get("family") not in (None, "gcc"):
        verdict = f"{host.get('family')}: not checked"
    rows.append([label, host.get("path") or "none", host.get("version") or "?", f"GCC <= {gmax}" if gmax else "?",
                 verdict])
    # torch's own bounds for the C++ compiler of a CUDA extension
    bounds = cuda.TORCH_CUDA_GCC.get(nv["release"])
    skip_abi = str(env.get("TORCH_DONT_CHECK_COMPILER_ABI", "")).upper() in ("ON", "1", "YES", "TRUE", "Y")
    jver = version_tuple(jit.get("version"))
    verdict = "-"
    if bounds and jit.get("family") == "gcc" and jver and not skip_abi:
        lo, hi = bounds
        lo_s, hi_s = ".".join(map(str, lo)), ".".join(map(str, hi))
        name = os.path.basename(jit.get("command") or jit.get("path") or "c++")
        if jver >= hi or jver < lo:
            status = "fail"
            verdict = f"outside >={lo_s}, <{hi_s}"
            hl.append(len(rows))
            side = "greater than the maximum" if jver >= hi else "less than the minimum"
            lines.append(f"torch refuses to JIT-build a CUDA extension with this C++ compiler: 'The current installed "
                         f"version of {name} ({jit.get('version')}) is {side} required version by CUDA "
                         f"{nv['release']}. Please make sure to use an adequate version of {name} "
                         f"(>={lo_s}, <{hi_s}).'")
        else:
            verdict = f"within >={lo_s}, <{hi_s}"
    elif skip_abi:
        verdict = "TORCH_DONT_CHECK_COMPILER_ABI set: torch does not check"
    rows.append(["C++ compiler for extensions ($CXX or c++)", jit.get("path") or "none", jit.get("version") or "?",
                 "torch's CUDA_GCC_VERSIONS" + (f" for {nv['release']}" if bounds else " (no entry)"), verdict])
    ev = [Evidence.of_table("Host compilers vs nvcc", ["layer", "compiler", "version", "allowed", "verdict"], rows, hl),
          *facts.evidence("cuda_stack")]
    if status == "ok":
        if host.get("family") != "gcc":
            return [not_checked(fid, "Host compiler vs nvcc",
                                f"nvcc's host compiler is {host.get('family') or 'unknown'} "
                                   f"({host.get('path') or host.get('error') or 'not found'}); only GCC ranges are "
                                   "checked.", ev)]
        return [Finding(id=fid, status="ok", title=f"Host compiler GCC {host.get('version') or '?'} is supported by "
                        f"nvcc {nv['release']}", detail=f"Limit from {src}.", evidence=ev)]
    hi_major = min([x for x in (gmax, bounds[1][0] - 1 if bounds else None) if x is not None] or [13])
    lo_major = max(gmin or 0, bounds[0][0] if bounds else 0)
    return [Finding(id=fid, status="fail", title=f"The host compiler is too new (or old) for nvcc {nv['release']}",
                    detail="\n".join(lines), evidence=ev, remedies=_compiler_remedy(cs, lo_major, hi_major))]


# -- gpu.nccl -------------------------------------------------------------------------------------------


def _nccl_remedies(facts: Facts, nf: dict[str, Any], analysis: dict[str, Any]) -> list[Remedy]:
    out: list[Remedy] = []
    req = nf.get("torch_requires") or {}
    kinds = {p["kind"] for p in analysis["problems"]}
    major = req.get("cuda_major") or (cuda.parse_cuda(nf.get("torch_cuda")) or (None,))[0]
    keep = req.get("dist") or (f"nvidia-nccl-cu{major}" if major else None)
    whl = nf.get("wheels") or []
    if "two_wheels" in kinds and keep:
        extra = sorted({w["dist"] for w in whl if w["dist"] != keep})
        pin = f"{keep}=={req['version']}" if req.get("version") else keep
        out.append(Remedy(title=f"Keep only {keep} (torch's own)",
                          commands=[_pip(facts, "uninstall", "-y", *extra),
                                    _pip(facts, "install", "--force-reinstall", "--no-deps", pin)],
                          verified=None,
                          explanation="Both wheels install the same file, nvidia/nccl/lib/libnccl.so.2: uninstalling "
                                      "one deletes the copy the other relies on, so the second line puts torch's "
                                      "version back."))
    elif {"loaded_older", "import_symbol", "versions_differ"} & kinds and keep and req.get("version"):
        out.append(Remedy(title=f"Reinstall the NCCL torch was built with ({keep}=={req['version']})",
                          commands=[_pip(facts, "install", "--force-reinstall", "--no-deps",
                                         f"{keep}=={req['version']}")],
                          verified=None))
    env_pre = [p for p in nf.get("providers") or [] if p["kind"] == "preload"]
    if env_pre:
        pre_now = (nf.get("env") or {}).get("LD_PRELOAD") or _env_value(facts, "LD_PRELOAD") or ""
        rest = [x for x in pre_now.replace(":", " ").split() if "libnccl" not in x]
        cmd = f"export LD_PRELOAD={shell_quote(' '.join(rest))}" if rest else "unset LD_PRELOAD"
        out.append(Remedy(title="Stop preloading an NCCL library", commands=[cmd], verified=None,
                          explanation="LD_PRELOAD loads " + ", ".join(p["path"] for p in env_pre) + " before torch, "
                                      "and the first libnccl.so.2 loaded wins; the other preloaded libraries stay."))
    llp = [p for p in nf.get("providers") or []
           if p["kind"] == "ld_library_path" and p.get("version") != analysis["expected"]]
    if llp:
        dirs = {os.path.dirname(p["path"]) for p in llp}
        llp_now = (nf.get("env") or {}).get("LD_LIBRARY_PATH") or _env_value(facts, "LD_LIBRARY_PATH") or ""
        keep_dirs = [d for d in llp_now.split(":") if d and d not in dirs]
        cmd = f"export LD_LIBRARY_PATH={shell_quote(':'.join(keep_dirs))}" if keep_dirs else "unset LD_LIBRARY_PATH"
        out.append(Remedy(title="Take the other NCCL's directory off LD_LIBRARY_PATH", commands=[cmd], verified=None,
                          explanation="Removes exactly " + ", ".join(sorted(dirs)) + " from LD_LIBRARY_PATH; any other "
                                      "library in those directories is no longer found through it either."))
    return out


def _env_value(facts: Facts, name: str) -> str | None:
    py = facts.of("pyenv") or {}
    return (py.get("env") or {}).get(name)


@check("gpu.nccl", title="NCCL libraries vs torch's NCCL", probes=("nccl", "pyenv"))
def check_nccl(facts: Facts) -> list[Finding]:
    fid = "gpu.nccl"
    nf = _result_facts(facts, "nccl")
    if nf is None or nf.get("skipped"):
        return [not_checked(fid, "NCCL libraries", (nf or {}).get("skipped") or facts.why_not("nccl"))]
    a = ncclmod.analyze(nf)
    ev = facts.evidence("nccl")
    lines = [p["text"] for p in a["problems"]] + a["notes"]
    if any(p["kind"] in ("loaded_older", "import_symbol", "two_wheels", "versions_differ") for p in a["problems"]):
        lines.append("Two NCCL providers is the `undefined symbol: ncclCommRegister` (or ncclCommResume ...) class "
                     "of failure: the first libnccl.so.2 loaded into the process wins, and when it is older than "
                     "the NCCL torch was built with, symbols torch calls are missing. NCCL links the CUDA runtime "
                     "statically and takes no symbols from libcudart.")
    req = nf.get("torch_requires") or {}
    if a["status"] == "ok":
        loaded = [p["path"] for p in nf.get("providers") or [] if p.get("loaded")]
        title = f"NCCL {a['runtime'] or '?'}" + (f" as torch's wheel requires ({req['dist']}=={req['version']})"
                                                 if req.get("version") else "")
        lines.insert(0, ("torch loaded " + ", ".join(loaded) + ".") if loaded else
                     "Which libnccl.so.2 torch maps is unknown (torch was not imported).")
        return [Finding(id=fid, status="ok", title=title, detail="\n".join(lines), evidence=ev)]
    title = {"fail": "torch runs with an older NCCL than it was built for",
             "warn": "More than one NCCL library can be loaded"}[a["status"]]
    return [Finding(id=fid, status=a["status"], title=title, detail="\n".join(lines), evidence=ev,
                    remedies=_nccl_remedies(facts, nf, a))]


# -- gpu.env --------------------------------------------------------------------------------------------


@check("gpu.env", title="NCCL / CUDA environment of the training", probes=("gpu_env", "nvml"),
       findings=("gpu.env.deprecated", "gpu.env.launch-blocking", "gpu.env.nccl-debug", "gpu.env.p2p",
                 "gpu.env.visible-devices"))
def check_env(facts: Facts) -> list[Finding]:
    """The training's NCCL and CUDA variables: deprecated names, NCCL_DEBUG, peer-to-peer,
    CUDA_VISIBLE_DEVICES and CUDA_LAUNCH_BLOCKING, one finding each."""
    ge = facts.of("gpu_env")
    if ge is None:
        return [not_checked("gpu.env", "NCCL / CUDA environment", facts.why_not("gpu_env"))]
    env = ge.get("vars") or {}
    gpus = _gpus(facts)
    return (_env_deprecated(env) + _env_nccl_debug(env) + _env_p2p(env, gpus, facts)
            + _env_visible_devices(env, gpus, ge.get("gpus_per_node")) + _env_launch_blocking(env))


def _env_deprecated(env: dict[str, str]) -> list[Finding]:
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
            id="gpu.env.deprecated", status="warn",
            title="Deprecated NCCL variable name(s): " + ", ".join(d["old"] for d in dep),
            detail="torch renamed these c10d variables (TORCH_ prefix, since torch 2.2); the old names still work "
                   "when the new one is unset but print a deprecation warning, and are ignored when both are set. "
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING: 0 no handling, 1 tear down the process on a collective "
                   "error or timeout, 2 clean up only, 3 skip clean-up (the default; torchrun sets 1).",
            evidence=[Evidence.of_table("Deprecated variables", ["old name", "value", "new name", "new value",
                                                                  "effect"], rows)],
            remedies=[Remedy(title="Use the new names", commands=cmds, verified=None)]))
    else:
        out.append(Finding(id="gpu.env.deprecated", status="ok", title="No deprecated NCCL variable names",
                           detail="None of " + ", ".join(envreview.DEPRECATED) + " is set."))
    return out


def _env_nccl_debug(env: dict[str, str]) -> list[Finding]:
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
    out.append(Finding(id="gpu.env.nccl-debug", status=nd["status"],
                       title="NCCL_DEBUG " + (f"= {nd['value']}" if nd["value"] else "not set"), detail=nd["text"],
                       remedies=rem))
    return out


def _env_p2p(env: dict[str, str], gpus: list[dict[str, Any]] | None, facts: Facts) -> list[Finding]:
    """NCCL peer-to-peer against the GPU models (consumer boards hang with it on)."""
    out: list[Finding] = []
    # peer-to-peer
    if gpus is None:
        out.append(not_checked("gpu.env.p2p", "NCCL peer-to-peer setting for these GPUs",
                               "the GPU models are unknown: " + facts.why_not("nvml")))
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
        out.append(Finding(id="gpu.env.p2p", status=pp["status"], evidence=p2p_ev,
                           title="NCCL peer-to-peer: " + ("risk of hangs on consumer GPUs" if pp["status"] == "warn"
                                                         and pp["consumer"] else "disabled on datacenter GPUs"
                                                         if pp["status"] == "warn" else "nothing to change"),
                           detail=pp["text"], remedies=rem))
    return out


def _env_visible_devices(env: dict[str, str], gpus: list[dict[str, Any]] | None, want: Any) -> list[Finding]:
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
            lines.append(f"The job expects {want} GPU(s) per node but only {n_vis} are visible here.")
    if status in ("warn", "fail") and gpus:
        rem.append(Remedy(title="Show every GPU of the node to the training", commands=["unset CUDA_VISIBLE_DEVICES"],
                          verified=None, explanation="Or list valid indices (0-" f"{len(gpus) - 1}) or GPU UUIDs "
                                                     "only; `nvidia-smi -L` prints both."))
    vis_ev = []
    if vd["set"] and gpus is not None:
        rows, hl = [], []
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
        out.append(not_checked("gpu.env.visible-devices", "CUDA_VISIBLE_DEVICES", vd["text"]))
    else:
        out.append(Finding(id="gpu.env.visible-devices", status=status, evidence=vis_ev,
                           title="CUDA_VISIBLE_DEVICES "
                           + ("not set" if not vd["set"] else f"= {env.get('CUDA_VISIBLE_DEVICES')!r}")
                           + ("" if status == "ok" else ": GPUs missing"), detail="\n".join(lines), remedies=rem))
    return out


def _env_launch_blocking(env: dict[str, str]) -> list[Finding]:
    """CUDA_LAUNCH_BLOCKING left on (a debugging switch that slows training)."""
    out: list[Finding] = []
    if env.get("CUDA_LAUNCH_BLOCKING", "0").strip() not in ("", "0"):
        out.append(Finding(id="gpu.env.launch-blocking", status="warn", title="CUDA_LAUNCH_BLOCKING is set",
                           detail="Every CUDA kernel launch waits for the kernel to finish: a debugging switch that "
                                  "makes errors point at the right line, and makes training much slower.",
                           remedies=[Remedy(title="Turn synchronous launches off",
                                            commands=["unset CUDA_LAUNCH_BLOCKING"], verified=None)]))
    return out


# -- gpu.limits -----------------------------------------------------------------------------------------


def _gpus_on_node(facts: Facts, lf: dict[str, Any]) -> int | None:
    gpus = _gpus(facts)
    if gpus is not None:
        return len(gpus)
    n = lf.get("gpus_per_node")
    return n if isinstance(n, int) else None


@check("gpu.limits", title="/dev/shm, locked memory and open files of the training", probes=("host_limits", "nvml"),
       explains=("nofile", "shm"), optional=("limitfix",),
       findings=("gpu.limits.memlock", "gpu.limits.nofile", "gpu.limits.shm"))
def check_limits(facts: Facts) -> list[Finding]:
    lf = facts.of("host_limits")
    if lf is None:
        return [not_checked("gpu.limits", "Host limits", facts.why_not("host_limits"))]
    ev = facts.evidence("host_limits")
    return [_shm(facts, lf, ev), _memlock(lf, ev), _nofile(facts, lf, ev)]


def _shm(facts: Facts, lf: dict[str, Any], ev: list[Evidence]) -> Finding:
    fid = "gpu.limits.shm"
    shm = lf.get("shm") or {}
    box = lf.get("container") or {}
    n = _gpus_on_node(facts, lf)
    if shm.get("total") is None:
        return not_checked(fid, "/dev/shm size", shm.get("error") or "/dev/shm could not be measured", ev)
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


def _limits_conf_remedy(item: str, value: str, dropins: dict[str, Any] | None) -> Remedy:
    """A new drop-in under pam_limits' folder, named so that no file the node has is replaced."""
    line = f"* - {item} {value}"
    dropins = dropins or {}
    folder = dropins.get("path") if isinstance(dropins.get("path"), str) else LIMITS_D
    path = free_name(folder, f"90-zdoctor-{item}", ".conf", dropins.get("names"))
    unknown = "" if isinstance(dropins.get("names"), list) else (
        f" The names in {folder} were not read ({dropins.get('error') or 'not recorded'}): the first line stops if "
        "this one is taken.")
    return create_file_remedy(
        path, f"# Written by zdoctor: {item} for every PAM login.\n{line}\n", check="limits.conf",
        title=f"Raise {item} for every login (a new drop-in {os.path.basename(path)})", verified=None,
        explanation=f"The line `{line}` in /etc/security/limits.conf syntax applies to new PAM logins, not to "
                    "running shells or services. Docker: --ulimit "
                    f"{'memlock=-1:-1' if item == 'memlock' else 'nofile=65536:65536'}; systemd services: "
                    f"{'LimitMEMLOCK=infinity' if item == 'memlock' else 'LimitNOFILE=65536'}; Slurm "
                    "propagates the limits of the submitting shell unless configured otherwise." + unknown)


def _memlock(lf: dict[str, Any], ev: list[Evidence]) -> Finding:
    fid = "gpu.limits.memlock"
    t = lf.get("target") or {}
    soft, hard = t.get("memlock_soft_kb"), t.get("memlock_hard_kb")
    if soft is None:
        return not_checked(fid, "ulimit -l", t.get("error") or "the training shell did not report ulimit -l", ev)
    if soft == "unlimited":
        return Finding(id=fid, status="ok", title="ulimit -l (locked memory) is unlimited",
                       detail="Pinned host buffers and RDMA registration are not capped.", evidence=ev)
    rem = []
    if hard == "unlimited" or (isinstance(hard, int) and hard > soft):
        rem.append(Remedy(title="Raise the soft limit in the launching shell",
                          commands=[f"ulimit -l {'unlimited' if hard == 'unlimited' else hard}"], verified=None,
                          explanation="A process may raise its soft limit up to the hard limit without root."))
    rem.append(_limits_conf_remedy("memlock", "unlimited", lf.get("limits_d")))
    nodes = lf.get("nodes")
    return Finding(
        id=fid, status="warn", title=f"ulimit -l (locked memory) is {soft} KiB in the training shell",
        detail="DeepSpeed >= 0.19.5 pins the offload buffers by default (offload_param/offload_optimizer "
               "pin_memory=True). Memory registered with an InfiniBand/RoCE NIC always counts against this "
               "limit: multi-node NCCL fails with 'ibv_reg_mr failed' or 'RLIMIT_MEMLOCK' warnings. Whether CUDA's "
               "own pinned allocations count depends on the driver; mlock-based pinning always does."
               + (f" The job spans {nodes} nodes." if isinstance(nodes, int) and nodes > 1 else ""),
        evidence=ev, remedies=rem)


def _nofile(facts: Facts, lf: dict[str, Any], ev: list[Evidence]) -> Finding:
    fid = "gpu.limits.nofile"
    t = lf.get("target") or {}
    soft, hard = t.get("nofile_soft"), t.get("nofile_hard")
    if soft is None:
        return not_checked(fid, "ulimit -n", t.get("error") or "the training shell did not report ulimit -n", ev)
    if soft == "unlimited" or soft >= limits.NOFILE_LOW:
        return Finding(id=fid, status="ok", title=f"ulimit -n (open files) is {soft}", evidence=ev)
    rem = []
    new = limits.raised_nofile(soft, hard)
    if new is not None:
        rem.append(_tried_ulimit(facts, Remedy(title="Raise the soft limit in the launching shell",
                                               commands=[f"ulimit -n {new}"], verified=None)))
    rem.append(_limits_conf_remedy("nofile", str(limits.NOFILE_TARGET), lf.get("limits_d")))
    return Finding(id=fid, status="warn", title=f"ulimit -n (open files) is only {soft}",
                   detail="Each rank opens sockets to its peers, DataLoader workers pass tensors as file descriptors, "
                          "and NVMe offload opens swap files: a low limit ends in 'Too many open files'.",
                   evidence=ev, remedies=rem, explains=ids_for(facts, "nofile"))


# -- predicates -----------------------------------------------------------------------------------------


def _status(findings: list[Finding], prefix: str) -> set[str]:
    return {f.status for f in findings if f.id == prefix or f.id.startswith(prefix + ".")}


@predicate("gpu_nvml_unavailable", doc="No usable NVIDIA driver: NVML and nvidia-smi both failed", probes=("nvml",))
def gpu_nvml_unavailable(facts: Facts) -> bool:
    nv = _result_facts(facts, "nvml")
    return nv is None or nv.get("source") is None


@predicate("gpu_none_visible", doc="The driver answers but reports no GPU", probes=("nvml",))
def gpu_none_visible(facts: Facts) -> bool:
    nv = _result_facts(facts, "nvml")
    return bool(nv) and nv.get("source") is not None and not nv.get("count")


@predicate("gpu_unhealthy", doc="ECC errors, prohibited compute mode, or thermal/hardware slowdowns", probes=("nvml",))
def gpu_unhealthy(facts: Facts) -> bool:
    fs = evaluate_check("gpu.health", facts)
    return "fail" in _status(fs, "gpu.health") or "warn" in _status(fs, "gpu.health.throttle") \
        or "warn" in _status(fs, "gpu.health.ecc")


@predicate("gpu_torch_without_cuda", doc="torch is missing, or a CPU/ROCm build", probes=("pyenv",))
def gpu_torch_without_cuda(facts: Facts) -> bool:
    return torch_cuda(facts)["state"] in ("missing", "cpu", "rocm")


@predicate("gpu_cuda_start_failed", doc="CUDA does not start although torch's CUDA fits the driver",
           probes=("nvml", "pyenv"))
def gpu_cuda_start_failed(facts: Facts) -> bool:
    tc = torch_cuda(facts)
    drv = (facts.of("nvml") or {}).get("cuda_driver_version")
    return bool(tc["state"] == "ok" and tc["available"] is False and _gpus(facts) and drv
                and cuda.driver_runtime_verdict(drv, tc["cuda"])["verdict"] == "ok")
