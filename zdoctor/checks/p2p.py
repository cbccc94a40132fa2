"""Check ``gpu.p2p``: whether GPU peer-to-peer can work on this node, from the IOMMU, ACS on the PCIe
bridges between the GPUs, NVML's P2P status per pair and (when asked) a bounded peer copy.

Remedies come in two kinds, each with what it costs: ``NCCL_P2P_DISABLE=1`` is the workaround (NCCL
copies through host memory: no hang, slower collectives inside the node); IOMMU passthrough or ACS off
on the switch ports is the fix (a kernel parameter and a reboot, or a root-only PCI write, and less
isolation between devices)."""

from __future__ import annotations

import shlex
from typing import Any

from ..gpu import p2p
from ..model import Finding, Remedy
from ..registry import Facts, check, predicate
from ..sysfile import kernel_parameters_remedy
from . import not_checked

WORKAROUND = Remedy(
    title="Workaround: NCCL_P2P_DISABLE=1 (NCCL copies through host memory)",
    commands=["export NCCL_P2P_DISABLE=1"], undo=["unset NCCL_P2P_DISABLE"],
    explanation="Cost: every intra-node collective goes GPU -> host memory -> GPU; no hang, but all-reduce and "
                "ZeRO-3 all-gathers inside the node get slower (NVLink and PCIe peer copies are not used).")


def _iommu_fix(iommu: dict[str, Any]) -> Remedy:
    vendor = "amd_iommu=on" if any(u.startswith("ivhd") for u in iommu.get("units") or []) else "intel_iommu=on"
    return kernel_parameters_remedy(
        [vendor, "iommu=pt"],
        title="Fix: IOMMU passthrough for host-owned devices (kernel parameter iommu=pt, then reboot)",
        explanation="Cost: a reboot; devices the host drives DMA without IOMMU translation (less protection "
                    "from a misbehaving device); VFIO/VM passthrough still works.")


def _acs_fix(bridges: list[str]) -> Remedy:
    return Remedy(
        title="Fix: turn ACS redirect off on the bridges between the GPUs (or disable ACS in the BIOS)",
        commands=[f"sudo setpci -s {shlex.quote(b)} ECAP_ACS+0x6.w=0000" for b in bridges],
        requires_root=True,
        explanation="Cost: lost at reboot (repeat it from a boot script, or use the BIOS setting); devices behind "
                    "the switch can reach each other directly, so VFIO passthrough loses isolation between them.")


def _pairs_text(pairs: dict[str, Any], want_ok: bool) -> list[str]:
    out = []
    for k, v in sorted(pairs.items()):
        ok = v == 0
        if ok == want_ok:
            out.append(f"GPU {k.replace('-', '->GPU ')}: {p2p.pair_status_text(v) if isinstance(v, int) else v}")
    return out


