"""Checks of the kernel log: ``kernel.xid`` (NVIDIA Xid records, by GPU), ``kernel.api-mismatch`` (NVRM's
module vs user-space versions), ``kernel.aer`` (PCIe AER errors, by device) and ``kernel.oom`` (the OOM
killer's records, by process and cgroup).

Each record is tied to the GPU whose bus address it names (the nvml probe's bus ids) or to the process it
killed. An empty log is "ok" only for the window read: records of an earlier boot, or overwritten in the
ring buffer, are not seen, and the finding says from when it looked.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from zdoctor.core import packages as pkgmgr
from zdoctor.core.causes import (
    CGROUP_LIMIT,
    HOST_RAM,
    NUMA_LIMIT,
    UNKNOWN_KILL,
    WHAT_WOULD_TELL,
    kill_cause,
    oom_cause,
)
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Concluded, Facts, check, predicate
from zdoctor.layers.kernel_log.kernlog import bus_address
from zdoctor.layers.kernel_log.probe_kernlog import LOOK_ALIKES
from zdoctor.layers.kernel_log.xids import CATALOGUE, DriverFault, driver_fault, xid
from zdoctor.layers.offload.check_hostram import job_cgroup_oom_kills
from zdoctor.readers.gpufacts import result_facts
from zdoctor.readers.pcipresent import NVIDIA_VENDOR, link_state
from zdoctor.symptoms.match import ids_for, symptoms_of
from zdoctor.trials.gpureset import reboot_remedy, reload_remedy, reset_remedy

LAYER = "kernel-log"


def when(t: float | None) -> str:
    """A record's wall time, UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else "an unknown time"


def scope(kl: Mapping[str, Any]) -> str:
    """Where the records come from and the window they cover, in one sentence."""
    w = kl.get("window") or {}
    src = {"kmsg": "/dev/kmsg", "journalctl": "journalctl -k (this boot)"}.get(kl.get("source") or "", "the log")
    text = f"Read from {src}"  # how many records and until when: the evidence's note (they change run to run)
    if kl.get("truncated"):
        text += f" ({kl['truncated']})"
    if w.get("since_given"):
        text += (f"; judged are the records since {when(w.get('since'))}, the window asked for "
                 "(ZDOCTOR_KERNEL_LOG_SINCE). Records from before then are not seen.")
    else:
        text += (f", the oldest record from {when(w.get('since'))}. Records from before then (an earlier boot, "
                 "or overwritten in the kernel's ring buffer) are not seen.")
    others = kl.get("user_space") or []
    if others:
        text += (f" {count_of(len(others), 'record')} that read like the kernel's but are not its own (written "
                 f"from user space, or the driver's words not at the start) are shown in \"{LOOK_ALIKES}\" and "
                 "not judged.")
    return text


def _gpus_by_bus(facts: Facts) -> dict[str, dict[str, Any]] | None:
    """The nvml probe's GPUs by :func:`bus_address` (None when NVML listed none)."""
    nv = facts.of("nvml")
    if not nv or not nv.get("gpus"):
        return None
    out: dict[str, dict[str, Any]] = {}
    for g in nv["gpus"]:
        key = bus_address(g.get("pci_bus_id"))
        if key:
            out[key] = dict(g)
    return out


def gpu_of(gpus: dict[str, dict[str, Any]] | None, key: str | None) -> str:
    """``GPU 0 (NVIDIA H200, GPU-...)``, or why the bus is tied to no GPU."""
    if gpus is None:
        return "GPU unknown (NVML gave no GPU list)"
    g = gpus.get(key or "")
    if g is None:
        return "no GPU NVML lists"
    return f"GPU {g.get('index')} ({g.get('name') or '?'}, {g.get('uuid') or 'no UUID'})"


def _table(facts: Facts, label: str, columns: list[str], rows: list[list[str]], highlight: list[int]) -> Evidence:
    """A table of the records, stamped with the time the log was read (so a replay gives the same finding)."""
    table = Evidence.of_table(label, columns, rows, highlight)
    read = facts.evidence("kernel_log")
    table.started = read[0].started if read else 0.0
    return table


