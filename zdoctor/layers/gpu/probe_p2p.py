"""Probe ``p2p``: IOMMU state and kernel command line, ACS on the bridges between each GPU pair, NVML's
P2P status per pair, and (only when asked with ``--p2p-test``) a bounded peer copy through torch."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
from typing import Any

from zdoctor.core.factstypes import P2pFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.gpu import p2p
from zdoctor.proc.runner import run

PEER_COPY_BYTES = 64 * 1024 * 1024
PEER_COPY_PAIRS = 16
PEER_COPY_TIMEOUT = 60.0
MAX_PAIRS = 64


def nvml_pairs(count: int) -> dict[str, Any]:
    """``"i-j"`` -> NVML's P2P read status code for every ordered pair (empty when NVML is unusable)."""
    out: dict[str, Any] = {}
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no module: the pair status stays unknown
        return out
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        for i in range(count):
            for j in range(count):
                if i != j and len(out) < MAX_PAIRS:
                    try:
                        out[f"{i}-{j}"] = int(nv.nvmlDeviceGetP2PStatus(handles[i], handles[j], 0))  # 0: READ
                    except Exception as exc:  # noqa: BLE001
                        out[f"{i}-{j}"] = f"error: {exc}"
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    return out


MAX_NVLINKS = 18
#: nvmlIntNvLinkDeviceType_t: what the other end of an NVLink is.
NVLINK_REMOTE = {0: "gpu", 1: "ibmnpu", 2: "switch", 255: "unknown"}


def nvml_nvlinks(count: int, nv: Any = None) -> dict[str, Any]:
    """Per GPU index (as text): its active NVLinks ``[{link, active, version, remote, remote_type}]``;
    empty when NVML is unusable or the GPUs have no NVLink."""
    out: dict[str, Any] = {}
    try:
        if nv is None:
            nv = importlib.import_module("pynvml")
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no module: no NVLink facts
        return out
    try:
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception:  # noqa: BLE001
                continue
            links = []
            for link in range(MAX_NVLINKS):
                try:
                    active = bool(nv.nvmlDeviceGetNvLinkState(h, link))
                except Exception:  # noqa: BLE001 - NOT_SUPPORTED / INVALID_ARGUMENT past the last link
                    break
                if not active:
                    continue
                rec: dict[str, Any] = {"link": link, "active": True, "version": None, "remote": None,
                                       "remote_type": None}
                with contextlib.suppress(Exception):
                    rec["version"] = int(nv.nvmlDeviceGetNvLinkVersion(h, link))
                with contextlib.suppress(Exception):
                    bus = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
                    rec["remote"] = bus.decode() if isinstance(bus, bytes) else str(bus)
                with contextlib.suppress(Exception):
                    rec["remote_type"] = NVLINK_REMOTE.get(int(nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)),
                                                           "unknown")
                links.append(rec)
            if links:
                out[str(i)] = links
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    return out


def lspci_acs(bdfs: list[str], env: dict[str, str], sys_root: str = "/sys") -> tuple[dict[str, Any], list[Evidence]]:
    """ACS of each bridge: from its sysfs config space, else from ``lspci -vvv -s BDF``."""
    tool = shutil.which("lspci", path=env.get("PATH") or os.defpath)
    out: dict[str, Any] = {}
    ev = []
    for bdf in bdfs:
        from_sysfs = p2p.read_acs(bdf, sys_root)
        if from_sysfs.get("present") is not None:
            out[bdf] = from_sysfs
            continue
        if tool is None:
            out[bdf] = {"present": None, "flags": {}, "redirect": None,
                        "why": f"lspci is not installed and {from_sysfs.get('why')}"}
            continue
        e = run([tool, "-vvv", "-s", bdf], env=env, timeout=10, label=f"lspci -vvv -s {bdf}")
        ev.append(e)
        out[bdf] = p2p.parse_acs(e.stdout) if not e.error else {"present": None, "flags": {}, "redirect": None,
                                                               "why": e.error}
    return out, ev


