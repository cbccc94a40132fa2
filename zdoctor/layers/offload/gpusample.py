"""Sample GPU utilisation through NVML (``nvidia-ml-py``'s ``pynvml``) for a while.

A crawling offload job shows up as GPUs that sit mostly idle, waiting for the CPU optimizer or for
swaps. :func:`sample` reads ``nvmlDeviceGetUtilizationRates`` of every GPU at an interval and returns
min/mean/max per GPU with a sparkline; where NVML cannot load (no driver, no GPU) it says why.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

SPARKS = "▁▂▃▄▅▆▇█"
#: Longer series are averaged down to this many characters.
SPARK_WIDTH = 60
#: The longest sampling zdoctor will do in one probe.
MAX_SECONDS = 300.0


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """Percentages 0-100 as block characters, averaged into at most ``width`` of them."""
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [sum(chunk) / len(chunk) for chunk in
                  (values[int(i * step):max(int((i + 1) * step), int(i * step) + 1)] for i in range(width))]
    return "".join(SPARKS[min(len(SPARKS) - 1, max(0, int(v / 100 * len(SPARKS))))] for v in values)


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"min": None, "mean": None, "max": None}
    return {"min": min(values), "mean": round(sum(values) / len(values), 1), "max": max(values)}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _load_nvml() -> Any:
    import pynvml

    return pynvml


def sample(seconds: float, interval: float = 0.5, nvml: Any = None, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Sample every GPU for ``seconds`` (capped at :data:`MAX_SECONDS`) every ``interval`` seconds.

    Returns {seconds, interval, samples, gpus: [{index, name, util {min, mean, max}, mem_util {...},
    series, sparkline, errors}], driver} or {"skipped": "NVML unavailable (<reason>)"}.
    """
    seconds = max(0.0, min(float(seconds), MAX_SECONDS))
    interval = max(0.05, float(interval))
    if nvml is None:
        try:
            nvml = _load_nvml()
        except ImportError as exc:
            return {"skipped": f"NVML unavailable (nvidia-ml-py is not installed: {exc})"}
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - pynvml raises NVMLError subclasses (library not found, no driver)
        return {"skipped": f"NVML unavailable ({type(exc).__name__}: {exc})"}
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            return {"skipped": f"NVML unavailable (nvmlDeviceGetCount: {exc})"}
        if count == 0:
            return {"skipped": "NVML reports no GPUs"}
        driver = None
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - the driver version is a nicety
            driver = None
        gpus = []
        for i in range(count):
            entry: dict[str, Any] = {"index": i, "name": None, "handle": None, "series": [], "mem_series": [],
                                     "errors": []}
            try:
                entry["handle"] = nvml.nvmlDeviceGetHandleByIndex(i)
                entry["name"] = _text(nvml.nvmlDeviceGetName(entry["handle"]))
            except Exception as exc:  # noqa: BLE001
                entry["errors"].append(f"{type(exc).__name__}: {exc}")
            gpus.append(entry)
        samples = 0
        deadline = clock() + seconds
        while True:
            for g in gpus:
                if g["handle"] is None:
                    continue
                try:
                    rates = nvml.nvmlDeviceGetUtilizationRates(g["handle"])
                    g["series"].append(float(rates.gpu))
                    g["mem_series"].append(float(rates.memory))
                except Exception as exc:  # noqa: BLE001 - one failed read is one missing sample
                    if len(g["errors"]) < 5:
                        g["errors"].append(f"{type(exc).__name__}: {exc}")
            samples += 1
            if clock() + interval > deadline + 1e-9 or samples * interval >= seconds - 1e-9:
                break
            sleep(interval)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    out = []
    for g in gpus:
        out.append({"index": g["index"], "name": g["name"], "util": _stats(g["series"]),
                    "mem_util": _stats(g["mem_series"]), "series": g["series"][:2000],
                    "sparkline": sparkline(g["series"]), "errors": g["errors"]})
    return {"seconds": seconds, "interval": interval, "samples": samples, "driver": driver, "gpus": out}
