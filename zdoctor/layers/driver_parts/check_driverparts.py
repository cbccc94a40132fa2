"""The driver's parts against each other: the loaded kernel module, the user-space libraries, the package
record and its last change, Fabric Manager on NVSwitch systems, and the libcuda.so.1 the training
process resolves (forward compatibility included).

Each part that disagrees is the CUDA start error it causes: 803 for a module and libraries of different
releases, 802 for a Fabric Manager not running or of another release, 804 for a forward-compatibility
libcuda on a GPU it is not for (:data:`zdoctor.layers.gpu.cuda.CUDA_INIT_ERROR_LAYERS`).
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Any

from zdoctor.core import packages as pkgmgr
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.driver_parts import fabricmanager, fwcompat
from zdoctor.layers.gpu.cuda import CUDA_INIT_ERRORS
from zdoctor.readers.gpufacts import result_facts
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.gpureset import reboot_remedy, reload_remedy

NAME = "gpu.driver-parts"
TITLE = "The driver's parts"
#: What an automatic upgrade calls itself in the history.
AUTOMATIC = ("unattended-upgrade", "dnf-automatic", "yum-cron", "packagekit")


def _when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch)) if epoch else "an unknown time"


def _err(code: int) -> str:
    name, msg, _ = CUDA_INIT_ERRORS[code]
    return f"CUDA error {code} ({name}, '{msg}')"


def _gpus(facts: Facts) -> list[dict[str, Any]] | None:
    nv = facts.of("nvml") or {}
    return [dict(g) for g in nv.get("gpus") or []] if nv.get("count") else None


@check(NAME, title=TITLE, probes=("driver_parts",), optional=("nvml",), layer="driver-parts",
       explains=("driver-mismatch", "cuda-error", "fabric-manager-mismatch"),
       findings=(f"{NAME}.module", f"{NAME}.fabric-manager", f"{NAME}.libcuda", f"{NAME}.forward-compat"))
def check_driver_parts(facts: Facts, me: CheckSpec) -> list[Finding]:
    dp = result_facts(facts, "driver_parts")
    if dp is None or dp.get("skipped"):
        why = (dp or {}).get("skipped") or facts.why_not("driver_parts")
        return [me.not_checked(why, facts.evidence("driver_parts"), sub="not-checked")]
    ev = facts.evidence("driver_parts", labels=(TITLE,))
    return [module_finding(facts, dp, ev), fabric_finding(facts, dp), libcuda_finding(facts, dp)]


# -- the module against the libraries and the package record ---------------------------------------------


def _automatic(change: dict[str, Any]) -> bool:
    return any(a in (change.get("commandline") or "") for a in AUTOMATIC)


def hold_advice(dp: dict[str, Any], change: dict[str, Any]) -> str | None:
    """How to keep automatic upgrades off the driver, for the node's package manager (a sentence: it
    prevents the next occurrence, it does not fix this one)."""
    names = " ".join(shlex.quote(n) for n in sorted({c["name"] for c in change.get("changes") or [] if c.get("new")}))
    if not names:
        return None
    manager = (dp.get("packages") or {}).get("manager")
    how = pkgmgr.managers_of_owner(manager, dp.get("distro"))[0].hold(names)
    return (f"An automatic upgrade did it: after the reboot, {how} keeps the next one off the driver, so driver "
            "upgrades happen when you choose, with the node drained and a reboot planned.")


def module_release(facts: Facts, dp: dict[str, Any]) -> tuple[str | None, str]:
    """The loaded module's release and where it was read: its two files, else NVML's driver version (NVML
    starts only when the module and its library agree, and then reports the module's release)."""
    m = dp.get("module") or {}
    if m.get("release"):
        return m["release"], "/sys/module/nvidia/version" if m.get("sys_release") else "/proc/driver/nvidia/version"
    nv = facts.of("nvml") or {}
    if nv.get("source") == "nvml" and nv.get("driver"):
        return str(nv["driver"]), "NVML nvmlSystemGetDriverVersion"
    return None, "-"


def module_finding(facts: Facts, dp: dict[str, Any], ev: list[Evidence]) -> Finding:
    fid = f"{NAME}.module"
    m, libs, pk = dp.get("module") or {}, dp.get("libraries") or {}, dp.get("packages") or {}
    module, source = module_release(facts, dp)
    nvml_rel = (libs.get("nvml") or {}).get("release")
    pkg_rel = pk.get("release")
    change = (dp.get("history") or {}).get("last_change")
    boot = dp.get("boot_time")
    lines: list[str] = []
    if m.get("sys_release") and m.get("proc_release") and m["sys_release"] != m["proc_release"]:
        lines.append(f"/sys/module/nvidia/version says {m['sys_release']} and /proc/driver/nvidia/version says "
                     f"{m['proc_release']}.")
    others = {"libnvidia-ml.so.1": nvml_rel, "the package record": pkg_rel}
    differ = {k: v for k, v in others.items() if v and module and v != module}
    known = {k: v for k, v in others.items() if v}
    if not module:
        return Finding(id=fid, status="skip", title="The loaded kernel module's release: unknown",
                       detail="The NVIDIA module is loaded but neither /sys/module/nvidia/version nor "
                              f"/proc/driver/nvidia/version names its release ({m.get('proc_version') or '-'}).",
                       evidence=ev)
    if not known:
        return Finding(id=fid, status="skip",
                       title=f"Kernel module {module} ({source}): the user-space release is unknown, nothing to "
                             "compare",
                       detail="libnvidia-ml.so.1 is not in the loader's cache with a versioned file name, and "
                              f"the package record names no driver ({pk.get('error') or 'no driver package'}).",
                       evidence=ev)
    if not differ:
        parts = ", ".join(f"{k} {v}" for k, v in known.items())
        return Finding(id=fid, status="ok", title=f"Kernel module {module} and the installed driver agree",
                       detail=f"The module in memory is {module} ({source}); {parts}."
                              + (" " + " ".join(lines) if lines else ""),
                       evidence=ev)
    newest = next(iter(differ.values()))
    lines.insert(0, f"The kernel module in memory is {module}; " + "; ".join(f"{k} is {v}" for k, v in known.items())
                 + ". NVML refuses to start ('Driver/library version mismatch'), nvidia-smi fails the same way and "
                 f"CUDA programs fail at start with {_err(803)}.")
    title = f"Kernel module {module} is still in memory, the installed driver is {newest}"
    if change and change.get("when") and boot and change["when"] > boot:
        drv = ", ".join(f"{c['name']} {c.get('new') or '(removed)'}" for c in change["changes"])
        who = change.get("commandline") or change.get("requested_by") or "the package manager"
        lines.append(f"The driver package changed to {drv} at {_when(change['when'])} ({who}), after this boot at "
                     f"{_when(boot)}, and the module still in memory is {module}: reboot or reload the modules.")
        title += ": upgraded after this boot, reboot or reload"
    elif change and change.get("when") and boot:
        lines.append(f"The last driver change ({_when(change['when'])}) was before this boot ({_when(boot)}): the "
                     "module that loaded at boot is still not the installed release, so the module package (DKMS "
                     "build, linux-modules-nvidia, kmod-nvidia) or the initramfs holds another release: "
                     "`modinfo -F version nvidia` names the one on disk.")
    else:
        lines.append("No driver change is recorded in the package history (" +
                     (", ".join((dp.get("history") or {}).get("read") or []) or "no history found") + ").")
    order = m.get("unload_order")
    remedies = [reload_remedy(order)] if order else []
    remedies.append(reboot_remedy())
    if change and _automatic(change):
        advice = hold_advice(dp, change)
        if advice:
            lines.append(advice)
    return Finding(id=fid, status="fail", title=title, detail="\n".join(lines), evidence=ev, remedies=remedies,
                   explains=ids_for(facts, "driver-mismatch") + ids_for(facts, "cuda-error", number="803"))


# -- Fabric Manager -------------------------------------------------------------------------------------


def _fm_remedies(dp: dict[str, Any], module: str) -> list[Remedy]:
    branch = module.split(".")[0]
    pk = dp.get("packages") or {}
    drv = next((p for p in pk.get("installed") or [] if p.get("release") == module
                and p["name"].startswith(("libnvidia-compute", "nvidia-driver"))), None)
    out = []
    for mgr in pkgmgr.managers(dp.get("distro")):
        package = pkgmgr.fabricmanager_pinned(branch, module, (drv or {}).get("version"), mgr.family)
        same = ("the version pinned is the driver package's own (same repository revision)."
                if mgr.family == "apt" else "the package's version is the driver's release.")
        out.append(Remedy(title=f"Install Fabric Manager {module}, the driver's exact release ({mgr.label})",
                          commands=[*mgr.install(shlex.quote(package)), f"systemctl restart {fabricmanager.UNIT}",
                                    f"systemctl is-active {fabricmanager.UNIT}"],
                          requires_root=True, note="not tried: it installs a package and restarts a service",
                          explanation=f"Fabric Manager must be the driver's exact release; {same}"))
    return out


def _restart_remedy() -> Remedy:
    return Remedy(title="Start Fabric Manager and keep it enabled",
                  commands=[f"systemctl enable --now {fabricmanager.UNIT}", f"systemctl restart {fabricmanager.UNIT}",
                            f"systemctl is-active {fabricmanager.UNIT}"],
                  requires_root=True, note="not tried: it restarts a service",
                  explanation="If it stops again, `journalctl -u nvidia-fabricmanager -n 50` says why (a release "
                              "that is not the driver's, an NVSwitch it cannot reach).")


def fabric_finding(facts: Facts, dp: dict[str, Any]) -> Finding:
    fid = f"{NAME}.fabric-manager"
    fab = dp.get("fabric") or {}
    module = module_release(facts, dp)[0]
    states = fabricmanager.fabric_state_from_smi(_gpus(facts) or [])
    nvs = fab.get("nvswitch") or []
    if not nvs:
        return Finding(id=fid, status="ok", title="No NVSwitch on this node: Fabric Manager is not needed",
                       detail="No /dev/nvidia-nvswitch* device, no /proc/driver/nvidia-nvswitch and no NVIDIA PCI "
                              "device of class 0x0680 (NVSwitch)."
                              + (f" nvidia-smi reports the GPUs' fabric state as {', '.join(states)}."
                                 if states else ""))
    unit = fab.get("unit") or {}
    rows = [["NVSwitch", "device nodes, /proc, PCI", "; ".join(nvs)[:300]],
            ["kernel module", "/sys/module/nvidia/version", module or "unknown"],
            ["Fabric Manager release", fab.get("version_source") or "-", fab.get("version") or "unknown"],
            ["unit nvidia-fabricmanager", "systemctl show",
             fab.get("unit_error") or f"{unit.get('active')}/{unit.get('sub')} (load {unit.get('load')}, "
                                      f"status {unit.get('status')})"],
            ["Fabric Manager log", "journalctl -u nvidia-fabricmanager",
             (fab.get("log_mismatch") or {}).get("line") or fab.get("log_error") or "no version mismatch logged"]]
    if states:
        rows.append(["GPU fabric state", "nvidia-smi -q", ", ".join(states)])
    mism = fab.get("log_mismatch")
    fm = fab.get("version")
    differs = bool(fm and module and fwcompat.version_key(fm) != fwcompat.version_key(module))
    hl = [2] if differs else [3] if unit.get("running") is False else [4] if mism else []
    ev = [Evidence.of_table("Fabric Manager against the driver", ["what", "from", "value"], rows, hl)]
    explains = ids_for(facts, "cuda-error", number="802") + ids_for(facts, "fabric-manager-mismatch")
    if differs or mism:
        fm_rel = fm if differs else (mism or {}).get("fm")
        detail = (f"This is an NVSwitch system: its GPUs are usable only once Fabric Manager has set the NVLink "
                  f"fabric up, and Fabric Manager runs only beside the driver's exact release. Fabric Manager is "
                  f"{fm_rel}, the kernel module is {module or (mism or {}).get('driver')}: it refuses to start "
                  "('fabric manager NVIDIA GPU driver interface version ... don't match with driver version ...'), "
                  f"so every CUDA program fails at start with {_err(802)}.")
        return Finding(id=fid, status="fail", title=f"Fabric Manager {fm_rel} is not the driver's release "
                       f"{module or '?'}: CUDA error 802 (system not yet initialized)", detail=detail, evidence=ev,
                       remedies=_fm_remedies(dp, module) if module else [], explains=explains)
    if unit.get("running") is False or unit.get("load") == "not-found":
        what = "is not installed" if unit.get("load") == "not-found" else \
            f"is {unit.get('active')}/{unit.get('sub')} (exit status {unit.get('status')})"
        rem = _fm_remedies(dp, module) if unit.get("load") == "not-found" and module else [_restart_remedy()]
        return Finding(id=fid, status="fail", title=f"Fabric Manager {what} on an NVSwitch system: CUDA error 802",
                       detail=f"The unit nvidia-fabricmanager {what}. Without it the NVLink fabric is never set up "
                              f"and every CUDA program fails at start with {_err(802)}.", evidence=ev, remedies=rem,
                       explains=explains)
    if fab.get("unit_error") and not fm:
        return Finding(id=fid, status="skip", title="Fabric Manager: not examined",
                       detail=f"This is an NVSwitch system, but Fabric Manager could not be examined: "
                              f"{fab['unit_error']}; and its release is unknown (no Fabric Manager package recorded, "
                              "no nv-fabricmanager that runs).", evidence=ev)
    if not fm or unit.get("running") is None:
        known = f"release {fm}" if fm else "release unknown"
        return Finding(id=fid, status="skip", title=f"Fabric Manager: {known}, its state "
                       f"{'unknown: ' + fab['unit_error'] if fab.get('unit_error') else 'known'}",
                       detail="Part of Fabric Manager could not be read; what was read is in the table.", evidence=ev)
    return Finding(id=fid, status="ok", title=f"Fabric Manager {fm} runs, the driver's release",
                   detail="The NVSwitch fabric's manager is active and of the kernel module's release.", evidence=ev)


# -- the libcuda.so.1 the training process takes -----------------------------------------------------


def _llp_without(llp: str, drop: str) -> str:
    return ":".join(p for p in llp.split(":") if p and os.path.normpath(p) != os.path.normpath(drop))


def libcuda_finding(facts: Facts, dp: dict[str, Any]) -> Finding:
    """``gpu.driver-parts.libcuda``, or ``gpu.driver-parts.forward-compat`` when the library is a
    forward-compatibility one newer than the module."""
    fid = f"{NAME}.libcuda"
    lc = (dp.get("libraries") or {}).get("libcuda") or {}
    env = (dp.get("libraries") or {}).get("env") or {}
    module = module_release(facts, dp)[0]
    mounted = dp.get("mounted") or []
    rows = [["kernel module", "/sys/module/nvidia/version", module or "unknown"],
            ["libcuda.so.1", f"{lc.get('path') or '-'} {lc.get('label') or ''}".strip(), lc.get("realpath") or "-"],
            ["its release", "the real file's name", lc.get("release") or "unknown"],
            ["its package", (lc.get("owner") or {}).get("how") or "-",
             " ".join(x for x in ((lc.get("owner") or {}).get("name"), (lc.get("owner") or {}).get("version")) if x)
             or "unknown"],
            ["LD_LIBRARY_PATH", "training environment", env.get("LD_LIBRARY_PATH") or "(unset)"]]
    rows += [["mounted into this file system", m.get("source") or "-", m["point"]] for m in mounted[:6]]
    mnt = lc.get("mount") or {}
    if mnt.get("point") not in (None, "/"):
        rows.append(["libcuda's file system", f"{mnt.get('fstype')} {mnt.get('source')}",
                     f"mounted at {mnt['point']} (a container runtime's or the host's mount)"])
    v = fwcompat.libcuda_verdict(lc.get("realpath"), module, _gpus(facts))
    hl = [1, 2, 3] if v["code"] else []
    ev = [Evidence.of_table("The libcuda.so.1 the training process resolves", ["what", "from", "value"], rows, hl)]
    if lc.get("tried"):
        ev.append(Evidence.note("Where the loader looked for libcuda.so.1", "\n".join(lc["tried"])))
    who = lc.get("process") or "the training interpreter"
    if not lc.get("realpath"):
        return Finding(id=fid, status="warn" if lc.get("process") else "skip",
                       title="No libcuda.so.1 for the training process" if lc.get("process") else
                       "The libcuda.so.1 of the training process: not examined",
                       detail=(f"{who} would not find libcuda.so.1 ({lc.get('error')}): torch reports 'Found no "
                               "NVIDIA driver on your system'. The driver's user-space libraries are missing from "
                               "the loader's cache and LD_LIBRARY_PATH (in a container: started without the NVIDIA "
                               "runtime).") if lc.get("process") else (lc.get("error") or "unknown"), evidence=ev)
    where = f"{lc['realpath']} {lc.get('label') or ''}".strip()
    verdict = v["verdict"]
    if verdict == "same":
        return Finding(id=fid, status="ok", title=f"The training process takes libcuda {v['library']}, the module's "
                       "release", detail=f"{who} resolves libcuda.so.1 to {where}.", evidence=ev)
    if verdict == "unknown":
        return Finding(id=fid, status="skip", title="The libcuda.so.1 of the training process: release unknown",
                       detail=f"{who} resolves libcuda.so.1 to {where}, whose file name names no release "
                              f"(module {module or 'unknown'}).", evidence=ev)
    llp = env.get("LD_LIBRARY_PATH") or ""
    cdir = os.path.dirname(lc.get("path") or lc["realpath"])
    drop = []
    if lc.get("via") == "LD_LIBRARY_PATH" and lc.get("dir"):
        rest = _llp_without(llp, lc["dir"])
        drop.append(Remedy(title=f"Take {lc['dir']} off LD_LIBRARY_PATH for the training",
                           commands=[f"export LD_LIBRARY_PATH={shlex.quote(rest)}" if rest else
                                     "unset LD_LIBRARY_PATH"], verified=None,
                           note="not tried: zdoctor does not start CUDA on this node to see",
                           explanation="The driver's own libcuda (from the loader's cache) is then taken. Change it "
                                       "where the training's environment is set (job script, container image "
                                       "ENV, module file)."))
    fwd = f"{NAME}.forward-compat"
    if verdict == "forward":
        return Finding(id=fwd, status="ok", title=f"Forward compatibility: libcuda {v['library']} on kernel module "
                       f"{module}, on data centre GPUs", evidence=ev,
                       detail=f"{who} resolves libcuda.so.1 to {where}, a forward-compatibility library newer than "
                              f"the module; the GPUs are data centre GPUs, which forward compatibility is for "
                              f"({fwcompat.SOURCE}).")
    if verdict == "forward-unknown":
        return Finding(id=fwd, status="warn", title=f"Forward compatibility (libcuda {v['library']} on module "
                       f"{module}): whether the GPUs support it is unknown", evidence=ev, remedies=drop,
                       detail=f"{who} resolves libcuda.so.1 to {where}. Forward compatibility is only for data "
                              f"centre GPUs ({fwcompat.SOURCE}); the GPUs here are "
                              + (", ".join(v["unknown_gpus"]) or "not known (NVML gave no GPU list)")
                              + f". On any other GPU, CUDA programs fail at start with {_err(804)}.")
    if verdict == "forward-unsupported":
        return Finding(
            id=fwd, status="fail", evidence=ev, remedies=drop + [Remedy(
                title="Or run without the compat libraries, on a driver that supports torch's CUDA",
                commands=[], verified=None, note="not tried: it changes the image or the host's driver",
                explanation=f"In a container, an image's {cdir} is registered by the image (ld.so.conf.d, "
                            "LD_LIBRARY_PATH): start it with that removed, or upgrade the host driver to a "
                            "branch that supports the image's CUDA so no compat library is needed.")],
            title=f"Forward-compatibility libcuda {v['library']} on {', '.join(v['unsupported'])}: CUDA error 804",
            explains=ids_for(facts, "cuda-error", number="804"),
            detail=f"{who} resolves libcuda.so.1 to {where}, a forward-compatibility library (newer than kernel "
                   f"module {module}). Forward compatibility is only for data centre GPUs ({fwcompat.SOURCE}); "
                   f"{', '.join(v['unsupported'])} is not one, so CUDA programs fail at start with {_err(804)}.")
    # older, or newer outside a compat directory: another release than the module
    kind = "older than" if verdict == "older" else "newer than"
    return Finding(id=fid, status="fail", evidence=ev, remedies=drop or [reboot_remedy()],
                   title=f"The training process takes libcuda {v['library']}, {kind} kernel module {module}: "
                         "CUDA error 803",
                   explains=ids_for(facts, "cuda-error", number="803"),
                   detail=f"{who} resolves libcuda.so.1 to {where}, another release than the kernel module "
                          f"{module}" + (" (and not a forward-compatibility library)" if verdict == "newer" else "")
                          + f": CUDA programs fail at start with {_err(803)}.")
