"""Checks ``gpu.capability.precision`` and ``gpu.capability.arch-list``: each GPU's compute capability
against the ds_config's precision, and the architectures the code is (or will be) built for against the
GPUs and against what the installed nvcc can build. The rules are in :mod:`zdoctor.layers.gpu_capability.capability`."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.layers.gpu_capability import capability as cap
from zdoctor.symptoms.match import ids_for

PRECISION = "gpu.capability.precision"
ARCH = "gpu.capability.arch-list"
LAYER = "gpu-capability"


def _gpu_word(g: Mapping[str, Any]) -> str:
    return f"GPU {g.get('index')} ({g.get('name') or '?'}, compute capability {g.get('cc') or 'unknown'})"


def _unknown_cc(gpus: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [g for g in gpus if cap.cc_tuple(g.get("cc")) is None]


def _older(gpus: list[dict[str, Any]], least: tuple[int, int]) -> list[dict[str, Any]]:
    return [g for g in gpus if (cap.cc_tuple(g.get("cc")) or least) < least]


#: What bf16 below compute capability 8.0 does, by whether the installed torch emulates it (True), does not
#: (False), or is not known (None).
_BF16_BELOW_8: dict[Any, str] = {
    True: "this torch answers is_bf16_supported() True below 8.0 when it can make a bf16 tensor "
          "(including_emulation), so DeepSpeed starts and bf16 runs without bf16 hardware: far slower, and kernels "
          "built without a bf16 path for this architecture fail",
    False: "this torch answers is_bf16_supported() False below 8.0: DeepSpeed's engine stops with 'Type bf16 is not "
           "supported on your device.' and torch's autocast with 'Current CUDA Device does not support bfloat16'",
    None: "below 8.0 DeepSpeed's engine stops with 'Type bf16 is not supported on your device.' when torch's "
          "is_bf16_supported() answers False (torch releases that emulate bf16 answer True and run it without bf16 "
          "hardware; which this torch does is not known)",
}


def _bf16(facts: Facts, f: Mapping[str, Any], where: str) -> Finding:
    gpus = f["gpus"]
    old = _older(gpus, cap.BF16_MIN)
    if old:
        torch = f.get("torch") or {}
        how = _BF16_BELOW_8.get(torch.get("bf16_emulation"), _BF16_BELOW_8[None])
        return Finding(
            id=PRECISION, status="fail",
            title=f"bf16 is asked of {_gpu_word(old[0])}: bf16 needs compute capability 8.0 or newer",
            detail=f"The ds_config enables bf16 ({where}); bf16 tensor cores came with compute capability 8.0 "
                   f"(Ampere), and {how}. " + "; ".join(_gpu_word(g) for g in old) + ".",
            remedies=[Remedy(title="Train in fp16 with loss scaling instead: set \"bf16\": {\"enabled\": false} and "
                                   "\"fp16\": {\"enabled\": true} in the ds_config",
                             explanation="fp16 has a narrower range than bf16: DeepSpeed's dynamic loss scaling "
                                         "(fp16.loss_scale 0) keeps gradients from underflowing",
                             note="not tried: it changes the training's numerics"),
                      Remedy(title="Run the job on GPUs of compute capability 8.0 or newer (A100, H100, H200, "
                                   "L40S ...)", note="not tried: it needs other hardware")],
            explains=ids_for(facts, "bf16-unsupported"))
    return Finding(id=PRECISION, status="ok",
                   title=f"bf16 ({where}) runs on every GPU here: all have compute capability 8.0 or newer",
                   detail="; ".join(_gpu_word(g) for g in gpus))


def _fp16(facts: Facts, f: Mapping[str, Any], where: str) -> Finding:
    gpus = f["gpus"]
    old = _older(gpus, cap.FP16_MIN)
    if not old:
        return Finding(id=PRECISION, status="ok",
                       title=f"fp16 ({where}) runs on every GPU here: all have compute capability 7.0 or newer "
                             "(fp16 tensor cores)", detail="; ".join(_gpu_word(g) for g in gpus))
    rule, allowed = f.get("fp16_rule"), f.get("allow_deprecated_fp16")
    six = all((cap.cc_tuple(g.get("cc")) or (0, 0))[0] == 6 for g in old)
    base = (f"The ds_config enables fp16 ({where}); DeepSpeed's CUDA accelerator allows fp16 from compute capability "
            "7.0 (tensor cores). " + "; ".join(_gpu_word(g) for g in old) + ". ")
    if six and rule == "current" and allowed:
        return Finding(id=PRECISION, status="warn",
                       title=f"fp16 on {_gpu_word(old[0])}: allowed only by DS_ALLOW_DEPRECATED_FP16=1, "
                             "without tensor cores",
                       detail=base + "DS_ALLOW_DEPRECATED_FP16=1 lets this DeepSpeed accept it; fp16 on 6.x is "
                                     "deprecated and runs without tensor cores.")
    rems = [Remedy(title="Train in fp32: set \"fp16\": {\"enabled\": false} in the ds_config",
                   note="not tried: it changes the training's numerics and memory")]
    if six and rule == "current":
        rems.insert(0, Remedy(title="Allow DeepSpeed's deprecated fp16 on compute capability 6.x",
                              commands=["export DS_ALLOW_DEPRECATED_FP16=1"], undo=["unset DS_ALLOW_DEPRECATED_FP16"],
                              note="not tried: it needs a GPU of this kind to try on"))
    how = {"current": "this DeepSpeed accepts 6.x only with DS_ALLOW_DEPRECATED_FP16=1, which is not set",
           "old": "this DeepSpeed release has no switch to allow it (is_fp16_supported: major >= 7)"}.get(
        str(rule), "whether this DeepSpeed release has the DS_ALLOW_DEPRECATED_FP16 switch is not known")
    return Finding(id=PRECISION, status="fail",
                   title=f"fp16 is asked of {_gpu_word(old[0])}: DeepSpeed stops with 'Type fp16 is not supported "
                         "on your device.'",
                   detail=base + how + ".", remedies=rems, explains=ids_for(facts, "fp16-unsupported"))


@check(PRECISION, title="GPU compute capability against the ds_config's precision", probes=("gpucap",),
       explains=("bf16-unsupported", "fp16-unsupported"), layer=LAYER)
def check_precision(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("gpucap")
    if not f:
        return [me.not_checked(facts.why_not("gpucap"), sub="not-checked")]
    prec = f.get("precision")
    if not prec:
        return [me.not_checked(f"no ds_config was read: {f.get('precision_why')}", sub="not-checked")]
    asked = {k: v for k, v in prec.items() if (v or {}).get("enabled") not in (False, None)}
    auto = [v["key"] for v in asked.values() if v.get("enabled") == "auto"]
    if auto:
        return [me.not_checked(f"{', '.join(auto)} is \"auto\": the Hugging Face Trainer fills it in at launch from "
                               "its own arguments (--bf16 / --fp16), which zdoctor does not see", sub="not-checked")]
    odd = [f"{v['key']} = {v.get('enabled')!r}" for v in asked.values() if v.get("enabled") is not True]
    if odd:
        return [me.not_checked(f"{', '.join(odd)} is not true or false", sub="not-checked")]
    if not asked:
        return [me.finding(status="ok", title="The ds_config trains in fp32 (bf16 and fp16 are off): no "
                                                         "compute capability is required for its precision")]
    gpus = f.get("gpus") or []
    unknown = _unknown_cc(gpus)
    if not gpus or unknown:
        why = f.get("gpus_why") if not gpus else f"no compute capability for {', '.join(_gpu_word(g) for g in unknown)}"
        return [me.not_checked(f"the ds_config asks for {' and '.join(asked)}, but the GPUs' compute capability is not "
                               f"known: {why}", sub="not-checked")]
    out = []
    if "bf16" in asked:
        out.append(_bf16(facts, f, asked["bf16"].get("where") or asked["bf16"]["key"]))
    if "fp16" in asked:
        out.append(_fp16(facts, f, asked["fp16"].get("where") or asked["fp16"]["key"]))
    return out


# -- arch lists ---------------------------------------------------------------------------------------------


def _codes(pairs: list[list[str]] | list[tuple[str, str]]) -> str:
    return " ".join(sorted({c for _a, c in pairs}, key=lambda c: (len(c), c))) or "none"


def _nvcc_finding(nv: Mapping[str, Any]) -> Finding:
    if nv.get("archs") and not nv.get("error"):
        return Finding(id="gpu.capability.nvcc-archs", status="ok",
                       title=f"nvcc ({nv['path']}) runs and builds {nv['archs'][0]} … {nv['archs'][-1]}",
                       detail="`nvcc --list-gpu-arch` lists: " + " ".join(nv["archs"]) + ". An arch list with an "
                              "architecture not among them stops every CUDA build with 'nvcc fatal : Unsupported "
                              "gpu architecture'.")
    return Finding(id="gpu.capability.nvcc-archs", status="skip",
                   title=f"`{nv.get('path')} --list-gpu-arch` did not answer: {nv.get('error')}",
                   detail="The nvcc torch runs for JIT builds could not say which architectures it builds (nvcc "
                          "before CUDA 11 has no --list-gpu-arch), so the arch lists are not judged against it.")


def _arch_list_finding(facts: Facts, f: Mapping[str, Any]) -> Finding:
    """The arch list DeepSpeed's next JIT build uses, against nvcc and the GPUs."""
    gpus = f.get("gpus") or []
    ccs = [g.get("cc") for g in gpus]
    listed, source = cap.deepspeed_jit_list(f.get("env_arch_list"), ccs)
    if listed is None:
        return Finding(id=ARCH, status="skip", title="The arch list of the next JIT build is not known",
                       detail=f"TORCH_CUDA_ARCH_LIST is not set, so DeepSpeed builds CUDA ops for {source}: "
                              f"{f.get('gpus_why') or 'a GPU without a known compute capability'}.")
    names = cap.named_entries(listed)
    if names:
        numeric = cap.expand_arch_list(";".join(e for e in (f.get("env_arch_list") or "").replace(" ", ";").split(";")
                                                if e))
        fix = ";".join(e["text"] for e in numeric["entries"]) if not numeric["unknown"] else ""
        rule = f.get("names_rule")
        return Finding(
            id=ARCH, status="fail" if rule == "current" else "warn",
            title=f"TORCH_CUDA_ARCH_LIST names {names[0]!r}: DeepSpeed's JIT build reads each entry as numbers"
                  + (" and stops with \"ValueError: invalid literal for int() with base 10: "
                     f"'{names[0].split('+')[0]}'\"" if rule == "current" else ""),
            detail="torch expands names such as Ampere and Hopper, but DeepSpeed's op builder sorts the entries by "
                   "int() of their parts before torch sees them"
                   + (" (the installed release does, rule jit-arch-list-numbers)." if rule == "current" else
                      "; whether the installed release does is not known (0.19.8 does)."),
            remedies=[Remedy(title="Write the list as numbers (torch's own expansion of the names)",
                             commands=[f"export TORCH_CUDA_ARCH_LIST={shlex.quote(fix)}"],
                             note="not tried: it changes what every op is built for")] if fix else [])
    parsed = cap.expand_arch_list(listed)
    if parsed["unknown"]:
        return Finding(id=ARCH, status="fail",
                       title=f"TORCH_CUDA_ARCH_LIST={listed!r}: torch refuses {parsed['unknown'][0]!r}",
                       detail=f"torch raises 'Unknown CUDA arch ({parsed['unknown'][0]}) or GPU not supported' for "
                              f"an entry it does not know (from {source}); every JIT build of a CUDA op stops there.",
                       remedies=[Remedy(title="Set TORCH_CUDA_ARCH_LIST to the GPUs' compute capabilities",
                                        commands=[f"export TORCH_CUDA_ARCH_LIST={shlex.quote(c)}" for c in
                                                  [";".join(sorted({x for x in ccs if x}))] if c][:1],
                                        note="not tried: it changes what every op is built for")])
    pairs = cap.gencode_of_entries(parsed["entries"])
    nv = f.get("nvcc") or {}
    bad = cap.unbuildable(pairs, nv.get("archs") or []) if nv.get("archs") else []
    if bad:
        keep = [e["text"] for e in parsed["entries"]
                if not cap.unbuildable(cap.gencode_of_entries([e]), nv["archs"])]
        own = [g for g in gpus if cap.cc_tuple(g.get("cc")) and
               f"compute_{cap.arch_number(cap.cc_tuple(g['cc']) or (0, 0))}" in bad]
        rems = []
        if keep and not own:
            rems.append(Remedy(title=f"Leave out what this nvcc cannot build ({', '.join(bad)})",
                               commands=[f"export TORCH_CUDA_ARCH_LIST={shlex.quote(';'.join(keep))}"],
                               note="not tried: it changes what every op is built for"))
        if own:
            rems += _newer_gpu_remedies(facts, bad, nv)
        else:
            rems.append(Remedy(title="Build with a CUDA toolkit whose nvcc still builds "
                                     f"{', '.join(bad)} (point CUDA_HOME at it)",
                               note="not tried: it needs another CUDA toolkit installed"))
        return Finding(id=ARCH, status="fail",
                       title=f"The arch list {listed!r} asks nvcc for {', '.join(bad)}, which {nv.get('path')} cannot "
                             "build: 'nvcc fatal : Unsupported gpu architecture'",
                       detail=f"The list comes from {source}. `nvcc --list-gpu-arch` lists {nv['archs'][0]} … "
                              f"{nv['archs'][-1]}; each CUDA op's JIT build stops with nvcc fatal : Unsupported gpu "
                              f"architecture '{bad[0]}'."
                              + (f" The GPUs themselves need it: {', '.join(map(_gpu_word, own))}." if own else ""),
                       remedies=rems,
                       explains=[i for a in bad for i in ids_for(facts, "nvcc-arch", arch=a)])
    missing = [g for g in gpus if cap.cc_tuple(g.get("cc")) and cap.runs_on(cap.cc_tuple(g["cc"]) or (0, 0), pairs)
               is None]
    if missing:
        return Finding(id=ARCH, status="fail",
                       title=f"The arch list {listed!r} has no kernel for {_gpu_word(missing[0])}",
                       detail=f"The list comes from {source}; the ops it builds fail on that GPU with 'no kernel "
                              "image is available for execution on the device'.",
                       remedies=[Remedy(title="Add the GPUs' compute capability to TORCH_CUDA_ARCH_LIST",
                                        commands=[f"export TORCH_CUDA_ARCH_LIST={shlex.quote(listed + ';' + g['cc'])}"
                                                  for g in missing[:1]],
                                        note="not tried: the ops are rebuilt at the next launch")],
                       explains=ids_for(facts, "cuda-arch"))
    judged = "nvcc builds every entry" if nv.get("archs") else "whether nvcc builds it is not known"
    unknown = _unknown_cc(gpus)
    covers = ", and it covers every GPU here" if gpus and not unknown else ""
    why = (f" Whether it covers the GPUs is not known: {f.get('gpus_why')}." if not gpus else
           f" Whether it covers {', '.join(map(_gpu_word, unknown))} is not known." if unknown else "")
    return Finding(id=ARCH, status="ok" if nv.get("archs") else "skip",
                   title=f"The arch list of the next JIT build ({listed!r}, from {source}): {judged}{covers}",
                   detail="torch emits " + " ".join(f"-gencode=arch={a},code={c}" for a, c in pairs) + "." + why)


