"""GPU peer-to-peer behind the IOMMU and PCIe ACS: what decides whether P2P copies work, read from the
machine.

- **IOMMU**: ``/sys/class/iommu/*`` (one entry per remapping unit: ``dmar0`` on Intel, ``ivhd0`` on AMD),
  each GPU's ``iommu_group/type`` (``identity`` = passthrough, ``DMA``/``DMA-FQ`` = translated) and the
  kernel command line (``intel_iommu=``, ``amd_iommu=``, ``iommu=pt``, ``iommu.passthrough=``).
  With translation on, a GPU's peer writes are addresses the IOMMU must translate; with ACS redirect on
  the switch ports they are sent up to the root complex, where many platforms drop or stall them: NCCL's
  P2P transport then hangs or crawls.
- **ACS** on the PCIe bridges between two GPUs, from ``lspci -vvv``: ``ACSCtl: ... ReqRedir+ CmpltRedir+``
  forces peer traffic through the root complex.
- **NVML** ``nvmlDeviceGetP2PStatus`` per GPU pair (read capability), and optionally a bounded peer copy
  through torch in the training interpreter.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from zdoctor.core.jsondoc import json_objects

BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
IOMMU_PARAMS = ("intel_iommu", "amd_iommu", "iommu", "iommu.passthrough", "iommu.strict", "pcie_acs_override")
#: nvmlGpuP2PStatus_t (nvml.h / pynvml NVML_P2P_STATUS_*).
NVML_P2P_STATUS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported", 3: "IOH topology not supported",
                   4: "disabled by regkey", 5: "not supported", 6: "unknown"}
_ACS = re.compile(r"ACSCtl:\s*(?P<flags>.*)$", re.M)


def _read(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


def cmdline_params(text: str | None) -> dict[str, str]:
    """The IOMMU-related parameters of a kernel command line (``iommu=pt`` -> ``{"iommu": "pt"}``)."""
    out: dict[str, str] = {}
    for word in (text or "").split():
        key, _, value = word.partition("=")
        if key in IOMMU_PARAMS:
            out[key] = value
    return out


def normalize_bdf(bus_id: str) -> str:
    """NVML's ``00000000:00:06.0`` -> sysfs's ``0000:00:06.0`` (lower case)."""
    b = bus_id.strip().lower()
    dom, _, rest = b.partition(":")
    return f"{dom[-4:]}:{rest}" if rest else b


def pci_chain(bdf: str, sys_root: str = "/sys") -> list[str] | None:
    """The PCI devices from the root port down to ``bdf`` (its sysfs path), or None when it is absent."""
    link = os.path.join(sys_root, "bus", "pci", "devices", bdf)
    if not os.path.exists(link):
        return None
    parts = os.path.realpath(link).split(os.sep)
    return [p for p in parts if BDF.match(p)]


def iommu_state(gpu_bdfs: Iterable[str], sys_root: str = "/sys", cmdline: str = "/proc/cmdline") -> dict[str, Any]:
    """The IOMMU: remapping units, the command line, and each GPU's group and domain type."""
    units_dir = os.path.join(sys_root, "class", "iommu")
    try:
        units: list[str] | None = sorted(os.listdir(units_dir))
    except OSError:
        units = None  # no sysfs to read: the state is unknown, not "off"
    params = cmdline_params(_read(cmdline))
    gpus = {}
    for bdf in gpu_bdfs:
        dev = os.path.join(sys_root, "bus", "pci", "devices", bdf)
        group = os.path.join(dev, "iommu_group")
        gtype = _read(os.path.join(group, "type"))
        gpus[bdf] = {"group": os.path.basename(os.path.realpath(group)) if os.path.exists(group) else None,
                     "type": gtype.strip() if gtype else None}
    types = {g["type"] for g in gpus.values() if g["type"]}
    if units is None and not any(g["group"] for g in gpus.values()):
        mode = "unknown"
    elif not units and not any(g["group"] for g in gpus.values()):
        mode = "off"
    elif types and types <= {"identity"}:
        mode = "passthrough"
    elif types & {"DMA", "DMA-FQ"}:
        mode = "translated"
    elif params.get("iommu") == "pt" or params.get("iommu.passthrough") == "1":
        mode = "passthrough"
    else:
        mode = "on (domain type unknown)"
    return {"units": units or [], "cmdline": params, "gpus": gpus, "mode": mode}


