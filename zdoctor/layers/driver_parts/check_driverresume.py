"""CUDA's "unknown error" (cudaErrorUnknown, 999) with NVML fine, against this boot's suspend/resume records and
the ``nvidia_uvm`` module: a node resumed without NVIDIA's suspend services comes back with nvidia_uvm's
state lost, and reloading nvidia_uvm (with no process holding /dev/nvidia-uvm) clears it.

The CUDA error is torch's own (the training interpreter's probe) or, where that gives none, the user's
message (the symptom's number). Nothing is reloaded here: the remedy runs only with an explicit yes.
"""

from __future__ import annotations

import time
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.driver_parts.probe_driverresume import SUSPEND_SERVICES
from zdoctor.layers.gpu import cuda
from zdoctor.layers.gpu.check_cuda import torch_cuda
from zdoctor.symptoms.match import ids_for, symptoms_of
from zdoctor.trials.gpureset import reboot_remedy

NAME = "gpu.driver-after-resume"
TITLE = "The driver's state after suspend/resume (nvidia_uvm)"
UNKNOWN = 999
RELOAD = "modprobe -r nvidia_uvm && modprobe nvidia_uvm"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t is not None else "an unknown time"


def cuda_unknown_error(facts: Facts) -> tuple[str | None, str]:
    """The CUDA 999 text and where it was seen: torch's probe first, else the user's message."""
    tc = torch_cuda(facts)
    err = cuda.cuda_init_error(tc.get("init_error"))
    if err and err.get("code") == UNKNOWN:
        return err["text"].rstrip("."), "torch's CUDA start in the training interpreter"
    seen = next((s for s in symptoms_of(facts) if s.kind == "cuda-error" and s.fields.get("number") == str(UNKNOWN)),
                None)
    if seen is not None:
        return seen.text[:300].rstrip("."), f"the message you gave ({seen.id}, {seen.where or seen.source})"
    return None, ""


def nvml_state(facts: Facts) -> tuple[bool | None, str]:
    """Whether NVML answers with GPUs (True), fails (False), or gave no answer (None), with why not."""
    nv = facts.of("nvml")
    if nv is None or nv.get("skipped"):
        return None, (nv or {}).get("skipped") or facts.why_not("nvml")
    return bool(nv.get("source") == "nvml" and nv.get("count")), ""


def holders_text(holders: list[dict[str, Any]]) -> str:
    return "; ".join(f"pid {h['pid']} ({h.get('user')}: {h.get('command')})" for h in holders[:8])


def reload_remedy(dr: dict[str, Any]) -> Remedy:
    """Reload nvidia_uvm: never tried while a process holds /dev/nvidia-uvm, and never without a yes."""
    holders = dr.get("holders") or []
    if holders:
        note = (f"not tried, because {count_of(len(holders), 'process')} hold{'s' if len(holders) == 1 else ''} "
                f"{dr.get('device')}: {holders_text(holders)}; stop them first, or the unload fails with 'Module "
                "nvidia_uvm is in use'")
    else:
        note = ("not tried: reloading a kernel module changes the node; it runs only when you say yes, as root"
                + (f" ({dr['holders_partial']}: a process zdoctor could not see may hold it)"
                   if dr.get("holders_partial") else ""))
    return Remedy(title="Reload nvidia_uvm (no reboot)", commands=[RELOAD], requires_root=True, note=note,
                  explanation="The unified-memory module is unloaded and loaded again with a fresh state; the "
                              "GPUs, the nvidia module and NVML are left alone. Every CUDA process must be stopped "
                              "first (they hold /dev/nvidia-uvm). Then start the training again.")


def services_remedy() -> Remedy:
    units = " ".join(SUSPEND_SERVICES) + " nvidia-hibernate.service"
    return Remedy(title="Let the driver save its state across suspend: enable NVIDIA's suspend services",
                  commands=[f"systemctl enable {units}"], requires_root=True,
                  note="not tried: it changes the node's services, and prevents the next occurrence rather than "
                       "fixing this one",
                  explanation="nvidia-suspend and nvidia-resume call the driver around each sleep so it saves and "
                              "restores the GPUs' state; with `options nvidia NVreg_PreserveVideoMemoryAllocations=1` "
                              "in /etc/modprobe.d (taking effect at the next module load) video memory is kept "
                              "too. On a training node, never suspending it at all (`systemctl mask sleep.target "
                              "suspend.target hibernate.target hybrid-sleep.target`) is the surer way.")


def _services_line(services: dict[str, Any]) -> tuple[str, bool]:
    """The services' states in words, and whether they are known not to be enabled."""
    if not services or all(v is None for v in services.values()):
        return "Whether nvidia-suspend.service is enabled is unknown (systemctl does not run here).", False
    words = ", ".join(f"{k} {v or 'unknown'}" for k, v in services.items())
    return f"NVIDIA's suspend services: {words}.", any(v not in ("enabled", None) for v in services.values())


@check(NAME, title=TITLE, probes=("driver_resume",), optional=("nvml", "pyenv"), layer="driver-parts",
       explains=("cuda-error",))
