"""Probe ``archtrial``: the arch list the ``gpu.capability.arch-list`` check proposes for a GPU newer than the
installed nvcc (:func:`zdoctor.layers.gpu_capability.capability.ptx_arch_list`), compiled for real: a tiny
kernel built by that nvcc with the ``-gencode`` flags torch emits for the list, through the runner, bounded.

Facts: ``arch_list`` (the proposal), ``nvcc`` (its path), ``tried`` (a compile ran), ``ok`` (it built),
``flags``, ``error`` (nvcc's last words when it failed), ``why`` (why it was not tried), ``skipped`` (nothing
to propose).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zdoctor.core.factstypes import ArchtrialFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.gpu_capability import capability as cap
from zdoctor.proc.runner import run
from zdoctor.proc.scratch import private_folder
from zdoctor.proc.target import target_of

COMPILE_TIMEOUT = 120.0
KERNEL = "__global__ void zdoctor_arch_trial(float *x) { x[threadIdx.x] *= 2.0f; }\n"


def try_arch_list(gpucap: Mapping[str, Any], env: Mapping[str, str], timeout: float = COMPILE_TIMEOUT
                  ) -> tuple[dict[str, Any], list[Evidence]]:
    """Propose the list from the gpucap facts and compile a kernel for it with their nvcc, when there is one."""
    nv = gpucap.get("nvcc") or {}
    listed, _ = cap.deepspeed_jit_list(gpucap.get("env_arch_list"), [g.get("cc") for g in gpucap.get("gpus") or []])
    proposal = cap.ptx_arch_list(listed, [g.get("cc") for g in gpucap.get("gpus") or []], nv.get("archs") or []) \
        if listed and nv.get("archs") and not cap.named_entries(listed) else None
    if proposal is None:
        return {"skipped": "no arch list to propose: nvcc builds every GPU's own architecture here, or the list, "
                           "the GPUs or nvcc's architectures are not known"}, []
    nvcc = nv.get("path")
    pairs = cap.gencode_of_entries(cap.expand_arch_list(proposal)["entries"])
    flags = [f"-gencode=arch={a},code={c}" for a, c in pairs]
    facts: dict[str, Any] = {"arch_list": proposal, "nvcc": nvcc, "tried": False, "ok": None, "flags": flags,
                             "error": None, "why": None}
    if not nvcc or not os.path.isfile(nvcc):
        facts["why"] = f"no nvcc here ({nvcc or 'no CUDA toolkit found'})"
        return facts, []
    with private_folder("archtrial-") as d:
        src, obj = os.path.join(d, "trial.cu"), os.path.join(d, "trial.o")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(KERNEL)
        ev = run([nvcc, *flags, "-c", src, "-o", obj], env=dict(env), timeout=timeout, cwd=d,
                 label=f"{nvcc} {' '.join(flags)} -c trial.cu (TORCH_CUDA_ARCH_LIST={proposal})")
        facts["tried"] = True
        facts["ok"] = ev.error is None and ev.exit_code == 0 and os.path.isfile(obj)
    if not facts["ok"]:
        facts["error"] = ev.error or (ev.stderr or ev.stdout).strip()[-300:] or f"exit code {ev.exit_code}"
    return facts, [ev]


@probe("archtrial", title="The proposed arch list, compiled by the toolkit's nvcc", timeout=COMPILE_TIMEOUT + 10,
       needs=("gpucap",), facts=ArchtrialFacts)
def archtrial_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    return try_arch_list(facts_of(host, "gpucap"), target_of(host).env)
