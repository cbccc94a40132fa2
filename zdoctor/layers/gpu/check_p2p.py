"""Check ``gpu.p2p``: whether GPU peer-to-peer can work on this node, from the IOMMU, ACS on the PCIe
bridges between the GPUs, NVML's P2P status per pair and (when asked) a bounded peer copy.

Remedies come in two kinds, each with what it costs: ``NCCL_P2P_DISABLE=1`` is the workaround (NCCL
copies through host memory: no hang, slower collectives inside the node); IOMMU passthrough or ACS off
on the switch ports is the fix (a kernel parameter and a reboot, or a root-only PCI write, and less
isolation between devices)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import P2pIommu
from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.edit.sysfile import kernel_parameters_remedy
from zdoctor.layers.gpu import p2p
from zdoctor.layers.kernel_log.kernlog import records_at

WORKAROUND = Remedy(
    title="Workaround: NCCL_P2P_DISABLE=1 (NCCL copies through host memory)",
    commands=["export NCCL_P2P_DISABLE=1"], undo=["unset NCCL_P2P_DISABLE"],
    explanation="Cost: every intra-node collective goes GPU -> host memory -> GPU; no hang, but all-reduce and "
                "ZeRO-3 all-gathers inside the node get slower (NVLink and PCIe peer copies are not used).")


def _iommu_fix(iommu: P2pIommu) -> Remedy:
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


@check("gpu.p2p", title="GPU peer-to-peer: IOMMU, ACS, NVML status", probes=("p2p", "nvml"),
       findings=("gpu.p2p.copy",), optional=("kernel_log",))
def check_p2p(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("p2p"), facts.why_not("p2p"))
    ev = facts.evidence("p2p")
    gpus = f.get("gpus") or []
    nv = facts.of("nvml") or {}
    if not gpus and (not nv or nv.get("available") is False):
        return [me.finding(status="skip", title="GPU peer-to-peer: not checked (no GPU list)",
                           detail=nv.get("error") or facts.why_not("nvml"), evidence=ev)]
    if len(gpus) < 2:
        return [me.finding(status="ok", title="Fewer than two GPUs: no peer-to-peer traffic",
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
            what = f"Peer copy GPU {hp[0]} -> GPU {hp[1]} hung (killed at the time limit)" if hp \
                else "The peer-copy test hung (killed at the time limit)"
            visible = translated or redirect
            detail = list(lines)
            if not visible:
                what += ": peer path broken, cause not visible"
                detail.append(_not_visible(iommu, unknown_acs, facts.of("kernel_log"), [
                    g.get("pci_bus_id") for i, g in gpus_by_index(nv).items() if hp and i in hp]))
            out.append(me.finding(sub="copy", status="fail", title=what, detail="\n".join(detail), evidence=ev,
                                  remedies=[WORKAROUND] + ([_acs_fix(redirect)] if redirect else [])
                                  + ([_iommu_fix(iommu)] if translated else [])))
        else:
            bad = [p for p in copy.get("pairs") or [] if not p.get("ok")]
            if bad:
                out.append(me.finding(sub="copy", status="fail",
                                      title=f"Peer copy GPU {bad[0]['src']} -> GPU {bad[0]['dst']} failed: "
                                            f"{bad[0].get('error') or 'the data arrived wrong'}",
                                      detail="\n".join(lines), evidence=ev, remedies=[WORKAROUND]))
            elif copy.get("pairs"):
                out.append(_copy_speed(me, copy["pairs"], gpus_by_index(nv), f.get("nvlinks") or {}, lines, ev))
    if risky:
        why = ("the IOMMU translates the GPUs' DMA" if translated else "") + \
              (" and " if translated and redirect else "") + \
              (f"ACS redirects peer traffic on {count_of(len(redirect), 'bridge')}" if redirect else "")
        rem = [WORKAROUND] + ([_acs_fix(redirect)] if redirect else []) + ([_iommu_fix(iommu)] if translated else [])
        out.append(me.finding(
            status="warn",
            title=f"GPU peer-to-peer may hang: {why}, while the driver reports P2P available",
            detail="\n".join(lines) + "\nNCCL takes the driver's word and uses P2P; when the IOMMU or the root "
                   "complex blocks peer writes, the first all-reduce or ZeRO-3 all-gather never returns. "
                   + ("" if copy else "`zdoctor check --p2p-test` copies between the GPUs (bounded) to confirm."),
            evidence=ev, remedies=rem))
    elif not out or all(x.status == "ok" for x in out):
        not_avail = _pairs_text(pairs, False)
        if not_avail:
            out.append(me.finding(status="ok",
                                  title=f"Peer-to-peer is unavailable for {count_of(len(not_avail), 'GPU pair')}: "
                                        "NCCL uses host memory there (no hang, slower)",
                                  detail="\n".join(lines), evidence=ev))
        else:
            out.append(me.finding(status="ok" if pairs and not unknown_acs else "skip",
                                  title="GPU peer-to-peer: IOMMU " + str(iommu.get("mode")) + ", no ACS redirect seen"
                                        + ("" if pairs else "; NVML's pair status unknown"),
                                  detail="\n".join(lines), evidence=ev))
    return out


def gpus_by_index(nv: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    return {g.get("index"): g for g in nv.get("gpus") or [] if isinstance(g.get("index"), int)}


def _not_visible(iommu: P2pIommu, unknown_acs: list[str], kernel_log: Mapping[str, Any] | None = None,
                 buses: list[str | None] | None = None) -> str:
    """What to look at when the copy hangs with nothing in the IOMMU or ACS state to blame: the kernel log's
    Xid and AER records of the two GPUs where it was read, else the command that shows them."""
    seen = f"The IOMMU is {iommu.get('mode')}" + (f" and the ACS of {', '.join(unknown_acs)} is unknown"
                                                  if unknown_acs else " and no bridge redirects peer traffic")
    if kernel_log is None:
        log = ("`dmesg -T | grep -iE 'xid|aer|pcieport|nvrm'` (Xid or PCIe AER errors on the path)")
    else:
        found = records_at(kernel_log, buses or [])
        log = ("the kernel log's records for these GPUs (kernel.xid, kernel.aer): "
               + "; ".join(f"{r['kind']} {r.get('xid') or r.get('severity')} at {r.get('bus')}" for r in found[-4:])
               if found else "the kernel log, read, holds no Xid or AER record for these GPUs in its window")
    return (seen + ": what zdoctor can see does not explain the hang. Check: `nvidia-smi topo -p2p rw` (what the "
            f"driver offers per pair); {log}; `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` (NVLink down or "
            "erroring) and, on NVSwitch systems, `systemctl status nvidia-fabricmanager`; the BIOS's ACS / PCIe "
            "peer-to-peer and IOMMU settings (a BIOS can redirect without showing it to the OS); CUDA's "
            "p2pBandwidthLatencyTest or nccl-tests' all_reduce_perf between the two GPUs to confirm outside torch.")


def _copy_speed(me: CheckSpec, pairs: list[dict[str, Any]], gpus: Mapping[Any, dict[str, Any]],
                nvlinks: dict[str, Any],
                lines: list[str], ev: list[Any]) -> Finding:
    """Intact copies, judged against what the link between the two GPUs should carry."""
    rows, slow, unknown = [], [], []
    for x in pairs:
        a, b = gpus.get(x.get("src")), gpus.get(x.get("dst"))
        exp = p2p.expected_rate(a, b, nvlinks) if a and b else {"gbps": None, "link": None,
                                                                 "why": "the GPUs are not in NVML's list"}
        got = x.get("gbps")
        rate = exp["gbps"]
        share = got / rate if isinstance(got, (int, float)) and isinstance(rate, (int, float)) and rate else None
        if share is None:
            unknown.append(x)
        elif share < p2p.SLOW_SHARE:
            slow.append((x, exp, share))
        rows.append([f"{x.get('src')} -> {x.get('dst')}", f"{got} GB/s" if got is not None else "not timed",
                     exp["link"] or "unknown", f"{exp['gbps']} GB/s" if exp["gbps"] else exp["why"] or "unknown",
                     f"{share:.0%}" if share is not None else "-"])
    table = Evidence.of_table("Peer copies against the link between the GPUs",
                              ["pair", "measured", "link", "expected", "share"], rows,
                              [i for i, x in enumerate(pairs) if any(x is s[0] for s in slow)])
    n = len(pairs)
    if slow:
        x, exp, share = slow[0]
        return Finding(id=me.id("copy"), status="warn",
                       title=f"Peer copies arrived intact but slow: GPU {x['src']} -> GPU {x['dst']} at {x['gbps']} "
                             f"GB/s, {share:.0%} of its {exp['link']} link ({exp['gbps']} GB/s)",
                       detail="\n".join(lines + [
                           f"{len(slow)} of {count_of(n, 'pair')} reach less than {p2p.SLOW_SHARE:.0%} of what their "
                           "link carries. A copy that slow goes through host memory (peer access not enabled for that "
                           "pair), crosses a bridge that forwards peer traffic badly, or runs on a link that "
                           "trained down; NCCL's collectives inside the node are held to that speed. "
                           "`nvidia-smi topo -m` shows how each pair is connected."]),
                       evidence=ev + [table], remedies=[])
    if unknown:
        return Finding(id=me.id("copy"), status="ok",
                       title=f"Peer copies between {n} GPU pairs arrived intact (speed not judged: the link's "
                             "rate is unknown for " + ", ".join(f"{x.get('src')}->{x.get('dst')}" for x in unknown)
                             + ")", detail="\n".join(lines), evidence=ev + [table])
    speeds = [x["gbps"] for x in pairs]
    return Finding(id=me.id("copy"), status="ok",
                   title=f"Peer copies between {n} GPU pairs arrived intact at the link's speed "
                         f"({min(speeds)}-{max(speeds)} GB/s)", detail="\n".join(lines), evidence=ev + [table])


@predicate("gpu_p2p_blocked", doc="IOMMU translation or ACS redirect behind GPUs that report P2P, or a hung "
           "peer copy with one of them in the path", probes=("p2p", "nvml"))
def gpu_p2p_blocked(facts: Facts) -> bool:
    return _iommu_or_acs(facts) and any(x.status in ("warn", "fail") for x in check_p2p(facts))


@predicate("gpu_p2p_broken_unexplained", doc="a peer copy hung, failed or crawled with neither IOMMU translation "
           "nor an ACS redirect in the path", probes=("p2p", "nvml"))
def gpu_p2p_broken_unexplained(facts: Facts) -> bool:
    return not _iommu_or_acs(facts) and any(x.id == "gpu.p2p.copy" and x.status in ("warn", "fail")
                                            for x in check_p2p(facts))


def _iommu_or_acs(facts: Facts) -> bool:
    f = facts.of("p2p") or {}
    return (f.get("iommu") or {}).get("mode") == "translated" or any(
        (a or {}).get("redirect") for a in (f.get("acs") or {}).values())
