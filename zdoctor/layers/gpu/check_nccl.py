"""The NCCL check: the NCCL libraries the training can load vs the NCCL torch was built with."""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.core.shellquote import shell_quote
from zdoctor.layers.gpu import cuda
from zdoctor.layers.gpu import nccl as ncclmod
from zdoctor.readers.gpufacts import pip_line, result_facts


def _first_loaded_from_env(nf: dict[str, Any]) -> dict[str, Any] | None:
    """The NCCL the process mapped, when the loader took it from LD_LIBRARY_PATH or LD_PRELOAD."""
    loaded = next((p for p in nf.get("providers") or [] if p.get("loaded")), None)
    return loaded if loaded and loaded["kind"] in ("ld_library_path", "preload") else None


def _nccl_remedies(facts: Facts, nf: dict[str, Any], analysis: dict[str, Any]) -> tuple[list[Remedy], list[str]]:
    """The fixes (alternatives), and the lines that say which fix is not offered and why."""
    out: list[Remedy] = []
    withheld: list[str] = []
    env_first = _first_loaded_from_env(nf)
    then_reinstall = None
    req = nf.get("torch_requires") or {}
    kinds = {p["kind"] for p in analysis["problems"]}
    major = req.get("cuda_major") or (cuda.parse_cuda(nf.get("torch_cuda")) or (None,))[0]
    keep = req.get("dist") or (f"nvidia-nccl-cu{major}" if major else None)
    whl = nf.get("wheels") or []
    if "two_wheels" in kinds and keep:
        extra = sorted({w["dist"] for w in whl if w["dist"] != keep})
        pin = f"{keep}=={req['version']}" if req.get("version") else keep
        out.append(Remedy(title=f"Keep only {keep} (torch's own)",
                          commands=[pip_line(facts, "uninstall", "-y", *extra),
                                    pip_line(facts, "install", "--force-reinstall", "--no-deps", pin)],
                          verified=None,
                          explanation="Both wheels install the same file, nvidia/nccl/lib/libnccl.so.2: uninstalling "
                                      "one deletes the copy the other relies on, so the second line puts torch's "
                                      "version back."))
    elif {"loaded_older", "import_symbol", "versions_differ"} & kinds and keep and req.get("version") and env_first:
        installed = next((p.get("version") for p in nf.get("providers") or [] if p["kind"] == "pip"), None)
        via = env_first["kind"].replace("_", " ")
        withheld.append(f"Not offered: reinstalling {keep}=={req['version']} alone, because {env_first['path']} "
                        f"(NCCL {env_first.get('version') or 'version unknown'}, from {via}) is the copy the "
                        "loader mapped, and it would still load first after the reinstall"
                        + (f" (the wheel already holds NCCL {installed})" if installed else "") + ".")
        if installed != req["version"]:
            then_reinstall = pip_line(facts, "install", "--force-reinstall", "--no-deps", f"{keep}=={req['version']}")
    elif {"loaded_older", "import_symbol", "versions_differ"} & kinds and keep and req.get("version"):
        out.append(Remedy(title=f"Reinstall the NCCL torch was built with ({keep}=={req['version']})",
                          commands=[pip_line(facts, "install", "--force-reinstall", "--no-deps",
                                         f"{keep}=={req['version']}")],
                          verified=None))
    env_pre = [p for p in nf.get("providers") or [] if p["kind"] == "preload"]
    if env_pre:
        pre_now = (nf.get("env") or {}).get("LD_PRELOAD") or _env_value(facts, "LD_PRELOAD") or ""
        rest = [x for x in pre_now.replace(":", " ").split() if "libnccl" not in x]
        cmd = f"export LD_PRELOAD={shell_quote(' '.join(rest))}" if rest else "unset LD_PRELOAD"
        out.append(Remedy(title="Stop preloading an NCCL library", commands=[cmd, *_step(then_reinstall)],
                          verified=None,
                          explanation="LD_PRELOAD loads " + ", ".join(p["path"] for p in env_pre) + " before torch, "
                                      "and the first libnccl.so.2 loaded wins; the other preloaded libraries stay."))
    llp = [p for p in nf.get("providers") or []
           if p["kind"] == "ld_library_path" and p.get("version") != analysis["expected"]]
    if llp:
        dirs = {os.path.dirname(p["path"]) for p in llp}
        llp_now = (nf.get("env") or {}).get("LD_LIBRARY_PATH") or _env_value(facts, "LD_LIBRARY_PATH") or ""
        keep_dirs = [d for d in llp_now.split(":") if d and d not in dirs]
        cmd = f"export LD_LIBRARY_PATH={shell_quote(':'.join(keep_dirs))}" if keep_dirs else "unset LD_LIBRARY_PATH"
        out.append(Remedy(title="Take the other NCCL's directory off LD_LIBRARY_PATH",
                          commands=[cmd, *_step(then_reinstall)], verified=None,
                          explanation="Removes exactly " + ", ".join(sorted(dirs)) + " from LD_LIBRARY_PATH; any other "
                                      "library in those directories is no longer found through it either."))
    return out, withheld


def _step(line: str | None) -> list[str]:
    return [line] if line else []


def _env_value(facts: Facts, name: str) -> str | None:
    py = facts.of("pyenv") or {}
    return (py.get("env") or {}).get(name)


@check("gpu.nccl", title="NCCL libraries vs torch's NCCL", probes=("nccl", "pyenv"))
def check_nccl(facts: Facts, me: CheckSpec) -> list[Finding]:
    nf = result_facts(facts, "nccl")
    if nf is None or nf.get("skipped"):
        return [me.not_checked((nf or {}).get("skipped") or facts.why_not("nccl"))]
    a = ncclmod.analyze(nf)
    ev = facts.evidence("nccl")
    lines = [p["text"] for p in a["problems"]] + a["notes"]
    if any(p["kind"] in ("loaded_older", "import_symbol", "two_wheels", "versions_differ") for p in a["problems"]):
        lines.append("Two NCCL providers is the `undefined symbol: ncclCommRegister` (or ncclCommResume ...) class "
                     "of failure: the first libnccl.so.2 loaded into the process wins, and when it is older than "
                     "the NCCL torch was built with, symbols torch calls are missing. NCCL links the CUDA runtime "
                     "statically and takes no symbols from libcudart.")
    req = nf.get("torch_requires") or {}
    if a["status"] == "ok":
        loaded = [p["path"] for p in nf.get("providers") or [] if p.get("loaded")]
        title = f"NCCL {a['runtime'] or '?'}" + (f" as torch's wheel requires ({req['dist']}=={req['version']})"
                                                 if req.get("version") else "")
        lines.insert(0, ("torch loaded " + ", ".join(loaded) + ".") if loaded else
                     "Which libnccl.so.2 torch maps is unknown (torch was not imported).")
        return [me.finding(status="ok", title=title, detail="\n".join(lines), evidence=ev)]
    title = {"fail": "torch runs with an older NCCL than it was built for",
             "warn": "More than one NCCL library can be loaded"}[a["status"]]
    remedies, withheld = _nccl_remedies(facts, nf, a)
    return [me.finding(status=a["status"], title=title, detail="\n".join(lines + withheld), evidence=ev,
                       remedies=remedies)]
