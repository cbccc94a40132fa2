"""What the GPU checks (:mod:`zdoctor.layers.gpu.check_gpu`, ``cuda``, ``nccl``, ``gpuenv``, ``limits``) read the same
way: a probe's facts, the GPUs NVML found, the training interpreter's pip, and ``n/a`` for what is unknown."""

from __future__ import annotations

import shlex
from typing import Any

from zdoctor.core.registry import Facts
from zdoctor.core.shellquote import shell_quote
from zdoctor.proc.target import DEFAULT_PYTHON


def result_facts(facts: Facts, name: str) -> dict[str, Any] | None:
    """Facts of a probe that ran (``ok``) or skipped with a reason (``skip``); None otherwise."""
    res = facts.get(name)
    if res is None or res.status not in ("ok", "skip"):
        return None
    return res.facts


def nvml_gpus(facts: Facts) -> list[dict[str, Any]] | None:
    """The GPUs the nvml probe found (None when it found none or did not run)."""
    f = facts.of("nvml")
    return [dict(g) for g in f.get("gpus") or []] if f and f.get("count") else None


def _python(facts: Facts) -> str:
    py = facts.of("pyenv") or {}
    return (py.get("target") or {}).get("resolved") or (py.get("python") or {}).get("executable") or DEFAULT_PYTHON


def pip_line(facts: Facts, *args: str) -> str:
    """A ``python -m pip ARGS`` line for the training interpreter, quoted."""
    return " ".join([shell_quote(_python(facts)), "-m", "pip", *(shlex.quote(a) for a in args)])


def na(v: Any) -> str:
    """``v`` as text, ``n/a`` when it is not known."""
    return "n/a" if v is None else str(v)