def _records(me: CheckSpec, facts: Facts, key: str, what: str
             ) -> tuple[Mapping[str, Any], list[Any], list[Evidence]]:
    """The kernel log's facts, its records of ``key`` and its evidence; the check ends here (:class:`Concluded`)
    when there is nothing to judge: not checked when the log was not read, ``ok`` when it holds no ``what`` in
    the window it covers."""
    ev = facts.evidence("kernel_log")
    kl: Mapping[str, Any] = me.require(facts.of("kernel_log"), facts.why_not("kernel_log"), ev, sub="not-checked")
    records = kl.get(key) or []
    if not records:
        raise Concluded(me.finding(status="ok", title=f"No {what} in the kernel log since "
                                   f"{when((kl.get('window') or {}).get('since'))}", detail=scope(kl), evidence=ev))
    return kl, records, ev


# -- kernel.xid ------------------------------------------------------------------------------------------


def module_now(facts: Facts) -> tuple[bool | None, str]:
    """Whether the NVIDIA kernel module is loaded now (None: not known), and the fact in words."""
    dp = result_facts(facts, "driver_parts")
    module = (dp or {}).get("module") or {}
    nv = facts.of("nvml") or {}
    if "loaded" not in module and nv.get("gpus") and nv.get("driver"):
        return True, f"NVML starts now with driver {nv['driver']}: the NVIDIA kernel module is loaded"
    if "loaded" not in module:
        return None, "whether the NVIDIA kernel module is loaded was not read (" + facts.why_not("driver_parts") + ")"
    if module["loaded"]:
        return True, f"the NVIDIA kernel module {module.get('release') or ''} is loaded now".replace("  ", " ")
    return False, "the NVIDIA kernel module is not loaded now (/proc/driver/nvidia/version and /sys/module/nvidia " \
                  "are absent)"


def device_now(kl: Mapping[str, Any], key: str | None, gpus: dict[str, dict[str, Any]] | None,
               nvidia: bool = True) -> tuple[bool | None, str]:
    """Whether the record's PCI device is on the bus now (an NVIDIA one where ``nvidia``; None: not known),
    and the fact: the bus as sysfs shows it, else a GPU NVML lists at that address."""
    dev = next((d for d in kl.get("devices_now") or [] if d.get("bus_address") == key), None)
    if not key:
        return None, "the record names no PCI address to look for"
    if (dev is None or dev.get("present") is None) and key in (gpus or {}):
        return True, f"NVML lists {gpu_of(gpus, key)} at {key}.0 now"
    if dev is None or dev.get("present") is None:
        return None, f"whether {key}.0 is on the PCI bus now was not read" + (f" ({dev['error']})" if dev else "")
    if not dev["present"]:
        return False, f"no PCI device at {key}.0 now (not under /sys/bus/pci/devices)"
    if not nvidia:
        return True, f"a PCI device (vendor {dev.get('vendor') or 'not read'}) is at {key}.0 now, {link_state(dev)}"
    if (dev.get("vendor") or "").lower() != NVIDIA_VENDOR:
        return False, f"the PCI device at {key}.0 now is not NVIDIA's (vendor {dev.get('vendor') or 'not read'})"
    return True, f"NVIDIA device at {key}.0 is on the bus now, {link_state(dev)}"


def driver_release_now(facts: Facts) -> str | None:
    """The driver release running now: the loaded module's, else NVML's (None when neither is read)."""
    module = ((result_facts(facts, "driver_parts") or {}).get("module") or {})
    nv = result_facts(facts, "nvml") or {}
    return module.get("release") or nv.get("driver")


def _present_rows(kl: Mapping[str, Any], key: str | None, module: tuple[bool | None, str],
                  device: tuple[bool | None, str]) -> list[list[str]]:
    word = {True: "agrees", False: "contradicts", None: "cannot confirm"}
    src = "/dev/kmsg (this boot only)" if kl.get("source") == "kmsg" else "journalctl -k (this boot only)"
    return [[f"bus {key or '?'}: the record's boot", src, "this boot", "agrees"],
            [f"bus {key or '?'}: the NVIDIA kernel module", "/sys/module/nvidia", module[1], word[module[0]]],
            [f"bus {key or '?'}: the PCI device", "/sys/bus/pci/devices", device[1], word[device[0]]]]


