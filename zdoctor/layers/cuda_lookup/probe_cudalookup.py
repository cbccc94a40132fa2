"""Probe ``cudalookup``: how the training finds CUDA's libraries (see forensics/cudalookup.py).

libcuda.so.1 and libcuda.so in the ld.so cache and in ``/sbin/ldconfig -p`` (run, as triton runs it), the
directories that hold the driver library, which libcuda.so.1 the loader gives the training process (a
toolkit's stub shadowing the driver), triton's lookup as the installed triton does it, the compiler's
library search path for ``-lcuda``, and every CUDA soname the extensions the training loads need, against
torch's CUDA major and the ``nvidia-*`` wheels.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.factstypes import CudalookupFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.cuda_lookup import cudalookup as cl
from zdoctor.layers.cuda_lookup.rules import DRIVER_DIRS
from zdoctor.proc import contain
from zdoctor.proc.privilege import runs_as_of
from zdoctor.proc.runner import run
from zdoctor.proc.target import target_of
from zdoctor.readers.ldcache import read_ld_so_cache
from zdoctor.symptoms.catalogue import SIGNATURES

LDCONFIG = "/sbin/ldconfig"
LD_SO_CONF_D = "/etc/ld.so.conf.d"
TIMEOUT = 15.0
#: Each environment-only remedy is tried by re-running the failing command within this time.
TRIAL_TIMEOUT = 60.0
#: torch's own libraries read for their CUDA needs (``torch/lib/*.so``), at most.
MAX_TORCH_LIBS = 64
ENV_KEYS = ("LD_LIBRARY_PATH", "LIBRARY_PATH", "TRITON_LIBCUDA_PATH", "CUDA_HOME", "CUDA_PATH", "CC")


def _loader_libcuda(exe: str | None, env: Mapping[str, str], cache_path: str,
                    name: str = cl.LIBCUDA) -> dict[str, Any]:
    """Which file ``dlopen(name)`` from the training interpreter gets (the ld.so emulation)."""
    from zdoctor.readers.loader import LoaderConfig, Process

    if not exe:
        return {"error": "the training interpreter was not found", "path": None}
    config = LoaderConfig.detect()
    if cache_path != config.cache_path:
        config = LoaderConfig.defaults(cache_path=cache_path)
    proc = Process(exe, env, config)
    result = proc.dlopen(name)
    res = result.resolution
    path = res.path if res is not None and res.found else None
    return {"path": path, "realpath": os.path.realpath(path) if path else None,
            "via": res.via if res is not None else None, "label": res.label() if res is not None else None,
            "error": result.error, "stub": cl.is_stub_path(path),
            "tried": [list(c) for c in (res.tried if res is not None else [])][:20]}


def _extensions(libs: Mapping[str, Any], torch_dir: str | None) -> list[dict[str, Any]]:
    """Each library the training loads with the CUDA sonames it needs (its own DT_NEEDED), and whether the
    loader found them (a soname the static audit's loader could not open for any import is missing)."""
    from zdoctor.readers.elf import read_elf

    objects: list[tuple[str, str, str, str | None]] = []
    for t in libs.get("targets") or []:
        tgt = t.get("target") or {}
        if tgt.get("path"):
            objects.append((tgt["path"], tgt.get("kind") or "?", tgt.get("name") or tgt["path"], t.get("error")))
    for p in _torch_libs(torch_dir):
        if all(p != o[0] for o in objects):
            objects.append((p, "torch", os.path.basename(p), None))
    # a soname the loader could not find for one import is missing for every object that needs it
    missing = {e.split(":", 1)[0] for *_rest, e in objects if e and ": cannot open shared object file" in e}
    out = []
    for path, kind, name, error in objects:
        info = read_elf(path)
        needs = [n for n in (cl.cuda_soname(x) for x in (info.needed if info.ok else [])) if n]
        if not needs:
            continue
        for n in needs:
            n["found"] = n["soname"] not in missing
        out.append({"path": path, "kind": kind, "name": name, "needs": needs, "error": error})
    return out


def _compiler_dirs(env: Mapping[str, str], run_as: Any = None) -> dict[str, Any]:
    """The compiler triton links its launcher with ($CC, else gcc) and its library search path (the compiler
    the training's PATH names runs as the training user)."""
    cc = env.get("CC") or shutil.which("gcc", path=env.get("PATH") or os.defpath) \
        or shutil.which("clang", path=env.get("PATH") or os.defpath)
    if not cc:
        return {"cc": None, "dirs": [], "error": "no C compiler (CC, gcc or clang) on the training PATH",
                "evidence": None}
    ev = run([cc, "-print-search-dirs"], env=dict(env), timeout=TIMEOUT, label=f"{cc} -print-search-dirs",
             run_as=run_as)
    if ev.error or ev.exit_code != 0:
        return {"cc": cc, "dirs": [], "error": ev.error or f"exit code {ev.exit_code}", "evidence": ev}
    return {"cc": cc, "dirs": cl.parse_search_dirs(ev.stdout), "error": None, "evidence": ev}


def collect_node(env: Mapping[str, str], *, cache_path: str = "/etc/ld.so.cache", dirs: Sequence[str] = DRIVER_DIRS,
                 ldconfig: str = LDCONFIG, run_as: Any = None,
                 ) -> tuple[dict[str, Any], list[Evidence], list[dict[str, Any]]]:
    """The part of the facts that needs nothing of the training interpreter: the ld.so cache, ``ldconfig -p``
    (its parsed lines are returned too), the driver's directories and the compiler's search path. The probe
    reads it while torch's import runs."""

    evidence: list[Evidence] = []
    try:
        entries, cache_error = read_ld_so_cache(cache_path), None
    except InputError as exc:
        entries, cache_error = [], str(exc)
    cached = cl.cache_libcuda(entries)
    ev = run([ldconfig, "-p"], env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, timeout=TIMEOUT,
             label=f"{ldconfig} -p")
    lines = cl.parse_ldconfig_p(ev.stdout) if not ev.error and ev.exit_code == 0 else []
    libcuda_lines = [ln for ln in lines if "libcuda.so" in ln["name"]]
    ldconfig_facts = {"argv": [ldconfig, "-p"], "ran": not ev.error and ev.exit_code == 0,
                      "error": ev.error or (f"exit code {ev.exit_code}" if ev.exit_code else None),
                      "entries": len(lines), "libcuda": libcuda_lines}
    evidence.append(Evidence(label=f"{ldconfig} -p (libcuda lines)", argv=[ldconfig, "-p"], exit_code=ev.exit_code,
                             stdout="\n".join(ln["line"] for ln in libcuda_lines) or "(none)",
                             error=ev.error, started=ev.started, duration_s=ev.duration_s))
    link = _compiler_dirs(env, run_as)
    compiler_ev = link.pop("evidence", None)
    if compiler_ev is not None:
        evidence.append(compiler_ev)
    facts = {
        "cache": {"path": cache_path, "error": cache_error, "entries": len(entries), **cached},
        "ldconfig": ldconfig_facts,
        "driver_dirs": cl.driver_dirs(dirs, cached, env),
        "link": link,
        "ld_so_conf_d": _names(LD_SO_CONF_D),
        "env": {k: env.get(k) for k in ENV_KEYS},
    }
    return facts, evidence, lines


def _torch_dir(pyenv: Mapping[str, Any]) -> str | None:
    torch = pyenv.get("torch") or {}
    return torch.get("location") if torch.get("installed") else None


def _torch_libs(torch_dir: str | None) -> list[str]:
    if not torch_dir:
        return []
    return sorted(glob.glob(os.path.join(glob.escape(torch_dir), "lib", "*.so*")))[:MAX_TORCH_LIBS]


def collect_training(node: dict[str, Any], lines: list[dict[str, Any]], env: Mapping[str, str],
                     pyenv: Mapping[str, Any], libs: Mapping[str, Any], cuda_homes: Sequence[str] = (), *,
                     cache_path: str = "/etc/ld.so.cache") -> dict[str, Any]:
    """The whole facts: ``node`` and ``lines`` (:func:`collect_node`'s) with what the training interpreter
    (``pyenv``) and the static audit (``libs``) say."""
    facts = dict(node)
    link = dict(facts["link"])
    py = pyenv.get("python") or {}
    exe = py.get("executable")
    torch = pyenv.get("torch") or {}
    torch_dir = _torch_dir(pyenv)
    triton_pkg = (pyenv.get("packages") or {}).get("triton") or {}
    triton: dict[str, Any] = {"installed": bool(triton_pkg.get("installed")), "version": triton_pkg.get("version"),
                              "location": triton_pkg.get("location")}
    if triton["installed"] and triton["location"]:
        rule = cl.triton_rule(cl.read_triton_sources(str(triton["location"])))
        triton["rule"] = rule
        if rule["state"] == "read" and facts["ldconfig"]["ran"]:
            triton["lookup"] = cl.triton_dirs(rule, lines, env)
    triton_link_dirs = list((triton.get("lookup") or {}).get("dirs") or [])
    link["triton_dirs"] = triton_link_dirs
    searched = list(dict.fromkeys([*triton_link_dirs, *link["dirs"]]))
    link["finds"] = cl.linker_finds("cuda", searched)
    link["searched"] = [{"dir": d, "dev": os.path.isfile(os.path.join(d, cl.LIBCUDA_DEV)),
                         "so1": os.path.exists(os.path.join(d, cl.LIBCUDA))} for d in searched[:32]]
    sites = list(dict.fromkeys(os.path.dirname(str(p)) for p in (torch_dir, triton.get("location")) if p))
    facts.update({
        "toolkit_stubs": cl.stubs_dirs(cuda_homes),
        "loader": _loader_libcuda(exe, env, cache_path),
        # some libraries dlopen the unversioned name (torch's CUDA driver API did): a stub there too
        "loader_dev": _loader_libcuda(exe, env, cache_path, cl.LIBCUDA_DEV),
        "link": link,
        "triton": triton,
        "torch": {"installed": bool(torch.get("installed")), "version": torch.get("version"),
                  "cuda": torch.get("cuda"), "major": cl.cuda_major(torch.get("cuda"))},
        "wheels": cl.wheel_libraries(sites),
        "extensions": _extensions(libs, torch_dir),
        "libs_ran": bool(libs),
    })
    order = ("cache", "ldconfig", "driver_dirs", "toolkit_stubs", "loader", "loader_dev", "link", "triton", "torch",
             "wheels", "extensions", "libs_ran", "ld_so_conf_d", "env")
    return {k: facts[k] for k in order}


def collect_lookup(env: Mapping[str, str], pyenv: Mapping[str, Any], libs: Mapping[str, Any],
                   cuda_homes: Sequence[str] = (), *, cache_path: str = "/etc/ld.so.cache",
                   dirs: Sequence[str] = DRIVER_DIRS, ldconfig: str = LDCONFIG, run_as: Any = None,
                   ) -> tuple[dict[str, Any], list[Evidence]]:
    """The probe's facts for the training environment ``env`` (pyenv and libs: those probes' facts)."""
    node, evidence, lines = collect_node(env, cache_path=cache_path, dirs=dirs, ldconfig=ldconfig, run_as=run_as)
    return collect_training(node, lines, env, pyenv, libs, cuda_homes, cache_path=cache_path), evidence


def lcuda_failed(text: str) -> bool:
    """Whether ``text`` (a failing run's output) has GNU ld's ``cannot find -lcuda``."""

    sig = next(s for s in SIGNATURES if s.id == "link.cannot-find-lcuda")
    return any(sig.search(line) for line in (text or "").splitlines())


def make_plans(facts: dict[str, Any], env: Mapping[str, str], live: Mapping[str, Any] | None = None,
               ) -> dict[str, list[Any]]:
    """The remedies of each lookup problem in ``facts`` (see forensics/cudafixes.py), not yet tried; ``live``
    (the failing run's facts) adds those for a ``-lcuda`` link of a build other than triton's."""
    from zdoctor.layers.cuda_lookup import cudafixes as fx

    probs = cl.lookup_problems(facts)
    plans: dict[str, list[Any]] = {}
    if probs["driver"] and not (probs["triton"] or probs["link"]) and live and \
            lcuda_failed(str(live.get("stderr_tail") or "") + "\n" + str(live.get("stdout_tail") or "")):
        plans["link"] = fx.link_plans(facts, env, ["ld: cannot find -lcuda"], triton=False)
    if probs["stub"] or probs["stub_dev"]:
        key = "loader" if probs["stub"] else "loader_dev"
        name = cl.LIBCUDA if probs["stub"] else cl.LIBCUDA_DEV
        plans["stub"] = fx.stub_plans(facts, env, [f"the loader gives the training {name} from "
                                                   f"{(facts.get(key) or {}).get('path')} (a stub)"], key)
    if probs["driver"] and (probs["triton"] or probs["link"]):
        why = ((facts.get("triton") or {}).get("lookup") or {}).get("error") if probs["triton"] else \
            "-lcuda finds no libcuda.so in triton's directories nor the compiler's library path"
        rule = (facts.get("triton") or {}).get("rule") or {}
        plans["link"] = fx.link_plans(facts, env, [str(why).splitlines()[0]],
                                      triton_env=rule.get("env_override") is not False, lookup_fails=probs["triton"])
    if probs["uncached"]:
        found = fx.uncached_plans(facts, env, probs["uncached"][0],
                                  [f"{probs['uncached'][0]} holds {cl.LIBCUDA}; the ld cache does not name it"])
        if found:
            plans["uncached"] = found
    return plans


def try_lookup_plans(plans: Mapping[str, list[Any]], live: Mapping[str, Any], env: Mapping[str, str],
                     timeout: float, run_as: Any = None) -> list[Evidence]:
    """Re-run the failing ``--command`` with each environment-only plan (none tried without one)."""
    from zdoctor.trials.remedies import verify

    argv = live.get("argv") if live.get("command") and not live.get("ok") else None
    evidence: list[Evidence] = []
    for group in plans.values():
        for p in group:
            if not p.verifiable:
                continue
            if not argv:
                p.verification = ("not tried, because no failing --command was given to re-run" if not
                                  live.get("command") else "not tried, because the command did not fail")
                continue
            evidence.append(verify(p, list(argv), env, timeout=timeout, run_as=run_as))
    return evidence


def _names(folder: str) -> list[str] | None:
    """The names in ``folder`` (None when it cannot be listed): a new drop-in's name must be free."""
    try:
        return sorted(os.listdir(folder))[:500]
    except OSError:
        return None


def _cuda_homes(env: Mapping[str, str], stack: Mapping[str, Any]) -> list[str]:
    homes = [str((stack.get("cuda_home") or {}).get("path") or ""), env.get("CUDA_HOME") or "",
             env.get("CUDA_PATH") or "", "/usr/local/cuda"]
    homes += sorted(glob.glob("/usr/local/cuda-*"))[:8]
    return [h for h in dict.fromkeys(homes) if h]


@probe("cudalookup", title="How CUDA's libraries are found (libcuda, stubs, extensions' CUDA sonames)",
       timeout=60 + 6 * TRIAL_TIMEOUT, needs=("pyenv", "libs", "cuda_stack", "livetrace"), facts=CudalookupFacts)
def cudalookup_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:

    target = target_of(host)
    env = dict(target.env)
    run_as = runs_as_of(host)
    # the node's part first, while torch's import runs; no one waits for it: its commands yield the CPU
    with contain.background():
        node, evidence, lines = collect_node(env, run_as=run_as)
    facts = collect_training(node, lines, env, facts_of(host, "pyenv"), facts_of(host, "libs"),
                             _cuda_homes(env, facts_of(host, "cuda_stack")))
    # Only a failing --command is re-run with the plans: without one, the import probe's trace is not waited for.
    live = facts_of(host, "livetrace") if target_of(host).command else {}
    plans = make_plans(facts, env, live)
    timeout = target.limit(TRIAL_TIMEOUT, capped=True)
    evidence += try_lookup_plans(plans, live, env, timeout, run_as)
    facts["plans"] = {k: [p.to_dict() for p in v] for k, v in plans.items()}
    return facts, evidence