def collect_p2p(gpus: list[dict[str, Any]], env: dict[str, str], *, sys_root: str = "/sys",
                cmdline: str = "/proc/cmdline", pairs: dict[str, Any] | None = None,
                acs: dict[str, Any] | None = None, nvlinks: dict[str, Any] | None = None
                ) -> tuple[dict[str, Any], list[Evidence]]:
    bdfs = [p2p.normalize_bdf(g.get("pci_bus_id") or "") for g in gpus]
    chains = {b: p2p.pci_chain(b, sys_root) for b in bdfs if b}
    iommu = p2p.iommu_state([b for b in bdfs if b], sys_root, cmdline)
    between = {}
    for i, a in enumerate(bdfs):
        for j in range(i + 1, len(bdfs)):
            b = bdfs[j]
            chain_a, chain_b = chains.get(a), chains.get(b)
            if chain_a and chain_b:
                between[f"{i}-{j}"] = p2p.bridges_between(chain_a, chain_b)
    bridges = sorted({x for v in between.values() for x in v["bridges"]})
    ev: list[Evidence] = []
    if acs is None:
        acs, ev = lspci_acs(bridges, env, sys_root)
    if pairs is None:
        pairs = nvml_pairs(len(gpus)) if len(gpus) > 1 else {}
    if nvlinks is None:
        nvlinks = nvml_nvlinks(len(gpus)) if len(gpus) > 1 else {}
    facts = {"gpus": bdfs, "iommu": iommu, "chains": chains, "between": between, "acs": acs, "nvml_pairs": pairs,
             "nvlinks": nvlinks}
    rows = [[k, v["common"] or "root complex", ", ".join(v["ports"]) or "-",
             ", ".join(f"{b}: {p2p.acs_word(acs.get(b))}" for b in v["bridges"]) or "-",
             p2p.pair_status_text(pairs.get(k) if isinstance(pairs.get(k), int) else None)]
            for k, v in between.items()]
    ev.insert(0, Evidence.of_table("GPU pairs: PCIe path, ACS and NVML P2P status",
                                   ["pair", "common bridge", "ports below it", "ACS", "NVML P2P read"], rows))
    ev.insert(1, Evidence.note("IOMMU", f"mode: {iommu['mode']}; units: {', '.join(iommu['units']) or 'none'}; "
                                        f"kernel parameters: {iommu['cmdline'] or 'none'}"))
    return facts, ev


def peer_copy(python: str, env: dict[str, str]) -> dict[str, Any]:
    """The bounded peer-copy test in the training interpreter (a hang is killed at the timeout)."""
    e = run([python, "-c", p2p.PEER_COPY_CODE, str(PEER_COPY_BYTES), str(PEER_COPY_PAIRS)], env=env,
            timeout=PEER_COPY_TIMEOUT, label="peer copy between GPUs (torch)")
    out = p2p.parse_peer_copy(e.stdout)
    out.update(timed_out=bool(e.error and "timed out" in e.error), exit_code=e.exit_code,
               error=e.error, stderr_tail=(e.stderr or "")[-1000:])
    return out


@probe("p2p", title="GPU peer-to-peer: IOMMU, ACS, NVML status", timeout=PEER_COPY_TIMEOUT + 60, needs=("nvml",),
       facts=P2pFacts)
def p2p_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    res = host.result("nvml")
    gpus = (res.facts or {}).get("gpus") or [] if res.status == "ok" else []
    env = dict(getattr(host, "env", None) or os.environ)
    facts, ev = collect_p2p(gpus, env)
    facts["peer_copy"] = None
    if (getattr(host, "options", None) or {}).get("p2p_test") and len(gpus) > 1:
        facts["peer_copy"] = peer_copy(getattr(host, "python", None) or "python3", env)
    return facts, ev
