"""Checks and predicates of the NVIDIA driver and the GPUs themselves: the driver and its kernel module,
the PCIe links, and GPU health (ECC, clocks, persistence, processes, compute mode).

Every check says what it could not check and why (a ``skip`` finding with the reason) instead of
guessing; every mismatch comes with a side-by-side table and remedies whose shell text is quoted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of, noun_for
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.layers import evaluate_check
from zdoctor.layers.gpu import nvml
from zdoctor.layers.kernel_log.kernlog import bus_address
from zdoctor.readers import hostlimits as limits
from zdoctor.readers import kmod
from zdoctor.readers.gpufacts import na, nvml_gpus, result_facts
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.gpureset import reboot_remedy, reload_remedy, reset_remedy

HOT_C = 85
IDLE_UTIL = 10


# -- gpu.driver -----------------------------------------------------------------------------------------


@check("gpu.driver", title="NVIDIA driver and GPUs", probes=("nvml",), optional=("kernel_log",),
       explains=("driver-mismatch", "xid", "cuda-error"))
def check_driver(facts: Facts, me: CheckSpec) -> list[Finding]:
    nv = result_facts(facts, "nvml")
    ev = facts.evidence("nvml")
    if nv is not None and _driver_mismatch(nv):
        found = _mismatch_finding(nv, ev)
        said = (facts.of("kernel_log") or {}).get("api_mismatch") or []
        if said:
            found.detail += (f" The kernel log has the module's own record ({_utc(said[-1].get('time'))}): "
                             f"user space {said[-1].get('client')}, kernel module {said[-1].get('module') or '?'} "
                             "(kernel.api-mismatch).")
        # CUDA's 803 (cudaErrorSystemDriverMismatch) is the same mismatch seen from the runtime
        found.explains = ids_for(facts, "driver-mismatch") + ids_for(facts, "cuda-error", number="803")
        return [found]
    if nv is not None and (nv.get("library") or {}).get("error_kind") == "gpu_lost" and nv.get("skipped"):
        return [me.finding(status="fail", title="A GPU has fallen off the bus: NVML cannot start",
                           detail=f"{(nv.get('library') or {}).get('error')}. No CUDA program can use the node's "
                                  "GPUs until the lost GPU is reset or the node rebooted. " + fell_off_record(facts),
                           evidence=ev, remedies=[reboot_remedy()])]
    if nv is None or nv.get("skipped"):
        why = (nv or {}).get("skipped") or facts.why_not("nvml")
        return [me.not_checked(why + ". The GPU checks that need the driver are skipped.", ev)]
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
                         "it is known and CUDA cannot use it ('GPU is lost' means it fell off the PCIe bus). "
                         + fell_off_record(facts, g.get("pci_bus_id")))
        remedies = [reset_remedy(lost), reboot_remedy()]
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
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev, remedies=remedies,
                       explains=ids_for(facts, "xid", xid="79") if lost else [])]


def fell_off_record(facts: Facts, bus: str | None = None) -> str:
    """What the kernel log says of a GPU that fell off the bus: its Xid 79 record (at ``bus`` when NVML knows
    the lost GPU's address), that it holds none in the window read, or where to look when it was not read."""
    kl = facts.of("kernel_log")
    if kl is None:
        return "`dmesg | grep -i xid` shows the Xid error (79: fallen off the bus) and when it happened."
    want = bus_address(bus) if bus else None
    found = [r for r in kl.get("xids") or [] if r.get("xid") == 79 and (want is None or r.get("bus_address") == want)]
    since = (kl.get("window") or {}).get("since")
    if not found:
        return (f"The kernel log ({kl.get('path')}, since {_utc(since)}) holds no Xid 79 record"
                + (f" for {bus}" if bus else "") + ": the GPU was lost before that window, or the driver did not "
                "log it.")
    last = found[-1]
    return (f"The kernel log has the driver's record ({count_of(len(found), 'record')}, the last at "
            f"{_utc(last.get('time'))}): {last.get('text')}")


def _utc(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else "an unknown time"


#: NVML answers on a GPU that mean the GPU itself is gone, whatever field was asked.
LOST_WORDS = ("GPU is lost", "GPU requires restart")


def unreachable_gpus(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPUs NVML gave no handle for, or answered 'GPU is lost' / 'requires restart' on."""
    return [g for g in gpus if "handle" in (g.get("errors") or {})
            or any(w in str(v) for v in (g.get("errors") or {}).values() for w in LOST_WORDS)]


def gpu_error(g: dict[str, Any]) -> str:
    errs = g.get("errors") or {}
    return f"handle: {errs['handle']}" if "handle" in errs else "; ".join(f"{k}: {v}" for k, v in errs.items())


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
    remedies = [reload_remedy(order)] if order else []
    remedies.append(reboot_remedy())
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
def check_pcie(facts: Facts, me: CheckSpec) -> list[Finding]:
    gpus = nvml_gpus(facts)
    if gpus is None:
        return [me.not_checked(facts.why_not("nvml"))]
    rows: list[list[str]] = []
    slow_busy: list[Mapping[str, Any]] = []
    slow_idle: list[Mapping[str, Any]] = []
    highlight, narrow, unknown = [], [], []
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
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev)]


# -- gpu.health -----------------------------------------------------------------------------------------


@check("gpu.health", title="GPU health: ECC, clocks, persistence, processes", probes=("nvml",),
       findings=("gpu.health.compute-mode", "gpu.health.ecc", "gpu.health.persistence", "gpu.health.processes",
                 "gpu.health.reachable", "gpu.health.throttle"))
def check_health(facts: Facts, me: CheckSpec) -> list[Finding]:
    gpus = nvml_gpus(facts)
    if gpus is None:
        return [me.not_checked(facts.why_not("nvml"))]
    lost = unreachable_gpus(gpus)
    out: list[Finding] = []
    if lost:
        out.append(me.finding(sub="reachable", status="fail",
                              title="GPU " + ", ".join(str(g["index"]) for g in lost) + " unreachable: its health "
                                    "is unknown and CUDA cannot use it",
                              detail="\n".join(f"GPU {g['index']}: {gpu_error(g)}" for g in lost)
                                     + "\nThe health checks below cover only the GPUs NVML could read.",
                              remedies=[reset_remedy(lost), reboot_remedy()]))
    gpus = [g for g in gpus if g not in lost]
    if not gpus:
        return out
    return out + [_ecc(me, gpus), _throttle(me, gpus), _persistence(me, gpus), _processes(me, gpus),
                  _compute_mode(me, gpus)]


def _ecc(me: CheckSpec, gpus: list[dict[str, Any]]) -> Finding:
    fid = me.id("ecc")
    rows: list[list[str]] = []
    hl, fail, warn = [], [], []
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
        rows.append([str(g["index"]), g.get("name") or "?", mode, na(e.get("volatile_uncorrected")),
                     na(e.get("volatile_corrected")), na(e.get("aggregate_uncorrected")), "; ".join(why) or "-"])
    ev = [Evidence.of_table("ECC per GPU", ["#", "GPU", "ECC", "uncorrected (volatile)", "corrected (volatile)",
                                             "uncorrected (lifetime)", "note"], rows, hl)]
    if fail:
        bad = _unique(fail)
        return Finding(id=fid, status="fail", title="Uncorrectable GPU memory errors on GPU "
                       + ", ".join(str(g["index"]) for g in bad),
                       detail="An uncorrectable ECC error means data in GPU memory was lost: CUDA calls on that GPU "
                              "fail with 'uncorrectable ECC error encountered' and training results cannot be "
                              "trusted. This is hardware, not configuration.", evidence=ev,
                       remedies=[reset_remedy(bad)])
    if warn:
        return Finding(id=fid, status="warn", title="GPU memory (ECC) needs attention on GPU "
                       + ", ".join(str(g["index"]) for g in _unique(warn)),
                       detail="See the notes in the table: pending row remapping and ECC mode changes take effect "
                              "only after a GPU reset or reboot; lifetime uncorrectable errors mean the GPU had "
                              "trouble before.", evidence=ev, remedies=[reset_remedy(_unique(warn))])
    off = [g for g in gpus if (g.get("ecc") or {}).get("current") is False]
    detail = "No uncorrectable ECC errors."
    if off:
        detail += (" ECC is off on GPU " + ", ".join(str(g["index"]) for g in off) + " (normal on consumer cards; on "
                   "datacenter GPUs it trades error detection for a little more memory).")
    return Finding(id=fid, status="ok", title="GPU memory: no uncorrectable ECC errors", detail=detail, evidence=ev)


def _unique(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for g in gpus:
        seen.setdefault(g["index"], g)
    return [seen[k] for k in sorted(seen)]


def _throttle(me: CheckSpec, gpus: list[dict[str, Any]]) -> Finding:
    fid = me.id("throttle")
    rows: list[list[str]] = []
    hl, bad = [], []
    for g in gpus:
        reasons = (g.get("throttle") or {}).get("reasons") or []
        worst = [r for r in reasons if nvml.reason_severity(r) == "bad"]
        hot = g.get("temperature_c") is not None and g["temperature_c"] >= HOT_C
        if worst or hot:
            bad.append(g)
            hl.append(len(rows))
        rows.append([str(g["index"]), g.get("name") or "?", na(g.get("temperature_c")),
                     f"{na(g.get('power_w'))} / {na(g.get('power_limit_w'))} W",
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


def _persistence(me: CheckSpec, gpus: list[dict[str, Any]]) -> Finding:
    fid = me.id("persistence")
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


def _processes(me: CheckSpec, gpus: list[dict[str, Any]]) -> Finding:
    fid = me.id("processes")
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


def _compute_mode(me: CheckSpec, gpus: list[dict[str, Any]]) -> Finding:
    fid = me.id("compute-mode")
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
        return Finding(id=fid, status="ok",
                       title=f"{noun_for(len(exclusive), 'GPU')} in exclusive-process compute mode",
                       detail="Only one process at a time may use each of GPU "
                              + ", ".join(str(g["index"]) for g in exclusive)
                              + ": fine for one rank per GPU; a second process on the same GPU fails with "
                                "'all CUDA-capable devices are busy or unavailable'.")
    known = any(g.get("compute_mode") for g in gpus)
    return Finding(id=fid, status="ok" if known else "skip",
                   title="Compute mode default" if known else "Compute mode: not reported",
                   detail="Any process may use the GPUs." if known else "NVML did not report the compute mode.")


# -- predicates -----------------------------------------------------------------------------------------


def _status(findings: list[Finding], prefix: str) -> set[str]:
    return {f.status for f in findings if f.id == prefix or f.id.startswith(prefix + ".")}


@predicate("gpu_nvml_unavailable", doc="No usable NVIDIA driver: NVML and nvidia-smi both failed", probes=("nvml",))
def gpu_nvml_unavailable(facts: Facts) -> bool:
    nv = result_facts(facts, "nvml")
    return nv is None or nv.get("source") is None


@predicate("gpu_none_visible", doc="The driver answers but reports no GPU", probes=("nvml",))
def gpu_none_visible(facts: Facts) -> bool:
    nv = result_facts(facts, "nvml")
    return nv is not None and bool(nv) and nv.get("source") is not None and not nv.get("count")


@predicate("gpu_unhealthy", doc="ECC errors, prohibited compute mode, or thermal/hardware slowdowns", probes=("nvml",))
def gpu_unhealthy(facts: Facts) -> bool:
    fs = evaluate_check("gpu.health", facts)
    return "fail" in _status(fs, "gpu.health") or "warn" in _status(fs, "gpu.health.throttle") \
        or "warn" in _status(fs, "gpu.health.ecc")