@check("gpu.p2p", title="GPU peer-to-peer: IOMMU, ACS, NVML status", probes=("p2p", "nvml"))
def check_p2p(facts: Facts) -> list[Finding]:
    f = facts.of("p2p")
    if f is None:
        return [not_checked("gpu.p2p", "GPU peer-to-peer", facts.why_not("p2p"))]
    ev = facts.evidence("p2p")
    gpus = f.get("gpus") or []
    nv = facts.of("nvml") or {}
    if not gpus and (not nv or nv.get("available") is False):
        return [Finding(id="gpu.p2p", status="skip", title="GPU peer-to-peer: not checked (no GPU list)",
                        detail=nv.get("error") or facts.why_not("nvml"), evidence=ev)]
    if len(gpus) < 2:
        return [Finding(id="gpu.p2p", status="ok", title="Fewer than two GPUs: no peer-to-peer traffic",
                        evidence=ev)]
    iommu = f.get("iommu") or {}
    acs = f.get("acs") or {}
    pairs = f.get("nvml_pairs") or {}
    out: list[Finding] = []
    redirect = sorted(b for b, a in acs.items() if (a or {}).get("redirect"))
    unknown_acs = sorted(b for b, a in acs.items() if (a or {}).get("redirect") is None)
    translated = iommu.get("mode") == "translated"
    nvml_ok = [k for k, v in pairs.items() if v == 0]
    lines = [f"IOMMU: {iommu.get('mode')} (units: {', '.join(iommu.get('units') or []) or 'none'}; kernel "
             f"parameters: {' '.join(f'{k}={v}' for k, v in (iommu.get('cmdline') or {}).items()) or 'none'})."]
    if redirect:
        lines.append(f"ACS redirects peer requests on {', '.join(redirect)}: peer traffic is sent up to the root "
                     "complex, where it is translated by the IOMMU or dropped.")
    if unknown_acs:
        why = (acs[unknown_acs[0]] or {}).get("why") or "lspci could not read the capability (run as root)"
        lines.append(f"ACS of {', '.join(unknown_acs)} unknown ({why}).")
    if pairs:
        lines += _pairs_text(pairs, False) or [f"NVML reports P2P read OK for all {len(pairs)} ordered pairs."]
    else:
        lines.append("NVML's per-pair P2P status was not read.")
    risky = (translated or redirect) and (nvml_ok or not pairs)
    copy = f.get("peer_copy")
    if copy:
        if copy.get("hung_pair") or copy.get("timed_out"):
            hp = copy.get("hung_pair")
            out.append(Finding(id="gpu.p2p.copy", status="fail",
                               title=f"Peer copy GPU {hp[0]} -> GPU {hp[1]} hung (killed at the time limit)" if hp
                               else "The peer-copy test hung (killed at the time limit)",
                               detail="\n".join(lines), evidence=ev,
                               remedies=[WORKAROUND] + ([_acs_fix(redirect)] if redirect else [])
                               + ([_iommu_fix(iommu)] if translated else [])))
        else:
            bad = [p for p in copy.get("pairs") or [] if not p.get("ok")]
            if bad:
                out.append(Finding(id="gpu.p2p.copy", status="fail",
                                   title=f"Peer copy GPU {bad[0]['src']} -> GPU {bad[0]['dst']} failed: "
                                         f"{bad[0].get('error') or 'the data arrived wrong'}",
                                   detail="\n".join(lines), evidence=ev, remedies=[WORKAROUND]))
            elif copy.get("pairs"):
                speeds = [p.get("gbps") for p in copy["pairs"] if p.get("gbps")]
                out.append(Finding(id="gpu.p2p.copy", status="ok",
                                   title=f"Peer copies between {len(copy['pairs'])} GPU pairs arrived intact"
                                         + (f" ({min(speeds)}-{max(speeds)} GB/s)" if speeds else ""),
                                   detail="\n".join(lines), evidence=ev))
    if risky:
        why = ("the IOMMU translates the GPUs' DMA" if translated else "") + \
              (" and " if translated and redirect else "") + \
              (f"ACS redirects peer traffic on {len(redirect)} bridge(s)" if redirect else "")
        rem = [WORKAROUND] + ([_acs_fix(redirect)] if redirect else []) + ([_iommu_fix(iommu)] if translated else [])
        out.append(Finding(
            id="gpu.p2p", status="warn",
            title=f"GPU peer-to-peer may hang: {why}, while the driver reports P2P available",
            detail="\n".join(lines) + "\nNCCL takes the driver's word and uses P2P; when the IOMMU or the root "
                   "complex blocks peer writes, the first all-reduce or ZeRO-3 all-gather never returns. "
                   + ("" if copy else "`zdoctor check --p2p-test` copies between the GPUs (bounded) to confirm."),
            evidence=ev, remedies=rem))
    elif not out or all(x.status == "ok" for x in out):
        not_avail = _pairs_text(pairs, False)
        if not_avail:
            out.append(Finding(id="gpu.p2p", status="ok",
                               title=f"Peer-to-peer is unavailable for {len(not_avail)} GPU pair(s): NCCL uses host "
                                     "memory there (no hang, slower)", detail="\n".join(lines), evidence=ev))
        else:
            out.append(Finding(id="gpu.p2p", status="ok" if pairs and not unknown_acs else "skip",
                               title="GPU peer-to-peer: IOMMU " + str(iommu.get("mode")) + ", no ACS redirect seen"
                                     + ("" if pairs else "; NVML's pair status unknown"),
                               detail="\n".join(lines), evidence=ev))
    return out


@predicate("gpu_p2p_blocked", doc="IOMMU translation or ACS redirect behind GPUs that report P2P, or a hung "
           "peer copy", probes=("p2p", "nvml"))
def gpu_p2p_blocked(facts: Facts) -> bool:
    return any(x.status in ("warn", "fail") for x in check_p2p(facts))
