"""Probe ``gpucap``: each GPU's compute capability next to what the job asks of it (the rules are in
:mod:`zdoctor.layers.gpu_capability.capability`; the judging in :mod:`zdoctor.layers.gpu_capability.check_gpucap`).

Facts (plain JSON):

- ``gpus``: [{index, name, cc ("9.0" | None: unknown)}] from the nvml probe; ``gpus_why``: why there are
  none (no NVML, no GPU), else None.
- ``nvcc``: {path (the nvcc torch runs: ``$CUDA_HOME/bin/nvcc``), ran, archs (``nvcc --list-gpu-arch``:
  ["compute_75", ...]), error}; ``path`` None when there is no CUDA toolkit.
- ``env_arch_list``: ``TORCH_CUDA_ARCH_LIST`` of the training environment (None: unset).
- ``torch``: {version, cuda (None: a CPU build), build_pairs ([[arch, code]] torch itself was built with, from
  torch.__config__.show(); None: not known), bf16_emulation (its is_bf16_supported() says True below 8.0 when
  a bf16 tensor can be made; None: not known)}.
- ``ops``: [{name, dir, cuda (build.ninja runs nvcc), pairs ([[arch, code]] of its -gencode flags), so_path,
  so_pairs (read from the built .so's fatbin; [] when it has none, None when unread), error}] for the JIT ops
  the training interpreter uses; ``prebuilt``: [{name, path, cuda, pairs, error}] for the ops shipped in the
  deepspeed package.
- ``precision``: the dsconfig probe's precision (None without a ds_config) and ``precision_why``;
  ``fp16_rule``, ``names_rule``: the installed DeepSpeed's state of the rules ``fp16-compute-capability`` and
  ``jit-arch-list-numbers``;
  ``allow_deprecated_fp16``: DS_ALLOW_DEPRECATED_FP16 is 1 in the training environment.
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.factstypes import GpucapFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.gpu_capability import capability as cap
from zdoctor.layers.gpu_capability import fatbin
from zdoctor.proc.runner import run
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import read_prefix

NVCC_TIMEOUT = 20.0
MAX_NINJA_BYTES = 256 * 1024


def _gpus(nv: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    gpus = [{"index": g.get("index"), "name": g.get("name"), "cc": g.get("compute_capability")}
            for g in nv.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        return gpus, None
    return [], nv.get("skipped") or "the nvml probe gave no GPU list (no NVIDIA driver here)"


def list_gpu_arch(nvcc: str | None, env: dict[str, str], timeout: float = NVCC_TIMEOUT
                  ) -> tuple[dict[str, Any], list[Evidence]]:
    """``nvcc --list-gpu-arch`` of the nvcc torch runs, run for real."""
    out: dict[str, Any] = {"path": nvcc, "ran": False, "archs": [], "error": None}
    if not nvcc:
        out["error"] = "no CUDA toolkit: torch finds no nvcc (CUDA_HOME unset, no nvcc on PATH or in /usr/local/cuda)"
        return out, []
    if not os.path.isfile(nvcc):
        out["error"] = f"no nvcc at {nvcc}"
        return out, []
    ev = run([nvcc, "--list-gpu-arch"], env=env, timeout=timeout, label=f"{nvcc} --list-gpu-arch")
    out["ran"] = True
    archs = cap.parse_list_gpu_arch(ev.stdout)
    if ev.error or ev.exit_code != 0 or not archs:
        out["error"] = ev.error or (f"exit code {ev.exit_code}: {(ev.stderr or ev.stdout).strip()[:300]}"
                                    if ev.exit_code != 0 else "it listed no compute_XY architecture")
    out["archs"] = archs
    return out, [ev]


def run_nvcc(env: dict[str, str], cuda_stack: dict[str, Any] | None, timeout: float = NVCC_TIMEOUT
             ) -> tuple[dict[str, Any], list[Evidence]]:
    """``nvcc --list-gpu-arch`` of the nvcc the cuda_stack probe found torch running."""
    nvcc_path = ((cuda_stack or {}).get("nvcc") or {}).get("path") or ((cuda_stack or {}).get("cuda_home") or
                                                                       {}).get("nvcc")
    return list_gpu_arch(nvcc_path, env, timeout)


def op_archs(op: dict[str, Any]) -> dict[str, Any]:
    """The architectures one JIT op carries: read from its built .so when there is one, and the -gencode
    flags of its build.ninja."""
    rec: dict[str, Any] = {"name": op.get("name"), "dir": op.get("dir"), "cuda": None, "pairs": [], "error": None,
                           "so_path": op.get("so_path"), "so_pairs": None}
    if op.get("so_path") and (op.get("so_info") or {}).get("kind") in (None, "elf"):
        got = fatbin.read_archs(str(op["so_path"]))
        rec["so_pairs"] = got["pairs"] if got["cuda"] else [] if got["cuda"] is False else None
    try:
        data, _cut = read_prefix(os.path.join(str(op.get("dir")), "build.ninja"), MAX_NINJA_BYTES, nofollow=True)
    except OSError as exc:
        rec["error"] = f"build.ninja: {exc.strerror or exc}"
        return rec
    text = data.decode("utf-8", "replace")
    rec["cuda"] = any(line.startswith("nvcc ") or line.startswith("nvcc=") for line in text.splitlines())
    rec["pairs"] = [list(p) for p in cap.gencode_pairs(text)]
    return rec


def torch_emulates_bf16(torch_location: str | None) -> bool | None:
    """Whether the installed torch's ``torch.cuda.is_bf16_supported()`` answers True below compute capability
    8.0 when a bf16 tensor can be made (its ``including_emulation`` argument, read from torch/cuda/__init__.py);
    None when the file cannot be read."""
    if not torch_location:
        return None
    try:
        data, _cut = read_prefix(os.path.join(torch_location, "cuda", "__init__.py"), 2 * 1024 * 1024)
    except OSError:
        return None
    return b"def is_bf16_supported(including_emulation" in data


def prebuilt_archs(paths: list[str]) -> list[dict[str, Any]]:
    """The architectures each op shipped inside the deepspeed package carries (DS_BUILD_OPS=1 installs)."""
    out = []
    for path in paths:
        got = fatbin.read_archs(path)
        name = os.path.basename(path).split(".", 1)[0]
        out.append({"name": name, "path": path, "cuda": got["cuda"], "pairs": got["pairs"], "error": got["error"]})
    return out


def collect_gpucap(env: dict[str, str], nv: dict[str, Any], cuda_stack: dict[str, Any], pyenv: dict[str, Any],
                   jit: dict[str, Any], dsconfig: dict[str, Any] | None, dsrelease: dict[str, Any],
                   *, dsconfig_why: str = "no ds_config given (--ds-config)", timeout: float = NVCC_TIMEOUT,
                   nvcc_run: tuple[dict[str, Any], list[Evidence]] | None = None,
                   ) -> tuple[dict[str, Any], list[Evidence]]:
    """The gpucap facts from the other probes' facts (``{}`` for one that gave none) and a real nvcc run
    (``nvcc_run``: :func:`run_nvcc`'s, when it ran already)."""
    gpus, gpus_why = _gpus(nv or {})
    nvcc, evidence = nvcc_run if nvcc_run is not None else run_nvcc(env, cuda_stack, timeout)
    torch = (pyenv or {}).get("torch") or {}
    imported = (torch.get("import") or {}).get("state") == "ok"
    pairs = cap.torch_build_pairs(torch.get("config")) if imported else None
    ops = [op_archs(op) for op in (jit or {}).get("ops") or []
           if isinstance(op, dict) and op.get("in_use") is not False]
    rules = (dsrelease or {}).get("rules") or {}
    rule = (rules.get("fp16-compute-capability") or {}).get("state")
    facts: dict[str, Any] = {
        "gpus": gpus, "gpus_why": gpus_why, "nvcc": nvcc, "env_arch_list": env.get("TORCH_CUDA_ARCH_LIST"),
        "torch": {"version": torch.get("version") if imported else None,
                  "cuda": torch.get("cuda") if imported else None, "imported": imported,
                  "build_pairs": [list(p) for p in pairs] if pairs is not None else None,
                  "bf16_emulation": torch_emulates_bf16(torch.get("location") if isinstance(torch.get("location"), str)
                                                        else None)},
        "ops": ops,
        "prebuilt": prebuilt_archs([p for p in ((jit or {}).get("deepspeed") or {}).get("prebuilt_ops") or []
                                    if isinstance(p, str)]),
        "precision": (dsconfig or {}).get("precision") if dsconfig else None,
        "precision_why": None if dsconfig and dsconfig.get("precision") else
        ((dsconfig or {}).get("error") or dsconfig_why),
        "fp16_rule": rule or "unknown",
        "names_rule": (rules.get("jit-arch-list-numbers") or {}).get("state") or "unknown",
        "allow_deprecated_fp16": env.get("DS_ALLOW_DEPRECATED_FP16") == "1",
    }
    rows = [[f"GPU {g['index']}", g.get("name") or "?", g.get("cc") or "unknown"] for g in gpus] or \
        [["GPUs", "-", f"not known: {gpus_why}"]]
    rows.append(["nvcc --list-gpu-arch", nvcc["path"] or "-",
                 " ".join(nvcc["archs"]) if nvcc["archs"] else nvcc["error"] or "-"])
    rows.append(["TORCH_CUDA_ARCH_LIST", "training environment", env.get("TORCH_CUDA_ARCH_LIST") or "(not set)"])
    rows.append(["torch's own kernels", torch.get("version") or "-",
                 " ".join(sorted({c for _a, c in pairs})) if pairs else "not known"])
    rows += [[f"JIT op {o['name']}", o["dir"] or "-", " ".join(sorted({c for _a, c in o["so_pairs"] or o["pairs"]}))
              or ("no CUDA code" if o["cuda"] is False else o["error"] or "no -gencode flags")] for o in ops]
    rows += [[f"prebuilt op {o['name']}", o["path"], " ".join(sorted({c for _a, c in o["pairs"]})) or
              ("no CUDA code" if o["cuda"] is False else o["error"] or "-")] for o in facts["prebuilt"]]
    evidence.insert(0, Evidence.of_table("compute capability and the architectures built for",
                                         ["what", "where", "value"], rows))
    return facts, evidence


@probe("gpucap", title="GPU compute capability against the job's precision and arch lists", timeout=NVCC_TIMEOUT + 15,
       needs=("nvml", "cuda_stack", "pyenv", "jitcache", "dsconfig", "dsrelease"), background=True, facts=GpucapFacts)
def gpucap_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Compute capability per GPU, ``nvcc --list-gpu-arch``, and the arch lists of torch and the JIT ops."""
    env = dict(target_of(host).env)
    stack = facts_of(host, "cuda_stack")
    nvcc_run = run_nvcc(env, stack)  # while torch's import (the pyenv probe) still runs
    ds = facts_of(host, "dsconfig")
    nv = facts_of(host, "nvml") or {"skipped": _why_not(host, "nvml", "the nvml probe gave no facts")}
    return collect_gpucap(env, nv, stack, facts_of(host, "pyenv"), facts_of(host, "jitcache"), ds or None,
                          facts_of(host, "dsrelease"),
                          dsconfig_why=_why_not(host, "dsconfig", "no ds_config given (--ds-config)"),
                          nvcc_run=nvcc_run)


def _why_not(host: Any, name: str, default: str) -> str:
    """Why probe ``name`` gave no facts on ``host`` (its skip reason or error), else ``default``."""
    try:
        res = host.result(name)
        return res.error or (res.facts or {}).get("skipped") or default
    except Exception:  # noqa: BLE001 - only the wording of why a fact is unknown
        return default
