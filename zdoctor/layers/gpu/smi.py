"""nvidia-smi as a fallback and a cross-check of NVML: ``-q -x`` XML, ``--query-gpu`` CSV, and the banner
of plain ``nvidia-smi``. The parsers return GPU records in the shape :mod:`.nvml` uses (fields nvidia-smi
reports as N/A stay None)."""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from typing import Any

from zdoctor.layers.gpu.nvml import empty_gpu

#: ``nvidia-smi --query-gpu=<these> --format=csv`` (the fallback when the XML cannot be read).
QUERY_FIELDS = ("index", "name", "uuid", "driver_version", "pci.bus_id", "pcie.link.gen.current",
                "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max", "memory.total",
                "memory.used", "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw",
                "ecc.mode.current", "persistence_mode")

_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}
_NUM = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)")


class SmiParseError(ValueError):
    """nvidia-smi output that cannot be read (truncated or not XML)."""


def number(text: str | None) -> float | None:
    """``"45 C"`` -> 45.0, ``"134.85 W"`` -> 134.85, ``"16x"`` -> 16.0; ``"N/A"`` and the like -> None."""
    m = _NUM.match(text or "")
    return float(m.group(1)) if m else None


def integer(text: str | None) -> int | None:
    n = number(text)
    return None if n is None else int(n)


def size_bytes(text: str | None) -> int | None:
    """``"143771 MiB"`` -> bytes; a bare number is taken as MiB (nvidia-smi's unit)."""
    m = _NUM.match(text or "")
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS.get(m.group(2) or "MiB", 1024 ** 2))


