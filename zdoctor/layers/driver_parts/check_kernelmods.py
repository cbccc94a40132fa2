"""The running kernel against the NVIDIA modules on disk: after a kernel upgrade DKMS (or the driver's
package) must build the module for the new kernel; where it did not, the new kernel boots without one while
the kernel before it still has it, and nothing NVIDIA starts ("NVIDIA-SMI has failed because it couldn't
communicate with the NVIDIA driver", ``modprobe: FATAL: Module nvidia not found in directory ...``).
"""

from __future__ import annotations

import shlex
from typing import Any

from zdoctor.core import packages as pkgmgr
from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.symptoms.match import ids_for

NAME = "gpu.driver-for-kernel"
TITLE = "An NVIDIA module for the running kernel"
#: The kinds of the messages a kernel without its NVIDIA module gives (the catalogue's entries).
KINDS = ("kernel-module-missing", "driver-not-loaded")


def _explains(facts: Facts, running: str) -> list[str]:
    return ids_for(facts, "kernel-module-missing", kernel=running) + ids_for(facts, "driver-not-loaded")


def dkms_module(km: dict[str, Any]) -> dict[str, Any] | None:
    """The newest NVIDIA entry ``dkms status`` lists (``nvidia`` or ``nvidia-srv``...), or None."""
    listed = (km.get("dkms") or {}).get("entries") or []
    entries = [e for e in listed if str(e.get("module") or "").startswith("nvidia")]
    return entries[-1] if entries else None


def rebuild_remedies(km: dict[str, Any], running: str) -> list[Remedy]:
    """Build the module for ``running`` with DKMS, one remedy per package manager: the kernel's headers
    first where its tree has none, then ``dkms install`` of the version dkms lists (else ``autoinstall``)."""
    entry = dkms_module(km)
    tree = km.get("running_tree") or {}
    kernel = shlex.quote(running)
    build = (f"dkms install {shlex.quote(str(entry['module']))}/{shlex.quote(str(entry['version']))} -k {kernel}"
             if entry else f"dkms autoinstall -k {kernel}")
    out = []
    for mgr in pkgmgr.managers(km.get("distro")):
        headers = pkgmgr.kernel_headers_package(running, mgr.family)
        steps = [] if tree.get("headers") or not headers else mgr.install(shlex.quote(headers))
        out.append(Remedy(
            title=f"Build the NVIDIA module for kernel {running} with DKMS" + (f" ({mgr.label})" if steps else ""),
            commands=[*steps, build, "modprobe nvidia", "nvidia-smi"], requires_root=True,
            note="not tried: it installs packages and builds and loads a kernel module as root",
            explanation=("DKMS builds the module against the running kernel's headers"
                         + ("" if tree.get("headers") else f" ({headers}, which this kernel's tree lacks)" if headers
                            else "") + " and installs it under its tree; `modprobe nvidia` then loads it. "
                         "If the build fails, /var/lib/dkms/nvidia/*/build/make.log says why (a driver "
                         "release too old for this kernel needs a newer driver branch).")))
        if tree.get("headers"):
            break  # no package step: one remedy whatever the manager
    return out


def boot_remedy(km: dict[str, Any], kernel: str) -> Remedy:
    """Boot ``kernel``, whose tree holds the module (grubby sets it on RHEL-likes; GRUB's menu elsewhere)."""
    rhel = [m for m in pkgmgr.managers(km.get("distro")) if m.family == "dnf"]
    commands = [f"grubby --set-default /boot/vmlinuz-{shlex.quote(kernel)}"] if len(
        pkgmgr.managers(km.get("distro"))) == 1 and rhel else []
    return Remedy(title=f"Boot kernel {kernel}, which has the NVIDIA module", commands=[*commands, "systemctl reboot"],
                  requires_root=True, note="not tried: it reboots the node",
                  explanation=(f"Kernel {kernel} has the module under {km.get('root')}/{kernel}. "
                               + ("grubby makes it the default kernel." if commands else
                                  f"Choose it under GRUB's 'Advanced options' at boot (or `grub-reboot` with its "
                                  f"menu entry, listed by `grep -o \"menuentry '[^']*{kernel}[^']*'\" "
                                  "/boot/grub/grub.cfg`).")
                               + " Until the module is built for the newer kernel, every boot into it is "
                                 "without the driver."))


@check(NAME, title=TITLE, probes=("kernel_modules",), layer="driver-parts", explains=KINDS)
def check_driver_for_kernel(facts: Facts, me: CheckSpec) -> list[Finding]:
    km = facts.of("kernel_modules")
    ev = facts.evidence("kernel_modules")
    if km is None:
        return [me.not_checked(facts.why_not("kernel_modules"), ev)]
    if km.get("skipped"):
        return [me.not_checked(km["skipped"], ev)]
    kmd: dict[str, Any] = dict(km)
    running = kmd["running"]
    tree = kmd.get("running_tree") or {}
    others = kmd.get("others_with_module") or []
    if tree.get("nvidia"):
        mod = tree["nvidia"][0]
        return [me.finding("ok", f"The running kernel {running} has its NVIDIA module "
                                 f"({mod.get('version') or 'version unknown'})",
                           detail=f"{mod['path']}" + (f", built for {mod['vermagic']}" if mod.get("vermagic") else ""),
                           evidence=ev)]
    dkms = kmd.get("dkms") or {}
    where = f"{kmd['root']}/{running}"
    lines = [f"The running kernel is {running}; {where} " + ("holds no NVIDIA module (nvidia.ko) at any depth."
                                                              if tree else "does not exist.")]
    if tree.get("truncated"):
        lines.append(f"(The walk of {where} {tree['truncated']}.)")
    if not others:
        return [me.finding("ok",
                           f"No NVIDIA module is installed for any kernel under {kmd['root']}", evidence=ev,
                           detail=" ".join(lines) + " No other installed kernel has one either: no kernel was left "
                                  "behind by an upgrade; the driver is not installed as kernel modules here.")]
    lines.append("Installed kernels that have one: " + ", ".join(others) + ".")
    entry = dkms_module(kmd)
    if not dkms.get("installed"):
        lines.append(f"dkms is not installed ({dkms.get('error')}): the module of {others[-1]} did not come from "
                     "DKMS, so nothing rebuilds it for a new kernel. Not offered: a DKMS rebuild, because dkms is not "
                     "here; install the driver's module for this kernel the way it was installed (a precompiled "
                     "package for this kernel's release, such as Ubuntu's linux-modules-nvidia-*, or the .run "
                     "installer re-run under this kernel), or boot the kernel that has it.")
        remedies = [boot_remedy(kmd, others[-1])]
    else:
        ran = (f"`dkms status` ran (exit {dkms.get('exit_code')})" if dkms.get("exit_code") is not None
               else "`dkms status` did not run")
        listed = "; ".join(str(e.get("line")) for e in dkms.get("entries") or []) or "no module"
        lines.append(f"{ran} and lists: {listed}" + (f" ({dkms['error']})" if dkms.get("error") else "") + ".")
        if entry and not any(e.get("kernel") == running for e in dkms.get("entries") or []):
            lines.append(f"DKMS has {entry['module']}/{entry['version']} but built it for no kernel {running}: the "
                         "kernel was upgraded without its headers, or the build failed.")
        remedies = [*rebuild_remedies(kmd, running), boot_remedy(kmd, others[-1])]
    return [me.finding("fail", f"No NVIDIA module for the running kernel {running}; kernel {others[-1]} has one",
                       detail=" ".join(lines), evidence=ev, remedies=remedies,
                       explains=_explains(facts, running))]
