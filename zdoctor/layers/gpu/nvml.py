"""GPU facts through NVML (nvidia-ml-py's ``pynvml``), and the reader of a recorded NVML dump.

Every call goes through :func:`_call`: a call the GPU or driver does not support
(``NVML_ERROR_NOT_SUPPORTED``) leaves the field None and names it in the GPU's ``not_supported`` list; any
other NVML error is kept in ``errors``. A library that will not load, a driver that is not loaded or a
mismatched kernel module give ``available: False`` with ``error_kind`` and a one-line ``error``: never an
exception.

A GPU record (all plain JSON): index, name, uuid, pci_bus_id, memory {total, used, free} (bytes),
utilization {gpu, memory} (%), pcie {gen, gen_max, width, width_max}, ecc {current, pending,
volatile_uncorrected, volatile_corrected, aggregate_uncorrected, aggregate_corrected, remap_pending,
remap_failure}, compute_capability ("9.0"; None when unknown), persistence (bool), temperature_c, power_w,
power_limit_w, perf_state ("P0"), compute_mode, mig (bool), throttle {mask, reasons [names]}, processes [{pid,
used_bytes, type, name}], sample (when sampled), not_supported [fields], errors {field: message}.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

#: Clock event ("throttle") reasons: bit, name, what it means, and whether it slows a healthy GPU
#: (``benign``), is a power-budget limit (``power``) or points at cooling or hardware (``bad``).
THROTTLE_REASONS: tuple[tuple[int, str, str, str], ...] = (
    (0x001, "gpu_idle", "nothing is running; clocks are low on purpose", "benign"),
    (0x002, "applications_clocks_setting", "clocks are capped by an application-clocks setting", "power"),
    (0x004, "sw_power_cap", "the power limit caps the clocks (normal at full load)", "power"),
    (0x008, "hw_slowdown", "hardware slowdown (HW_SLOWDOWN): temperature or power-brake signal", "bad"),
    (0x010, "sync_boost", "clocks held in sync with other GPUs of a sync-boost group", "benign"),
    (0x020, "sw_thermal_slowdown", "the driver lowers clocks: GPU or memory is too hot", "bad"),
    (0x040, "hw_thermal_slowdown", "hardware thermal slowdown: the GPU is too hot", "bad"),
    (0x080, "hw_power_brake_slowdown", "external power brake (the power supply or chassis asked)", "bad"),
    (0x100, "display_clocks_setting", "clocks capped by a display clock setting", "benign"),
)
_REASON_SEVERITY = {name: sev for _bit, name, _what, sev in THROTTLE_REASONS}
_REASON_TEXT = {name: what for _bit, name, what, _sev in THROTTLE_REASONS}

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

# NVML return codes (nvml.h); read from the module when it has them.
NOT_SUPPORTED = 3
_ERROR_KINDS = {
    12: "library_not_found",  # NVML_ERROR_LIBRARY_NOT_FOUND
    9: "driver_not_loaded",  # NVML_ERROR_DRIVER_NOT_LOADED
    4: "no_permission",  # NVML_ERROR_NO_PERMISSION
    18: "driver_mismatch",  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
    15: "gpu_lost",  # NVML_ERROR_GPU_IS_LOST
    13: "function_not_found",  # NVML_ERROR_FUNCTION_NOT_FOUND
}
_ERROR_HELP = {
    "library_not_found": "the NVML library libnvidia-ml.so.1 could not be loaded: no NVIDIA driver is installed "
                         "here, or (in a container) the driver's libraries were not mounted in",
    "driver_not_loaded": "the NVIDIA kernel driver is not loaded (is the nvidia module loaded? `lsmod | grep nvidia`)",
    "no_permission": "no permission to open the GPU device nodes (/dev/nvidia*)",
    "driver_mismatch": "the NVIDIA kernel module and the user-space driver libraries have different versions "
                       "(\"Driver/library version mismatch\": the driver was upgraded and the node not rebooted)",
    "gpu_lost": "a GPU has fallen off the bus (NVML_ERROR_GPU_IS_LOST); the node needs a GPU reset or reboot",
}


def decode_throttle(mask: int | None) -> list[str]:
    """The reason names set in a clock-event bitmask (unknown bits as ``bit_0x...``)."""
    if mask is None:
        return []
    out = [name for bit, name, _w, _s in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, *_rest in THROTTLE_REASONS:
        known |= bit
    rest = mask & ~known
    b = 1
    while rest:
        if rest & b:
            out.append(f"bit_{b:#x}")
            rest &= ~b
        b <<= 1
    return out


def reason_severity(name: str) -> str:
    return _REASON_SEVERITY.get(name, "unknown")


def reason_text(name: str) -> str:
    return _REASON_TEXT.get(name, "a reason this zdoctor does not know")


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def error_kind(exc: BaseException) -> str:
    """A short kind for an NVML error (``library_not_found``, ``driver_not_loaded`` ...), else ``nvml_error``."""
    return _ERROR_KINDS.get(getattr(exc, "value", None), "nvml_error")


def unavailable(kind: str, message: str) -> dict[str, Any]:
    """The NVML facts of a machine where NVML cannot be used."""
    help_text = _ERROR_HELP.get(kind)
    return {"available": False, "error_kind": kind,
            "error": f"{message}: {help_text}" if help_text else message,
            "driver": None, "cuda_driver": None, "cuda_driver_version": None, "nvml_version": None,
            "count": None, "gpus": []}


class _Reader:
    """Calls NVML functions for one GPU, sorting failures into ``not_supported`` and ``errors``."""

    def __init__(self, nv: Any, gpu: dict[str, Any]) -> None:
        self.nv = nv
        self.gpu = gpu
        self.not_supported = getattr(nv, "NVML_ERROR_NOT_SUPPORTED", NOT_SUPPORTED)

    def __call__(self, field: str, name: str, *args: Any) -> Any:
        func = getattr(self.nv, name, None)
        if func is None:
            self.gpu["not_supported"].append(field)
            return None
        try:
            return func(*args)
        except self.nv.NVMLError as exc:
            if getattr(exc, "value", None) == self.not_supported:
                if field not in self.gpu["not_supported"]:
                    self.gpu["not_supported"].append(field)
            else:
                self.gpu["errors"][field] = str(exc)
            return None


def brand_name(nv: Any, value: Any) -> str | None:
    """NVML's brand number -> its name (``NVML_BRAND_GEFORCE_RTX`` -> ``GEFORCE_RTX``), from the binding's
    own constants; None when unknown."""
    if not isinstance(value, int):
        return None
    names = [k[len("NVML_BRAND_"):] for k in dir(nv) if k.startswith("NVML_BRAND_") and k != "NVML_BRAND_COUNT"
             and getattr(nv, k, None) == value]
    return sorted(names)[0] if names else str(value)


def cc_text(value: Any) -> str | None:
    """``(9, 0)`` (what nvmlDeviceGetCudaComputeCapability and torch.cuda.get_device_capability return) ->
    ``"9.0"``; None for anything else."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value):
        return f"{value[0]}.{value[1]}"
    return None