@check("kernel.xid", title="NVIDIA Xid records in the kernel log", probes=("kernel_log",),
       optional=("nvml", "driver_parts"), explains=("xid",), layer=LAYER)
def check_xid(facts: Facts, me: CheckSpec) -> list[Finding]:
    kl, records, ev = _records(me, facts, "xids", "NVIDIA Xid record")
    gpus = _gpus_by_bus(facts)
    groups: dict[tuple[str | None, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r.get("bus_address"), r["xid"]), []).append(r)
    rows: list[list[str]] = []
    lines: list[str] = []
    hl: list[int] = []
    actions: set[str] = set()
    to_reset: list[dict[str, Any]] = []
    worst = "warn"
    module = module_now(facts)
    release = driver_release_now(facts)
    unsupported: list[str] = []  # why the node now does not support a drastic remedy
    faults: list[DriverFault] = []
    present_rows: list[list[str]] = []
    for (key, number), recs in groups.items():
        entry = xid(number)
        last = recs[-1]
        status = entry.status if entry else "warn"
        fault = driver_fault(number, release)
        device = device_now(kl, key, gpus)
        if _drastic(number):
            present_rows += _present_rows(kl, key, module, device)
            against = [fact for known, fact in (module, device) if known is not True]
            if against:
                status = "warn"
                unsupported.append(f"Xid {number} at {key or '?'}: " + "; ".join(against))
                lines.append(f"The node now does not support the record of Xid {number} at {key or '?'}: "
                             + "; ".join(against) + ". It is not judged failing hardware.")
        if fault is not None:
            faults.append(fault)
            lines.append(f"Xid {number} on driver {release}: {fault.what} (fixed in {fault.fixed_in}; "
                         f"{fault.source}). It is the driver's fault, not the GPU's.")
        if status == "fail":
            worst = "fail"
            hl.append(len(rows))
        meaning = entry.meaning if entry else f"not in zdoctor's table: see NVIDIA's Xid catalogue ({CATALOGUE})"
        who = gpu_of(gpus, key)
        proc = f"pid {last['pid']} ({last.get('name') or '?'})" if last.get("pid") else "-"
        rows.append([str(number), last.get("bus") or "?", who, str(len(recs)), when(recs[0].get("time")),
                     when(last.get("time")), proc, meaning])
        lines.append(f"Xid {number} at {last.get('bus')} ({who}), {count_of(len(recs), 'record')}, last at "
                     f"{when(last.get('time'))}: {meaning}. "
                     + (f"What to do: {entry.todo}." if entry else "What to do: read the catalogue entry."))
        if entry:
            actions.add(entry.action)
        g = (gpus or {}).get(key or "")
        if entry and entry.action == "RESET_GPU" and g is not None and g not in to_reset:
            to_reset.append(g)
    table = _table(facts, "Xid records by GPU", ["Xid", "bus", "GPU", "records", "first", "last", "process",
                                                 "meaning"], rows, hl)
    if faults:  # a driver bug: update the driver, never an RMA; the GPU's reset or a reboot only as a stopgap
        actions -= {"CONTACT_SUPPORT"}
    remedies = _xid_remedies(actions, to_reset, rma=not faults and not unsupported)
    if faults:
        remedies = _driver_update_remedies(facts, faults) + remedies
    if unsupported:
        why = "the node's present state does not support the record (" + "; ".join(unsupported) + ")"
        for r in remedies:
            if r.title != _RESTART_APP:
                r.recommended = False
                r.tried = False
                r.note = why
        remedies.sort(key=lambda r: not r.recommended)
    if present_rows:
        evidence_now = _table(facts, "The record vs the node now", ["what", "read from", "now", "the record"],
                              present_rows, [i for i, row in enumerate(present_rows) if row[3] != "agrees"])
        ev = [evidence_now, *ev]
    numbers = sorted({n for _k, n in groups})
    title = (f"NVIDIA Xid {', '.join(str(n) for n in numbers)} in the kernel log ("
             + "; ".join(sorted({gpu_of(gpus, k) for k, _n in groups})) + ")"
             + ("; the node now does not support it" if unsupported else "")
             + ("; a known driver fault" if faults else ""))
    return [me.finding(status=worst, title=title, detail="\n".join(lines + [scope(kl)]),
                       evidence=[table, *ev], remedies=remedies, explains=_xid_symptoms(facts, groups))]