def _newer_gpu_remedies(facts: Facts, bad: list[str], nv: Mapping[str, Any]) -> list[Remedy]:
    """For a GPU newer than the installed nvcc: the toolkit that builds its architecture, and an arch list with
    PTX of the newest architecture that nvcc builds, with the trial compile's result (the ``archtrial`` probe)."""
    known = {a: cap.toolkit_for(a) for a in bad}
    versions = sorted({v for v in known.values() if v}, key=lambda v: tuple(map(int, v.split("."))))
    rems = [Remedy(title=(f"Build with CUDA {versions[-1]} or newer, whose nvcc builds {', '.join(bad)} (point "
                          "CUDA_HOME at it)" if versions and all(known.values()) else
                          f"Build with a CUDA toolkit whose nvcc --list-gpu-arch lists {', '.join(bad)} (point "
                          "CUDA_HOME at it)"),
                   note="not tried, because it needs another CUDA toolkit installed",
                   explanation="; ".join(f"{a}: CUDA {v} or newer ({cap.TOOLKIT_SOURCES.get(v, 'NVIDIA')})"
                                         for a, v in known.items() if v))]
    trial = facts.of("archtrial") or {}
    if not trial.get("arch_list"):
        return rems
    listed = str(trial["arch_list"])
    if not trial.get("tried"):
        state: dict[str, Any] = {"note": f"not tried, because {trial.get('why') or 'the trial compile did not run'}"}
    elif trial.get("ok"):
        state = {"tried": True, "verified": True,
                 "note": f"tried: {nv.get('path')} compiled a kernel with {' '.join(trial.get('flags') or [])}"}
    else:
        state = {"tried": True, "verified": False,
                 "note": f"tried: {nv.get('path')} did not compile it: {trial.get('error')}"}
    rems.append(Remedy(title=f"Build PTX of the newest architecture this nvcc knows: TORCH_CUDA_ARCH_LIST={listed}",
                       commands=[f"export TORCH_CUDA_ARCH_LIST={shlex.quote(listed)}"],
                       explanation="The driver compiles the PTX for the newer GPU when the op loads (slower first "
                                   "start, and none of that GPU's own instructions); the ops are rebuilt at the next "
                                   "launch.", **state))
    return rems


