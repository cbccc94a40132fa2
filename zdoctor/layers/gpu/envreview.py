"""The training environment's NCCL, c10d and CUDA variables, reviewed.

- Deprecated names torch still reads but warns about (``ProcessGroupNCCL.hpp``: the TORCH_ name is read
  first, the old one only when the new one is unset).
- ``NCCL_DEBUG``: what to set for a hang, and values that hurt.
- GPU peer-to-peer on consumer cards (GeForce/TITAN): broken P2P hangs the first collective.
- ``CUDA_VISIBLE_DEVICES`` against the GPUs present, with CUDA's rule: entries after the first invalid
  one are dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zdoctor.core.plural import count_of

#: Old name -> the name torch reads first (both are read; the old one warns).
DEPRECATED = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
}
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
#: Variables the review looks at (the probe records these from the training environment).
PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_")
NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING",
         "NVIDIA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_CUDA_ARCH_LIST")


def relevant(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` this review reads, sorted by name."""
    return {k: env[k] for k in sorted(env) if k in NAMES or k.startswith(PREFIXES)}


def deprecated(env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Deprecated names that are set: old, new, value, new_value (None when unset) and ``ignored`` (the new
    name is set too, so torch reads it and ignores the old one)."""
    out = []
    for old, new in DEPRECATED.items():
        if old in env:
            out.append({"old": old, "new": new, "value": env[old], "new_value": env.get(new),
                        "ignored": new in env})
    return out


def nccl_debug(env: Mapping[str, str]) -> dict[str, Any]:
    """``status`` ok | warn with a ``text``: unset is fine (advice for a hang), TRACE or a typo is a warning."""
    value = env.get("NCCL_DEBUG")
    if value is None:
        return {"status": "ok", "value": None,
                "text": "NCCL_DEBUG is not set: NCCL prints only errors. For a hang or an NCCL error, run once "
                        "with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH) to see which transport, "
                        "interface and topology each rank chose, and where it stopped."}
    v = value.strip().upper()
    if v not in NCCL_DEBUG_LEVELS:
        return {"status": "warn", "value": value,
                "text": f"NCCL_DEBUG={value!r} is not a level NCCL knows ({', '.join(NCCL_DEBUG_LEVELS)}); "
                        "it logs nothing extra."}
    if v == "TRACE":
        return {"status": "warn", "value": value,
                "text": "NCCL_DEBUG=TRACE logs every call (in builds that include tracing): huge logs and a "
                        "slower run. Use INFO unless NCCL developers asked for TRACE."}
    text = f"NCCL_DEBUG={value}."
    if v == "INFO" and not env.get("NCCL_DEBUG_FILE"):
        text += (" Every rank prints to stderr; NCCL_DEBUG_FILE=/path/nccl.%h.%p.log writes one file per "
                 "host and process instead.")
    return {"status": "ok", "value": value, "text": text}


def is_consumer(name: str | None) -> bool:
    """GeForce and TITAN cards: peer-to-peer over PCIe is unreliable or disabled by the driver on them."""
    n = (name or "").lower()
    return "geforce" in n or "titan" in n


def p2p(env: Mapping[str, str], gpu_names: list[str]) -> dict[str, Any]:
    """Peer-to-peer advice: ``status`` ok | warn and ``text``."""
    disabled = env.get("NCCL_P2P_DISABLE", "").strip() in ("1", "true", "TRUE", "yes")
    consumer = [n for n in gpu_names if is_consumer(n)]
    if len(gpu_names) < 2:
        return {"status": "ok", "consumer": bool(consumer), "disabled": disabled,
                "text": "Fewer than two GPUs: no GPU-to-GPU traffic on this node."}
    if consumer and not disabled:
        return {"status": "warn", "consumer": True, "disabled": False,
                "text": f"{len(consumer)} consumer GPUs ({consumer[0]}): GPU peer-to-peer over PCIe is broken "
                        "or disabled on many of them (and with IOMMU/ACS on), and NCCL can hang in its first "
                        "collective. If an all-reduce or the first ZeRO-3 all-gather never returns, set "
                        "NCCL_P2P_DISABLE=1: NCCL then copies through host memory."}
    if disabled and not consumer:
        return {"status": "warn", "consumer": False, "disabled": True,
                "text": "NCCL_P2P_DISABLE is set on datacenter GPUs: NCCL cannot use NVLink or PCIe peer "
                        "copies and falls back to host memory, which makes every collective slower. Unset it "
                        "unless it works around a hang you have seen on this node."}
    return {"status": "ok", "consumer": bool(consumer), "disabled": disabled,
            "text": "NCCL_P2P_DISABLE=1 on consumer GPUs: NCCL copies through host memory." if disabled
            else "Datacenter GPUs with peer-to-peer left to NCCL; whether it works behind the IOMMU and PCIe ACS "
                 "is the gpu.p2p check's."}


def visible_devices(value: str | None, gpus: list[dict[str, Any]] | None) -> dict[str, Any]:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it, against the GPUs NVML reports (``gpus`` None: unknown).

    Returns ``set``, ``entries``, ``visible`` (entries CUDA keeps), ``invalid`` (the first bad entry and
    why), ``status`` ok | warn | fail | skip and ``text``.
    """
    if value is None:
        return {"set": False, "entries": [], "visible": None, "invalid": None, "status": "ok",
                "text": "CUDA_VISIBLE_DEVICES is not set: every GPU is visible."}
    entries = [e.strip() for e in value.split(",")]
    if not value.strip():
        return {"set": True, "entries": [], "visible": [], "invalid": None, "status": "fail",
                "text": "CUDA_VISIBLE_DEVICES is set to an empty string: CUDA sees no GPU at all "
                        "(torch.cuda.is_available() is False)."}
    if gpus is None:
        return {"set": True, "entries": entries, "visible": None, "invalid": None, "status": "skip",
                "text": f"CUDA_VISIBLE_DEVICES={value!r}; the GPUs present are unknown (NVML gave no list), "
                        "so the entries cannot be checked."}
    visible: list[str] = []
    used: set[int] = set()
    invalid = None
    for e in entries:
        idx = None
        if e.lstrip("-").isdigit():
            n = int(e)
            if n < 0 or n >= len(gpus):
                invalid = {"entry": e, "why": "hides every GPU from here on" if n < 0 else
                           f"there is no GPU {n} (this node has {len(gpus)}: 0-{len(gpus) - 1})"}
            else:
                idx = n
        elif e.startswith("GPU-"):
            hits = [g["index"] for g in gpus if (g.get("uuid") or "").startswith(e)]
            if len(hits) == 1:
                idx = hits[0]
            else:
                invalid = {"entry": e, "why": "no GPU has this UUID" if not hits else "the UUID prefix is ambiguous"}
        elif e.startswith("MIG-"):
            visible.append(e)  # MIG instances are not listed by this probe
            continue
        else:
            invalid = {"entry": e, "why": "not an index, GPU-<uuid> or MIG-<uuid>"}
        if idx is not None and idx in used:
            invalid = {"entry": e, "why": f"GPU {idx} is listed twice"}
        if invalid is not None:
            break
        used.add(idx)  # type: ignore[arg-type]
        visible.append(e)
    if invalid is None:
        return {"set": True, "entries": entries, "visible": visible, "invalid": None, "status": "ok",
                "text": f"CUDA_VISIBLE_DEVICES={value!r}: {len(visible)} of {count_of(len(gpus), 'GPU')} visible."}
    status = "fail" if not visible else "warn"
    rest = entries[entries.index(invalid["entry"]) + 1:]
    text = (f"CUDA_VISIBLE_DEVICES={value!r}: entry {invalid['entry']!r} is invalid ({invalid['why']}). CUDA "
            "keeps only the devices listed before the first invalid entry")
    text += f" ({', '.join(visible)})" if visible else ": no GPU is visible"
    if rest:
        text += f", and drops {', '.join(rest)} silently"
    return {"set": True, "entries": entries, "visible": visible, "invalid": invalid, "status": status,
            "text": text + "."}