def _proc_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None  # another PID namespace (a container) or gone


def empty_gpu(index: int) -> dict[str, Any]:
    return {"index": index, "name": None, "uuid": None, "pci_bus_id": None,
            "memory": {"total": None, "used": None, "free": None}, "utilization": {"gpu": None, "memory": None},
            "pcie": {"gen": None, "gen_max": None, "width": None, "width_max": None},
            "ecc": {"current": None, "pending": None, "volatile_uncorrected": None, "volatile_corrected": None,
                    "aggregate_uncorrected": None, "aggregate_corrected": None, "remap_pending": None,
                    "remap_failure": None},
            "compute_capability": None, "persistence": None, "temperature_c": None, "power_w": None,
            "power_limit_w": None, "perf_state": None,
            "compute_mode": None, "mig": None, "throttle": {"mask": None, "reasons": []}, "processes": [],
            "sample": None, "not_supported": [], "errors": {}}


def read_gpu(nv: Any, index: int) -> dict[str, Any]:
    """Everything NVML says about GPU ``index``; unsupported fields stay None."""
    gpu = empty_gpu(index)
    call = _Reader(nv, gpu)
    h = call("handle", "nvmlDeviceGetHandleByIndex", index)
    if h is None:
        return gpu
    gpu["name"] = _text(call("name", "nvmlDeviceGetName", h))
    gpu["brand"] = brand_name(nv, call("brand", "nvmlDeviceGetBrand", h))
    gpu["uuid"] = _text(call("uuid", "nvmlDeviceGetUUID", h))
    pci = call("pci", "nvmlDeviceGetPciInfo", h)
    if pci is not None:
        gpu["pci_bus_id"] = _text(getattr(pci, "busId", None))
    mem = call("memory", "nvmlDeviceGetMemoryInfo", h)
    if mem is not None:
        gpu["memory"] = {"total": int(mem.total), "used": int(mem.used), "free": int(mem.free)}
    util = call("utilization", "nvmlDeviceGetUtilizationRates", h)
    if util is not None:
        gpu["utilization"] = {"gpu": int(util.gpu), "memory": int(util.memory)}
    gpu["pcie"] = {"gen": call("pcie.gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
                   "gen_max": call("pcie.gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h),
                   "width": call("pcie.width", "nvmlDeviceGetCurrPcieLinkWidth", h),
                   "width_max": call("pcie.width_max", "nvmlDeviceGetMaxPcieLinkWidth", h)}
    _read_ecc(nv, call, h, gpu)
    gpu["compute_capability"] = cc_text(call("compute_capability", "nvmlDeviceGetCudaComputeCapability", h))
    pm = call("persistence", "nvmlDeviceGetPersistenceMode", h)
    gpu["persistence"] = None if pm is None else bool(pm)
    gpu["temperature_c"] = call("temperature", "nvmlDeviceGetTemperature", h,
                                getattr(nv, "NVML_TEMPERATURE_GPU", 0))
    power = call("power", "nvmlDeviceGetPowerUsage", h)
    gpu["power_w"] = None if power is None else round(power / 1000.0, 2)
    limit = call("power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
    gpu["power_limit_w"] = None if limit is None else round(limit / 1000.0, 2)
    pstate = call("perf_state", "nvmlDeviceGetPerformanceState", h)
    gpu["perf_state"] = None if pstate is None else f"P{int(pstate)}"
    mode = call("compute_mode", "nvmlDeviceGetComputeMode", h)
    gpu["compute_mode"] = None if mode is None else COMPUTE_MODES.get(int(mode), str(mode))
    mig = call("mig", "nvmlDeviceGetMigMode", h)
    gpu["mig"] = None if mig is None else bool(mig[0])
    fn = "nvmlDeviceGetCurrentClocksEventReasons"
    if not hasattr(nv, fn):
        fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
    mask = call("throttle", fn, h)
    gpu["throttle"] = {"mask": None if mask is None else int(mask), "reasons": decode_throttle(mask)}
    procs: list[dict[str, Any]] = []
    for kind, name in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                       ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        for p in call(f"processes.{kind}", name, h) or []:
            used = getattr(p, "usedGpuMemory", None)
            procs.append({"pid": int(p.pid), "used_bytes": int(used) if isinstance(used, int) else None,
                          "type": kind, "name": _proc_name(int(p.pid))})
    gpu["processes"] = procs
    return gpu


def _read_ecc(nv: Any, call: _Reader, h: Any, gpu: dict[str, Any]) -> None:
    ecc = gpu["ecc"]
    mode = call("ecc.mode", "nvmlDeviceGetEccMode", h)
    if mode is not None:
        ecc["current"], ecc["pending"] = bool(mode[0]), bool(mode[1])
    if ecc["current"]:
        unc = getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        cor = getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        vol = getattr(nv, "NVML_VOLATILE_ECC", 0)
        agg = getattr(nv, "NVML_AGGREGATE_ECC", 1)
        ecc["volatile_uncorrected"] = call("ecc.volatile_uncorrected", "nvmlDeviceGetTotalEccErrors", h, unc, vol)
        ecc["volatile_corrected"] = call("ecc.volatile_corrected", "nvmlDeviceGetTotalEccErrors", h, cor, vol)
        ecc["aggregate_uncorrected"] = call("ecc.aggregate_uncorrected", "nvmlDeviceGetTotalEccErrors", h, unc, agg)
        ecc["aggregate_corrected"] = call("ecc.aggregate_corrected", "nvmlDeviceGetTotalEccErrors", h, cor, agg)
    rows = call("ecc.remapped_rows", "nvmlDeviceGetRemappedRows", h)
    if rows is not None and len(rows) >= 4:
        ecc["remap_pending"], ecc["remap_failure"] = bool(rows[2]), bool(rows[3])


def sample(nv: Any, gpus: list[dict[str, Any]], seconds: float, interval: float = 0.5,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Sample utilisation and PCIe generation of every GPU for ``seconds``; store ``sample`` on each GPU."""
    handles = []
    for g in gpus:
        try:
            handles.append(nv.nvmlDeviceGetHandleByIndex(g["index"]))
        except nv.NVMLError:
            handles.append(None)
    series: list[dict[str, list[int]]] = [{"util": [], "gen": []} for _ in gpus]
    end = clock() + seconds
    while True:
        for h, s in zip(handles, series):
            if h is None:
                continue
            with contextlib.suppress(nv.NVMLError):
                s["util"].append(int(nv.nvmlDeviceGetUtilizationRates(h).gpu))
            with contextlib.suppress(nv.NVMLError):
                s["gen"].append(int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)))
        if clock() >= end:
            break
        sleep(interval)
    for g, s in zip(gpus, series):
        u, gen = s["util"], s["gen"]
        g["sample"] = {"seconds": seconds, "samples": max(len(u), len(gen)),
                       "util_max": max(u) if u else None, "util_mean": round(sum(u) / len(u), 1) if u else None,
                       "pcie_gen_min": min(gen) if gen else None, "pcie_gen_max": max(gen) if gen else None}


def collect(nv: Any = None, *, sample_s: float = 0.0) -> dict[str, Any]:
    """NVML facts of this machine: driver, CUDA version the driver supports, and every GPU.

    ``nv`` is the ``pynvml`` module (imported here when not given: tests hand in a stand-in).
    """
    if nv is None:
        try:
            import pynvml
        except ImportError as exc:
            return unavailable("module_missing", f"the nvidia-ml-py package (pynvml) is not installed: {exc}")
        nv = pynvml
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        return unavailable(error_kind(exc), f"NVML did not initialise ({exc})")
    except OSError as exc:  # a library that loads but is broken
        return unavailable("library_broken", f"NVML did not initialise ({exc})")
    try:
        facts: dict[str, Any] = {"available": True, "error_kind": None, "error": None, "errors": {}}
        sysinfo = {"driver": "nvmlSystemGetDriverVersion", "cuda_driver": "nvmlSystemGetCudaDriverVersion_v2",
                   "nvml_version": "nvmlSystemGetNVMLVersion"}
        for key, name in sysinfo.items():
            func = getattr(nv, name, None)
            if func is None and key == "cuda_driver":
                func = getattr(nv, "nvmlSystemGetCudaDriverVersion", None)
            try:
                facts[key] = _text(func()) if func is not None else None
            except nv.NVMLError as exc:
                facts[key] = None
                facts["errors"][key] = str(exc)
        cd = facts.get("cuda_driver")
        facts["cuda_driver_version"] = f"{cd // 1000}.{(cd % 1000) // 10}" if isinstance(cd, int) and cd else None
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            facts.update(count=None, gpus=[], error_kind=error_kind(exc),
                         error=f"nvmlDeviceGetCount failed ({exc})")
            return facts
        facts["count"] = count
        facts["gpus"] = [read_gpu(nv, i) for i in range(count)]
        if sample_s > 0 and count:
            sample(nv, facts["gpus"], sample_s)
        return facts
    finally:
        with contextlib.suppress(Exception):  # shutting down must not turn good facts into a crash
            nv.nvmlShutdown()


def from_capture(doc: dict[str, Any]) -> dict[str, Any]:
    """NVML facts from a recorded dump (``{"driver", "cuda_driver", "nvml", "gpus": [{name, uuid, memory,
    util, pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, pci, temp, power_mw, persistence, ecc,
    procs, compute_capability ([major, minor], when recorded)}]}``), in the shape :func:`collect` returns."""
    cd = doc.get("cuda_driver")
    facts: dict[str, Any] = {
        "available": True, "error_kind": None, "error": None, "errors": {},
        "driver": doc.get("driver"), "cuda_driver": cd, "nvml_version": doc.get("nvml"),
        "cuda_driver_version": f"{cd // 1000}.{(cd % 1000) // 10}" if isinstance(cd, int) and cd else None,
    }
    gpus = []
    for i, raw in enumerate(doc.get("gpus") or []):
        g = empty_gpu(i)
        g["name"], g["uuid"] = raw.get("name"), raw.get("uuid")
        g["pci_bus_id"] = (raw.get("pci") or {}).get("busId")
        mem = raw.get("memory") or {}
        g["memory"] = {k: mem.get(k) for k in ("total", "used", "free")}
        util = raw.get("util") or {}
        g["utilization"] = {"gpu": util.get("gpu"), "memory": util.get("memory")}
        g["pcie"] = {"gen": raw.get("pcie_gen"), "gen_max": raw.get("pcie_gen_max"),
                     "width": raw.get("pcie_width"), "width_max": raw.get("pcie_width_max")}
        ecc = raw.get("ecc")
        if isinstance(ecc, list) and len(ecc) >= 2:
            g["ecc"]["current"], g["ecc"]["pending"] = bool(ecc[0]), bool(ecc[1])
        g["compute_capability"] = cc_text(raw.get("compute_capability"))
        pm = raw.get("persistence")
        g["persistence"] = None if pm is None else bool(pm)
        g["temperature_c"] = raw.get("temp")
        pw = raw.get("power_mw")
        g["power_w"] = None if pw is None else round(pw / 1000.0, 2)
        g["processes"] = [{"pid": p.get("pid"), "used_bytes": p.get("usedGpuMemory"), "type": "compute",
                           "name": None} for p in raw.get("procs") or [] if isinstance(p, dict)]
        gpus.append(g)
    facts["count"] = len(gpus)
    facts["gpus"] = gpus
    return facts