def _flag(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    if t in ("enabled", "active", "yes", "on"):
        return True
    if t in ("disabled", "not active", "no", "off"):
        return False
    return None


def _find(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    el = node.find(path)
    return el.text.strip() if el is not None and el.text is not None else None


def _sum_children(node: ET.Element | None, want: str, avoid: str | None = None) -> int | None:
    """Sum integer children whose tag contains ``want`` (and not ``avoid``); None when none is a number."""
    if node is None:
        return None
    total, seen = 0, False
    for child in node.iter():
        tag = child.tag.lower()
        if want in tag and (avoid is None or avoid not in tag):
            n = integer(child.text)
            if n is not None and (child.text or "").strip().lstrip("-").isdigit():
                total += n
                seen = True
    return total if seen else None


def _ecc_counts(errors: ET.Element | None, scope: str) -> tuple[int | None, int | None]:
    """(uncorrected, corrected) of ``volatile`` or ``aggregate`` in both XML layouts (new: sram_/dram_
    *correctable* leaves; old: single_bit/double_bit ``total``)."""
    node = errors.find(scope) if errors is not None else None
    if node is None:
        return None, None
    dbl, sgl = node.find("double_bit"), node.find("single_bit")
    if dbl is not None or sgl is not None:
        return integer(_find(dbl, "total")), integer(_find(sgl, "total"))
    return _sum_children(node, "uncorrectable"), _sum_children(node, "correctable", avoid="uncorrectable")


def _gpu_from_xml(i: int, el: ET.Element) -> dict[str, Any]:
    g = empty_gpu(i)
    g["name"] = _find(el, "product_name")
    g["brand"] = _find(el, "product_brand")
    g["uuid"] = _find(el, "uuid")
    g["pci_bus_id"] = el.get("id") or _find(el, "pci/pci_bus_id")
    fb = el.find("fb_memory_usage")
    g["memory"] = {"total": size_bytes(_find(fb, "total")), "used": size_bytes(_find(fb, "used")),
                   "free": size_bytes(_find(fb, "free"))}
    g["utilization"] = {"gpu": integer(_find(el, "utilization/gpu_util")),
                        "memory": integer(_find(el, "utilization/memory_util"))}
    link = el.find("pci/pci_gpu_link_info")
    g["pcie"] = {"gen": integer(_find(link, "pcie_gen/current_link_gen")),
                 "gen_max": integer(_find(link, "pcie_gen/max_link_gen")),
                 "width": integer(_find(link, "link_widths/current_link_width")),
                 "width_max": integer(_find(link, "link_widths/max_link_width"))}
    errors = el.find("ecc_errors")
    vu, vc = _ecc_counts(errors, "volatile")
    au, ac = _ecc_counts(errors, "aggregate")
    g["ecc"].update(current=_flag(_find(el, "ecc_mode/current_ecc")), pending=_flag(_find(el, "ecc_mode/pending_ecc")),
                    volatile_uncorrected=vu, volatile_corrected=vc, aggregate_uncorrected=au, aggregate_corrected=ac,
                    remap_pending=_flag(_find(el, "remapped_rows/remapped_row_pending")),
                    remap_failure=_flag(_find(el, "remapped_rows/remapped_row_failure")))
    g["persistence"] = _flag(_find(el, "persistence_mode"))
    g["temperature_c"] = integer(_find(el, "temperature/gpu_temp"))
    g["power_w"] = number(_find(el, "gpu_power_readings/instant_power_draw") or _find(el, "power_readings/power_draw"))
    g["power_limit_w"] = number(_find(el, "gpu_power_readings/current_power_limit")
                                or _find(el, "power_readings/power_limit"))
    g["perf_state"] = _find(el, "performance_state")
    mode = _find(el, "compute_mode")
    g["compute_mode"] = mode.lower().replace(" ", "_") if mode else None
    g["mig"] = _flag(_find(el, "mig_mode/current_mig"))
    g["fabric_state"] = _find(el, "fabric/state")
    reasons = el.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if reasons is None:
        reasons, prefix = el.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    active = []
    if reasons is not None:
        for child in reasons:
            if _flag(child.text) and child.tag.startswith(prefix):
                active.append(child.tag[len(prefix):])
    g["throttle"] = {"mask": None, "reasons": active}
    for p in el.findall("processes/process_info"):
        g["processes"].append({"pid": integer(_find(p, "pid")), "used_bytes": size_bytes(_find(p, "used_memory")),
                               "type": "compute" if "C" in (_find(p, "type") or "C") else "graphics",
                               "name": _find(p, "process_name")})
    return g


def parse_smi_xml(text: str) -> dict[str, Any]:
    """``nvidia-smi -q -x`` -> ``{driver, cuda_version, count, gpus}``; raises :class:`SmiParseError`."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise SmiParseError(f"nvidia-smi -q -x: malformed XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"nvidia-smi -q -x: unexpected root element <{root.tag}>")
    gpus = [_gpu_from_xml(i, el) for i, el in enumerate(root.findall("gpu"))]
    return {"driver": _find(root, "driver_version"), "cuda_version": _find(root, "cuda_version"),
            "count": integer(_find(root, "attached_gpus")) if _find(root, "attached_gpus") else len(gpus),
            "gpus": gpus}


def parse_query_csv(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=... --format=csv`` (with its header line) -> GPU records."""
    rows = list(csv.reader(io.StringIO(text or ""), skipinitialspace=True))
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    out = []
    for n, row in enumerate(r for r in rows[1:] if r):
        d = dict(zip(header, (c.strip() for c in row)))
        idx = integer(d.get("index"))
        g = empty_gpu(idx if idx is not None else n)
        g["name"], g["uuid"], g["pci_bus_id"] = d.get("name"), d.get("uuid"), d.get("pci.bus_id")
        g["driver"] = d.get("driver_version")
        g["pcie"] = {"gen": integer(d.get("pcie.link.gen.current")), "gen_max": integer(d.get("pcie.link.gen.max")),
                     "width": integer(d.get("pcie.link.width.current")),
                     "width_max": integer(d.get("pcie.link.width.max"))}
        g["memory"] = {"total": size_bytes(d.get("memory.total")), "used": size_bytes(d.get("memory.used")),
                       "free": None}
        g["utilization"] = {"gpu": integer(d.get("utilization.gpu")), "memory": integer(d.get("utilization.memory"))}
        g["temperature_c"] = integer(d.get("temperature.gpu"))
        g["power_w"] = number(d.get("power.draw"))
        g["ecc"]["current"] = _flag(d.get("ecc.mode.current"))
        g["persistence"] = _flag(d.get("persistence_mode"))
        out.append(g)
    return out


_BANNER = re.compile(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)")


def parse_smi_banner(text: str) -> dict[str, Any]:
    """The driver and CUDA versions from the header box of plain ``nvidia-smi``."""
    m = _BANNER.search(text or "")
    return {"driver": m.group(1) if m else None, "cuda_version": m.group(2) if m else None}


def cross_check(nvml: dict[str, Any], smi: dict[str, Any]) -> list[str]:
    """Where nvidia-smi and NVML disagree (driver, GPU count, UUIDs); empty when they agree."""
    out = []
    if smi.get("driver") and nvml.get("driver") and smi["driver"] != nvml["driver"]:
        out.append(f"driver: NVML {nvml['driver']}, nvidia-smi {smi['driver']}")
    cuda = nvml.get("cuda_driver_version")
    if smi.get("cuda_version") and cuda and smi["cuda_version"] != cuda:
        out.append(f"CUDA version: NVML {cuda}, nvidia-smi {smi['cuda_version']}")
    if smi.get("count") is not None and nvml.get("count") is not None and smi["count"] != nvml["count"]:
        out.append(f"GPU count: NVML {nvml['count']}, nvidia-smi {smi['count']}")
    a = sorted(g["uuid"] for g in nvml.get("gpus") or [] if g.get("uuid"))
    b = sorted(g["uuid"] for g in smi.get("gpus") or [] if g.get("uuid"))
    if a and b and a != b:
        out.append(f"GPU UUIDs differ: NVML {', '.join(a)}; nvidia-smi {', '.join(b)}")
    return out