def _xid_symptoms(facts: Facts, groups: dict[tuple[str | None, int], list[dict[str, Any]]]) -> list[str]:
    """The pasted or logged Xid lines of the same number at the same bus (however the bus is written)."""
    out = []
    for s in symptoms_of(facts):
        if s.kind != "xid":
            continue
        number = s.fields.get("xid")
        key = bus_address(s.fields.get("bus"))
        if number and number.isdigit() and (key, int(number)) in groups:
            out.append(s.id)
    return out


def _drastic(number: int) -> bool:
    """Whether the catalogue's action for Xid ``number`` takes the GPU or the node out of service."""
    entry = xid(number)
    return entry is not None and entry.action in ("RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT")


def _groups_now(facts: Facts) -> list[tuple[int, list[str], DriverFault | None]]:
    """Each Xid record's number, the present facts that do not support it (for a drastic one) and the
    driver fault that explains it."""
    kl = facts.of("kernel_log") or {}
    gpus = _gpus_by_bus(facts)
    module, release = module_now(facts), driver_release_now(facts)
    out = []
    for key, number in {(r.get("bus_address"), r["xid"]) for r in kl.get("xids") or []}:
        against = ([fact for known, fact in (module, device_now(kl, key, gpus)) if known is not True]
                   if _drastic(number) else [])
        out.append((number, against, driver_fault(number, release)))
    return out


@predicate("xid_not_supported_now", doc="an Xid record asks for a GPU reset, a reboot or an RMA, and the node now "
           "does not support it (no NVIDIA module loaded, no such device on the bus, or not known)",
           probes=("kernel_log", "nvml", "driver_parts"))
def xid_not_supported_now(facts: Facts) -> bool:
    return any(against for _n, against, _f in _groups_now(facts))


@predicate("xid_driver_fault", doc="an Xid record that the running driver release raises by a known bug of its own",
           probes=("kernel_log", "nvml", "driver_parts"))
def xid_driver_fault(facts: Facts) -> bool:
    return any(fault is not None for _n, _a, fault in _groups_now(facts))


_RESTART_APP = "Restart the job; if it faults again, find the failing kernel"


def _driver_update_remedies(facts: Facts, faults: list[DriverFault]) -> list[Remedy]:
    """Update the driver to a release of its branch with the fix, with the node's package manager(s)."""
    distro = (result_facts(facts, "driver_parts") or {}).get("distro")
    out = []
    for fault in {f.branch: f for f in faults}.values():
        for manager in pkgmgr.managers(distro):
            package = pkgmgr.nvidia_driver_package(fault.branch, manager.family, pkgmgr.is_ubuntu(distro))
            out.append(Remedy(
                title=f"Update the NVIDIA driver to {fault.fixed_in} or newer of branch {fault.branch} "
                      f"({manager.label})", commands=manager.upgrade(package), requires_root=True,
                note="not tried: it replaces the driver; reboot (or reload the modules) after it",
                explanation=f"{fault.what}; fixed in {fault.fixed_in} ({fault.source}). The GPU is not at fault: "
                            "no RMA."))
    return out


def _xid_remedies(actions: set[str], gpus: list[dict[str, Any]], rma: bool = True) -> list[Remedy]:
    out: list[Remedy] = []
    if "RESET_GPU" in actions or "RESTART_BM" in actions or "CONTACT_SUPPORT" in actions:
        if gpus and "RESTART_BM" not in actions:
            out.append(reset_remedy(gpus))
        out.append(reboot_remedy())
    if rma and actions & {"RESET_GPU", "RESTART_BM", "CONTACT_SUPPORT"}:
        out.append(Remedy(title="If the same Xid comes back after the reset: collect a bug report and ask for "
                                "an RMA", commands=["nvidia-bug-report.sh"], requires_root=True,
                          note="not tried: it is for the GPU's vendor",
                          explanation="The report (nvidia-bug-report.log.gz) holds the kernel log, the GPU's "
                                      "state and its error counters, which the vendor asks for."))
    if "RESTART_APP" in actions or "IGNORE" in actions:
        out.append(Remedy(title=_RESTART_APP,
                          commands=["export CUDA_LAUNCH_BLOCKING=1"],
                          note="not tried: it reruns the training",
                          explanation="Application faults (Xid 13, 31, 43) and contained errors (94) end only the "
                                      "process that hit them. With CUDA_LAUNCH_BLOCKING=1 set before the launch, "
                                      "the error is raised at the kernel that failed, not a later call."))
    return out