def parse_acs(lspci_text: str) -> dict[str, Any]:
    """``ACSCtl`` flags of one device's ``lspci -vvv`` output: ``{"present", "flags", "redirect"}``;
    ``present`` None when the capabilities were not readable (lspci without root)."""
    if "<access denied>" in (lspci_text or ""):
        return {"present": None, "flags": {}, "redirect": None}
    m = _ACS.search(lspci_text or "")
    if not m:
        return {"present": False, "flags": {}, "redirect": False}
    flags = {f[:-1]: f.endswith("+") for f in m.group("flags").split() if f[-1:] in "+-"}
    return {"present": True, "flags": flags,
            "redirect": bool(flags.get("ReqRedir") or flags.get("CmpltRedir"))}


ACS_CAP_ID = 0x000D
#: ACS Control register bits (PCIe base spec, ACS Extended Capability, offset 6), as lspci names them.
ACS_CTL_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")


def acs_from_config(config: bytes) -> dict[str, Any]:
    """ACS control flags from a device's PCI configuration space (sysfs ``config``: 4096 bytes when read
    as root, 64 otherwise). ``present`` None when the extended space was not readable."""
    if len(config) < 0x104:
        return {"present": None, "flags": {}, "redirect": None, "why": "extended config space not readable "
                "(needs root)"}
    off, seen = 0x100, set()
    while off and off not in seen and off + 8 <= len(config):
        seen.add(off)
        header = int.from_bytes(config[off:off + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == ACS_CAP_ID:
            ctl = int.from_bytes(config[off + 6:off + 8], "little")
            flags = {name: bool(ctl >> i & 1) for i, name in enumerate(ACS_CTL_BITS)}
            return {"present": True, "flags": flags, "redirect": flags["ReqRedir"] or flags["CmpltRedir"],
                    "source": "sysfs config"}
        off = (header >> 20) & 0xFFC
    return {"present": False, "flags": {}, "redirect": False, "source": "sysfs config"}


def read_acs(bdf: str, sys_root: str = "/sys") -> dict[str, Any]:
    """ACS of ``bdf`` read from sysfs (its ``config`` file)."""
    try:
        with open(os.path.join(sys_root, "bus", "pci", "devices", bdf, "config"), "rb") as fh:
            return acs_from_config(fh.read(4096))
    except OSError as exc:
        return {"present": None, "flags": {}, "redirect": None, "why": f"config: {exc.strerror or exc}"}


def bridges_between(chain_a: list[str], chain_b: list[str]) -> dict[str, Any]:
    """The bridges a peer copy between two GPUs crosses (their lowest common bridge and the ports below
    it), and whether the path goes through the root complex (no common bridge)."""
    common = 0
    up_a, up_b = chain_a[:-1], chain_b[:-1]
    while common < min(len(up_a), len(up_b)) and up_a[common] == up_b[common]:
        common += 1
    shared = chain_a[:common]
    below = [*chain_a[common:-1], *chain_b[common:-1]]
    return {"common": shared[-1] if shared else None, "ports": list(dict.fromkeys(below)),
            "via_root_complex": not shared,
            "bridges": list(dict.fromkeys(([shared[-1]] if shared else []) + below))}


def acs_word(acs: dict[str, Any] | None) -> str:
    """"redirect", "no redirect" or "unknown" for one bridge's ACS record."""
    red = (acs or {}).get("redirect")
    return "unknown" if red is None else "redirect" if red else "no redirect"


def pair_status_text(code: int | None) -> str:
    return NVML_P2P_STATUS.get(code, "unknown") if code is not None else "not read"


#: PCIe bandwidth per lane and direction after line encoding, GB/s (PCI-SIG: 2.5/5 GT/s 8b/10b, 8/16/32 GT/s
#: 128b/130b, 64 GT/s PAM4 with FLIT).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: NVLink bandwidth per link and direction, GB/s, by the version NVML reports (NVIDIA's NVLink generations:
#: P100 1.0, V100 2.0, A100 3.0, H100/H200 4.0, B200 5.0).
NVLINK_LINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
#: A peer copy below this share of the link's rate is called slow (a healthy copy reaches most of it).
SLOW_SHARE = 0.25


def expected_rate(gpu_a: dict[str, Any], gpu_b: dict[str, Any], nvlinks: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The rate a peer copy from GPU a to GPU b should reach: NVLink when NVML lists active links between
    them (or to an NVSwitch), else the narrower PCIe link (generation the link can reach x its width).
    ``{"gbps": float | None, "link": "NVLink 4 x18" | "PCIe Gen5 x16" | None, "why": ...}``."""
    links = _nvlinks_between(gpu_a, gpu_b, nvlinks or {})
    if links:
        version = min(x.get("version") or 0 for x in links)
        per = NVLINK_LINK_GBPS.get(version)
        if per is None:
            return {"gbps": None, "link": f"NVLink x{len(links)}", "why": f"NVLink version {version} unknown"}
        return {"gbps": round(per * len(links), 1), "link": f"NVLink {version} x{len(links)}", "why": None}
    gens = [(g.get("pcie") or {}).get("gen_max") for g in (gpu_a, gpu_b)]
    widths = [(g.get("pcie") or {}).get("width") or (g.get("pcie") or {}).get("width_max") for g in (gpu_a, gpu_b)]
    if None in gens or None in widths:
        return {"gbps": None, "link": None, "why": "the GPUs' PCIe links were not reported"}
    gen, width = min(gens), min(widths)  # type: ignore[type-var]
    lane = PCIE_LANE_GBPS.get(gen)
    if lane is None:
        return {"gbps": None, "link": f"PCIe Gen{gen} x{width}", "why": f"PCIe Gen{gen}'s rate is not known here"}
    return {"gbps": round(lane * width, 1), "link": f"PCIe Gen{gen} x{width}", "why": None}


def _nvlinks_between(a: dict[str, Any], b: dict[str, Any], nvlinks: dict[str, Any]) -> list[dict[str, Any]]:
    """Active NVLinks of GPU a that reach GPU b directly, or an NVSwitch (then every link of a counts)."""
    mine = [x for x in nvlinks.get(str(a.get("index"))) or [] if x.get("active")]
    b_bdf = normalize_bdf(b.get("pci_bus_id") or "")
    direct = [x for x in mine if normalize_bdf(x.get("remote") or "") == b_bdf]
    if direct:
        return direct
    return [x for x in mine if x.get("remote_type") == "switch"]


#: The bounded peer-copy test, run by the training interpreter: argv[1] bytes per copy, argv[2] pairs cap.
PEER_COPY_CODE = r'''
import json, sys, time
n_bytes, cap = int(sys.argv[1]), int(sys.argv[2])
import torch
count = torch.cuda.device_count()
def emit(d):
    sys.stdout.write(json.dumps(d) + "\n"); sys.stdout.flush()
emit({"devices": count})
done = 0
for i in range(count):
    for j in range(count):
        if i == j or done >= cap:
            continue
        done += 1
        rec = {"src": i, "dst": j, "can_access": bool(torch.cuda.can_device_access_peer(i, j))}
        emit(dict(rec, begin=True))
        try:
            a = torch.arange(n_bytes // 4, dtype=torch.int32, device="cuda:%d" % i)
            a[:1024].to("cuda:%d" % j)  # the first copy of a pair sets up peer access: not timed
            torch.cuda.synchronize(i)
            torch.cuda.synchronize(j)
            t0 = time.perf_counter()
            b = a.to("cuda:%d" % j)
            torch.cuda.synchronize(j)
            dt = time.perf_counter() - t0
            rec.update(ok=bool(torch.equal(b.cpu(), a.cpu())), gbps=round(n_bytes / dt / 1e9, 2))
        except Exception as e:
            rec.update(ok=False, error="%s: %s" % (type(e).__name__, e))
        emit(rec)
'''


def parse_peer_copy(stdout: str) -> dict[str, Any]:
    """The copy test's records; a pair that began and never reported is the pair that hung."""
    out: dict[str, Any] = {"devices": None, "pairs": [], "hung_pair": None}
    started = None
    for d in json_objects((stdout or "").splitlines()):
        if "devices" in d:
            out["devices"] = d["devices"]
        elif d.get("begin"):
            started = (d.get("src"), d.get("dst"))
        elif "src" in d:
            started = None
            out["pairs"].append(d)
    out["hung_pair"] = list(started) if started else None
    return out