def check_driver_after_resume(facts: Facts, me: CheckSpec) -> list[Finding]:
    found = facts.of("driver_resume")
    ev = facts.evidence("driver_resume")
    if found is None or found.get("skipped"):
        return [me.not_checked((found or {}).get("skipped") or facts.why_not("driver_resume"), ev)]
    dr: dict[str, Any] = dict(found)
    uvm = dr.get("uvm") or {}
    sleeps = dr.get("sleeps") or []
    resumes = [s for s in sleeps if s.get("kind") == "resume"]
    errors = dr.get("sleep_errors") or []
    text, where = cuda_unknown_error(facts)
    nvml, nvml_why = nvml_state(facts)
    svc_line, svc_off = _services_line(dr.get("services") or {})
    uvm_said = ("The nvidia_uvm module is not loaded" if uvm.get("loaded") is False else
                f"The nvidia_uvm module is loaded (use count {uvm.get('use_count')}, sysfs refcnt "
                f"{uvm.get('refcnt') if uvm.get('refcnt') is not None else 'unknown'})" if uvm.get("loaded") else
                f"Whether the nvidia_uvm module is loaded is unknown ({uvm.get('error')})")
    holders = dr.get("holders") or []
    held = (f"{count_of(len(holders), 'process')} hold {dr.get('device')}: {holders_text(holders)}." if holders
            else f"No process holds {dr.get('device')}" + (f" ({dr['holders_partial']})." if dr.get("holders_partial")
                                                          else "."))
    explains = ids_for(facts, "cuda-error", number=str(UNKNOWN)) if text else []
    if text and uvm.get("loaded") is False:
        return [me.finding("fail", "CUDA 'unknown error' (999): nvidia_uvm is not loaded", evidence=ev,
                           explains=explains, remedies=[Remedy(
                               title="Load nvidia_uvm", commands=["modprobe nvidia_uvm"], requires_root=True,
                               note="not tried: loading a kernel module changes the node; it runs only when you say "
                                    "yes, as root",
                               explanation="CUDA needs the unified-memory module and its /dev/nvidia-uvm; "
                                           "nvidia-persistenced or `nvidia-modprobe -u -c=0` load it at boot.")],
                           detail=f"CUDA failed with cudaErrorUnknown, seen in {where}: {text}. {uvm_said}: CUDA "
                                  "cannot start without it.")]
    if text and resumes:
        last = resumes[-1]
        if nvml is False:
            return [me.finding("warn", f"CUDA 'unknown error' after a resume at {_when(last.get('time'))}, and NVML "
                                       "fails too", evidence=ev, remedies=[reboot_remedy()],
                               detail=f"CUDA failed ({where}: {text}) and NVML does not answer either: the driver "
                                      "itself is down, more than nvidia_uvm's state; reloading nvidia_uvm alone "
                                      "will not do.")]
        lines = [f"CUDA failed with cudaErrorUnknown, seen in {where}: {text}.",
                 f"The node resumed from a suspend at {_when(last.get('time'))} ({last.get('source')}: "
                 f"'{last.get('text')}'), {count_of(len(resumes), 'resume')} in this boot.",
                 "NVML answers with the GPUs, so the driver itself runs." if nvml else
                 f"NVML gave no answer here ({nvml_why}), so whether the driver itself answers is unknown.",
                 f"{uvm_said}. {held}", svc_line,
                 "A resume without the driver's suspend services leaves nvidia_uvm's state lost: NVML works, "
                 "every CUDA start fails with 'unknown error' until nvidia_uvm is reloaded or the node reboots."]
        remedies = [reload_remedy(dr), *([services_remedy()] if svc_off else []), reboot_remedy()]
        return [me.finding("fail", f"CUDA 'unknown error' (999) after the node resumed from suspend at "
                                   f"{_when(last.get('time'))}: nvidia_uvm lost its state", detail=" ".join(lines),
                           evidence=ev, explains=explains, remedies=remedies)]
    if not sleeps and len(errors) >= 2:
        return [me.not_checked("no suspend/resume record could be read: " + "; ".join(errors), ev)]
    if resumes:
        return [me.finding("warn", f"The node resumed from suspend at {_when(resumes[-1].get('time'))}",
                           evidence=ev, remedies=[services_remedy()] if svc_off else [],
                           detail=f"{count_of(len(resumes), 'resume')} in this boot. No CUDA 'unknown error' was "
                                  f"seen, but after a resume without NVIDIA's suspend services CUDA may fail with "
                                  f"it. {uvm_said}. {svc_line}")]
    if text:
        return [me.finding("ok", "No suspend/resume in this boot: the CUDA 'unknown error' is not a resume's",
                           evidence=ev, detail=f"CUDA failed ({where}: {text}), but neither the kernel log nor "
                                               "systemd-sleep recorded a suspend this boot"
                                               + (f" ({'; '.join(errors)})" if errors else "")
                                               + f". {uvm_said}. The kernel log's Xid records come next.")]
    return [me.finding("ok", "No suspend/resume in this boot", evidence=ev,
                       detail="Neither the kernel log nor systemd-sleep recorded a suspend this boot"
                              + (f" ({'; '.join(errors)})" if errors else "") + f". {uvm_said}.")]