def _load_the_module(km: dict[str, Any]) -> list[Remedy]:
    """gpu.driver's remedies for a module of another release: reload it in its unload order, or reboot."""
    order = km.get("unload_order")
    return ([reload_remedy(order)] if order else []) + [reboot_remedy()]


# -- kernel.api-mismatch ---------------------------------------------------------------------------------


@check("kernel.api-mismatch", title="NVRM API mismatch records in the kernel log", probes=("kernel_log",),
       optional=("nvml", "driver_parts"), explains=("driver-mismatch",), layer=LAYER)
def check_api_mismatch(facts: Facts, me: CheckSpec) -> list[Finding]:
    kl, records, ev = _records(me, facts, "api_mismatch", "NVRM API mismatch record")
    last = records[-1]
    nv = result_facts(facts, "nvml") or {}
    lib = nv.get("library") or {}
    km = nv.get("kernel_module") or {}
    rows = [["the kernel log's record (user-space client)", when(last.get("time")), last.get("client") or "?"],
            ["the kernel log's record (kernel module)", when(last.get("time")), last.get("module") or "?"],
            ["loaded kernel module now", "/sys/module/nvidia/version", km.get("kernel_version") or "not read"],
            ["user-space library now", km.get("library") or "libnvidia-ml.so.1",
             km.get("library_version") or nv.get("driver") or "not read"],
            ["NVML now", "nvmlInit", lib.get("error") or ("starts" if lib.get("available") else "not read")]]
    table = _table(facts, "NVRM API mismatch: user-space vs kernel module", ["what", "from", "version"], rows,
                   [0, 1])
    said = (f"The NVIDIA kernel module logged at {when(last.get('time'))}: a user-space driver client of version "
            f"{last.get('client')} called a kernel module of version {last.get('module') or '?'} "
            f"({count_of(len(records), 'record')}). Every CUDA and NVML start fails that way until both are one "
            "release.")
    explains = [s.id for s in symptoms_of(facts) if s.kind == "driver-mismatch"
                and s.fields.get("client", last.get("client")) == last.get("client")
                and s.fields.get("module", last.get("module")) == last.get("module")]
    if lib.get("error_kind") == "driver_mismatch":
        return [me.finding(status="fail",
                        title=f"The driver's user space ({last.get('client')}) and kernel module "
                              f"({last.get('module') or '?'}) differ, and NVML still refuses to start",
                        detail=said + " NVML fails the same way now (gpu.driver): the mismatch stands.\n" + scope(kl),
                        evidence=[table, *ev], remedies=_load_the_module(km), explains=explains)]
    if lib.get("available") and nv.get("driver"):
        same = nv.get("driver") == last.get("client") or nv.get("driver") == last.get("module")
        return [me.finding(status="warn",
                           title=f"The kernel log holds an NVRM API mismatch ({last.get('client')} vs "
                                 f"{last.get('module') or '?'}); NVML starts now with driver {nv.get('driver')}",
                           detail=said + f" NVML starts now (driver {nv.get('driver')}), so the module was reloaded "
                                  "or the libraries replaced since" + ("" if same else ", with a third release")
                                  + ": a process started before then, or one that loads a private copy of the "
                                  "driver libraries (a container image with its own libcuda), can still fail.\n"
                                  + scope(kl), evidence=[table, *ev], explains=explains)]
    # NVML cannot confirm the record now: a reload or a reboot is listed, not recommended
    unconfirmed = "NVML could not confirm it now: " + (lib.get("error") or facts.why_not("nvml"))
    module = module_now(facts)
    if module[0] is not True:
        unconfirmed += "; " + module[1]
    remedies = _load_the_module(km)
    for r in remedies:
        r.recommended, r.note = False, f"the node's present state does not support the record ({unconfirmed})"
    return [me.finding(status="warn",
                       title=f"NVRM API mismatch in the kernel log: user space {last.get('client')}, kernel module "
                             f"{last.get('module') or '?'}; the node now cannot confirm it",
                       detail=said + " " + unconfirmed + ".\n" + scope(kl),
                       evidence=[table, *ev], remedies=remedies, explains=explains)]