def _kernel_image(facts: Facts, fid: str, what: str, pairs: list[list[str]], gpus: Sequence[Mapping[str, Any]],
                  nv: Mapping[str, Any], rebuild_hint: str) -> Finding:
    tuples = [(a, c) for a, c in pairs]
    known = [g for g in gpus if cap.cc_tuple(g.get("cc"))]
    missing = [g for g in known if cap.runs_on(cap.cc_tuple(g["cc"]) or (0, 0), tuples) is None]
    if missing:
        return Finding(id=fid, status="fail",
                       title=f"{what} has no kernel for {_gpu_word(missing[0])}: 'no kernel image is available for "
                             "execution on the device'",
                       detail=f"{what} holds {_codes(pairs)}; a GPU of capability X.Y runs a cubin sm_XZ with Z <= Y "
                              f"or PTX of an older architecture, and there is none for it. {rebuild_hint}",
                       explains=ids_for(facts, "cuda-arch"))
    bad = cap.unbuildable(tuples, nv.get("archs") or []) if nv.get("archs") else []
    if bad:
        return Finding(id=fid, status="warn",
                       title=f"{what} was built for {', '.join(bad)}, which the installed nvcc cannot build: its next "
                             "rebuild stops with 'nvcc fatal : Unsupported gpu architecture'",
                       detail=f"{what} holds {_codes(pairs)}; `nvcc --list-gpu-arch` lists {nv['archs'][0]} … "
                              f"{nv['archs'][-1]}. It runs as built, but any change that rebuilds it (a new torch, "
                              "DeepSpeed or compiler) fails until the arch list drops those.",
                       explains=[i for a in bad for i in ids_for(facts, "nvcc-arch", arch=a)])
    if not gpus or len(known) < len(gpus):
        return Finding(id=fid, status="skip", title=f"{what}: built for {_codes(pairs)}; the GPUs' compute capability "
                                                    "is not known, so whether it runs on them is not",
                       detail=str(nv.get("error") or ""))
    return Finding(id=fid, status="ok", title=f"{what} runs on every GPU here (built for {_codes(pairs)})",
                   detail="; ".join(f"{_gpu_word(g)}: {cap.runs_on(cap.cc_tuple(g['cc']) or (0, 0), tuples)}"
                                    for g in known))