# -- kernel.aer ------------------------------------------------------------------------------------------


@check("kernel.aer", title="PCIe AER errors in the kernel log", probes=("kernel_log",), optional=("nvml",),
       explains=("aer",), layer=LAYER)
def check_aer(facts: Facts, me: CheckSpec) -> list[Finding]:
    kl, records, ev = _records(me, facts, "aer", "PCIe AER error")
    gpus = _gpus_by_bus(facts)
    by_dev: dict[str | None, list[dict[str, Any]]] = {}
    for r in records:
        by_dev.setdefault(r.get("bus_address"), []).append(r)
    rows: list[list[str]] = []
    lines: list[str] = []
    hl: list[int] = []
    status = "warn"
    gpu_devs: list[dict[str, Any]] = []
    for key, recs in by_dev.items():
        sev = {r["severity"] for r in recs}
        worst = "fatal" if "fatal" in sev else "nonfatal" if "nonfatal" in sev else "corrected"
        who = gpu_of(gpus, key)
        is_gpu = gpus is not None and key in gpus
        if is_gpu:
            gpu_devs.append(gpus[key])  # type: ignore[index]
        if worst != "corrected":
            status = "fail"
            hl.append(len(rows))
        types = sorted({str(r["type"]) for r in recs if r.get("type")})
        rows.append([recs[-1].get("bus") or "?", who, worst, str(len(recs)), ", ".join(types) or "-",
                     when(recs[-1].get("time"))])
        lines.append(f"{recs[-1].get('bus')} ({who}): {count_of(len(recs), 'record')}, worst {worst}"
                     + (f" ({', '.join(types)})" if types else "") + f", last at {when(recs[-1].get('time'))}.")
    lines.append("Corrected errors are fixed by the link itself (a replay or retrain), but many of them mean a "
                 "marginal link that slows or drops; an uncorrected one loses a transaction, and a fatal one "
                 "takes the link down (a GPU then falls off the bus: Xid 79).")
    remedies = []
    unsupported = []  # the uncorrected errors' devices the bus does not show now
    for key, recs in by_dev.items():
        if any(r["severity"] != "corrected" for r in recs):
            known, fact = device_now(kl, key, gpus, nvidia=False)
            if known is not True:
                unsupported.append(fact)
    if unsupported:
        lines.append("The node now does not support these records: " + "; ".join(unsupported)
                     + ". They are not judged a failing link here.")
        status = "warn"
    if status == "fail" or unsupported:
        if gpu_devs:
            remedies.append(reset_remedy(gpu_devs))
        remedies.append(reboot_remedy())
        for r in remedies if unsupported else []:
            r.recommended, r.note = False, ("the node's present state does not support the record ("
                                            + "; ".join(unsupported) + ")")
    remedies.append(Remedy(title="Reseat the card and check the slot, riser and power cabling",
                           note="not tried: it is hands-on work on the node",
                           explanation="Repeated AER errors on one device are its link: the card's seating, a "
                                       "riser, the slot, or the BIOS's PCIe settings (Gen speed). Move the card "
                                       "to another slot to tell the card from the slot."))
    table = _table(facts, "PCIe AER errors by device", ["device", "GPU", "worst", "records", "types", "last"],
                   rows, hl)
    names = "; ".join(sorted({gpu_of(gpus, k) if gpus is not None and k in gpus else str(recs[-1].get("bus"))
                              for k, recs in by_dev.items()}))
    title = (f"PCIe AER {'uncorrected' if status == 'fail' or unsupported else 'corrected'} errors in the kernel "
             f"log ({names})" + ("; the node now does not support them" if unsupported else ""))
    explains = []
    for s in symptoms_of(facts):
        if s.kind == "aer" and bus_address(s.fields.get("bus")) in by_dev:
            explains.append(s.id)
    return [me.finding(status=status, title=title, detail="\n".join(lines + [scope(kl)]),
                       evidence=[table, *ev], remedies=remedies, explains=explains)]


# -- kernel.oom ------------------------------------------------------------------------------------------


def job_pids(facts: Facts) -> set[int]:
    """The pids of the ``--command`` run's processes (the livetrace probe's), to tie a kill to the job."""
    live = facts.of("livetrace") or {}
    return {p for p in live.get("pids") or [] if isinstance(p, int)}


@check("kernel.oom", title="OOM-killer records in the kernel log", probes=("kernel_log",), optional=("livetrace",),
       explains=("oom-kill", "killed"), layer=LAYER)
def check_oom(facts: Facts, me: CheckSpec) -> list[Finding]:
    kl, kills, ev = _records(me, facts, "ooms", "OOM kill")
    ours = job_pids(facts)
    rows: list[list[str]] = []
    lines: list[str] = []
    hl: list[int] = []
    explains: list[str] = []
    told: list[dict[str, Any]] = []  # the kills that are what the user saw
    for k in kills:
        tied = k.get("pid") in ours
        if tied:
            hl.append(len(rows))
        limit = f"{k['limit_kb']} kB" if isinstance(k.get("limit_kb"), int) else "-"
        rows.append([when(k.get("time")), f"{k.get('task')} (pid {k.get('pid')})", k.get("constraint") or "not logged",
                     k.get("task_memcg") or k.get("memcg") or "-", limit, "yes" if tied else "no"])
        what = _oom_what(k)
        lines.append(f"{when(k.get('time'))}: the OOM killer killed {k.get('task')} (pid {k.get('pid')}"
                     + (", a process of the --command run" if tied else "") + f") in cgroup "
                     f"{k.get('task_memcg') or k.get('memcg') or '(not logged)'}: {what}.")
        said = _oom_symptoms(facts, k) + (ids_for(facts, "killed", signal="9") if tied else [])
        explains += said
        if said or tied:
            told.append(k)
    # A kill of the job's own process, or one a message the user saw names, is the failure; others are news
    status = "fail" if hl or explains else "warn"
    table = _table(facts, "OOM kills in the kernel log", ["time", "killed", "constraint", "cgroup",
                                                          "memcg limit", "the --command run's"], rows, hl)
    last = kills[-1]
    title = (f"The OOM killer killed {count_of(len(kills), 'process')} (last {last.get('task')}, pid "
             f"{last.get('pid')}, {last.get('constraint') or 'constraint not logged'})")
    if ours and status == "warn":
        lines.append("None of them is a process of the --command run: they were other jobs on this node (or an "
                     "earlier run).")
    lines.append("offload.host-ram weighs these against the offload's host-memory needs.")
    return [me.finding(status=status, title=title, detail="\n".join(lines + [scope(kl)]),
                       evidence=[table, *ev], remedies=[], explains=sorted(set(explains)),
                       cause=kill_cause(told, job_cgroup_oom_kills(facts)) if told else None)]


def _oom_what(kill: dict[str, Any]) -> str:
    """What ran out for one kill, in the words of its one cause class."""
    cause = oom_cause(kill)
    if cause == CGROUP_LIMIT:
        return "its memory cgroup's limit was hit (CONSTRAINT_MEMCG): the job's share, not the host's RAM"
    if cause == HOST_RAM:
        return f"the host ran out of memory (constraint {kill.get('constraint') or 'not logged, not a memory cgroup'})"
    if cause == NUMA_LIMIT:
        return f"the memory of the NUMA nodes its cpuset or memory policy allows ran out ({kill.get('constraint')})"
    return f"{UNKNOWN_KILL} (constraint {kill.get('constraint') or 'not logged'}; {WHAT_WOULD_TELL} would tell)"


def _oom_symptoms(facts: Facts, kill: dict[str, Any]) -> list[str]:
    """The OOM messages the user saw that this kill is: the same pid where the message names one, else the
    same constraint ("oom-kill:constraint=..." names no pid of its own)."""
    out = []
    for s in symptoms_of(facts):
        if s.kind != "oom-kill":
            continue
        pid = s.fields.get("pid")
        same = pid == str(kill.get("pid")) if pid is not None else s.fields.get("constraint") == kill.get("constraint")
        if same:
            out.append(s.id)
    return out