@check(ARCH, title="Architectures built for, against the GPUs and the installed nvcc", probes=("gpucap",),
       optional=("archtrial",),
       findings=("gpu.capability.nvcc-archs", "gpu.capability.kernel-image.*"),
       explains=("nvcc-arch", "cuda-arch"), layer=LAYER)
def check_arch_list(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("gpucap")
    if not f:
        return [me.not_checked(facts.why_not("gpucap"), sub="not-checked")]
    nv = f.get("nvcc") or {}
    gpus = f.get("gpus") or []
    if not nv.get("ran") and not gpus:
        return [me.not_checked(f"no nvcc ({nv.get('error')}) and no GPU list ({f.get('gpus_why')})", sub="not-checked")]
    out: list[Finding] = []
    if nv.get("ran"):
        out.append(_nvcc_finding(nv))
    out.append(_arch_list_finding(facts, f))
    torch = f.get("torch") or {}
    if torch.get("cuda") and torch.get("build_pairs") is not None and gpus:
        out.append(_kernel_image(facts, "gpu.capability.kernel-image.torch", f"torch {torch.get('version')}",
                                 torch["build_pairs"], gpus, {},
                                 "Install a torch wheel built for it (an older CUDA line keeps older GPUs)."))
    for op in f.get("ops") or []:
        built = op.get("so_pairs")  # what the built library holds wins over what build.ninja asked for
        pairs = built if built else op.get("pairs")
        if (op.get("cuda") or built) and pairs:
            what = f"JIT op {op['name']}" + (" (its built .so)" if built else " (its build.ninja)")
            out.append(_kernel_image(facts, f"gpu.capability.kernel-image.{op['name']}", what, pairs, gpus, nv,
                                     "torch rebuilds it for the new arch list when TORCH_CUDA_ARCH_LIST changes."))
    for pre in f.get("prebuilt") or []:
        if pre.get("pairs"):
            out.append(_kernel_image(facts, f"gpu.capability.kernel-image.{pre['name']}",
                                     f"prebuilt op {pre['name']} ({pre['path']})", pre["pairs"], gpus, {},
                                     "Reinstall DeepSpeed with DS_BUILD_OPS=1 and TORCH_CUDA_ARCH_LIST naming the "
                                     "GPUs' compute capability, or let it JIT-build the op."))
    return out
