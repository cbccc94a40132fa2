"""Probes ``libs``, ``livetrace`` and ``libfix``: which libstdc++ the training loads, and the proven fix.

``libs`` is static and fast: the ld.so emulation of the training process (interpreter, ``--ext``
extensions, torch, DeepSpeed's prebuilt and JIT-built ops) and the inventory of every libstdc++ copy.
``livetrace`` runs the failing command (``--command``, else an import probe) under ``LD_DEBUG`` (and
strace where it exists) to see what the real loader did. ``libfix`` proposes remedies from both and
re-runs the command with each change applied; only a change that makes it succeed is ``verified``.
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core import progress
from zdoctor.core.factstypes import LibfixFacts, LibsFacts, LivetraceFacts, ShellinitFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.libraries.audit import static_audit, training_targets
from zdoctor.layers.libraries.fixes import propose
from zdoctor.layers.libraries.importrun import (
    LIVE_TIMEOUT,
    import_run,
    jit_op_paths,
    target_python,
    trace_argv,
    trace_timeout,
    without_records,
)
from zdoctor.layers.libraries.inventory import take_inventory
from zdoctor.layers.libraries.lddebug import summarize
from zdoctor.layers.libraries.runneeds import libstdcxx_needs, run_objects
from zdoctor.layers.libraries.runtables import TARGETS_LABEL, needs_table
from zdoctor.layers.libraries.shellinit import scan
from zdoctor.layers.libraries.trialpool import TrialPool
from zdoctor.proc.privilege import runs_as_of
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.elf import read_elf
from zdoctor.readers.loader import LoaderConfig, expand_dst
from zdoctor.trials.remedies import verify

VERIFY_TIMEOUT = 120.0
LIBSTDCXX = "libstdc++.so.6"


# ---------------------------------------------------------------------------------------------- helpers
def _env(host: Any) -> dict[str, str]:
    return dict(target_of(host).env)


def interpreter_of(host: Any, pyenv: dict[str, Any]) -> str | None:
    """The training interpreter's path as it is run (its realpath decides $ORIGIN)."""
    return (pyenv.get("python") or {}).get("executable") or target_python(host)


def _interp_dirs(audit_facts: dict[str, Any], pyenv: dict[str, Any], config: Any) -> dict[str, Any]:
    """The interpreter's RPATH/RUNPATH dirs, expanded as ld.so expands them ($ORIGIN, $LIB, $PLATFORM)."""

    interp = audit_facts.get("interpreter") or {}
    origin = os.path.dirname(interp.get("realpath") or "")

    def expand(value: str | None) -> list[str]:
        dirs = (expand_dst(e, origin, config.dst_lib, config.platform) for e in (value or "").split(":") if e)
        return [os.path.normpath(d) for d in dirs if d]

    py = pyenv.get("python") or {}
    return {"path": interp.get("path"), "rpath_dirs": expand(interp.get("rpath")),
            "runpath_dirs": expand(interp.get("runpath")), "prefix": py.get("prefix"),
            "base_prefix": py.get("base_prefix")}


# ---------------------------------------------------------------------------------------------- tables
def targets_table(audit: dict[str, Any]) -> Evidence:
    rows: list[list[str]] = []
    hl: list[int] = []
    for t in audit.get("targets") or []:
        served = (t.get("served") or {}).get(LIBSTDCXX) or {}
        missing = ", ".join(sorted({f["version"] for f in t.get("failures") or []}))
        if missing or t.get("error"):
            hl.append(len(rows))
        rows.append([t["target"]["name"], t["target"]["kind"],
                     f"{served.get('path', '-')} {served.get('label', '')}".strip(),
                     missing or (t.get("error") or "-")])
    return Evidence.of_table(TARGETS_LABEL,
                             ["library", "kind", "libstdc++.so.6 served", "missing / error"], rows, hl)


def inventory_table(copies: list[dict[str, Any]], needs: list[str], loaded: str | None) -> Evidence:
    rows: list[list[str]] = []
    hl: list[int] = []
    for c in copies:
        sat = "error: " + c["error"] if c.get("error") else ("yes" if set(needs) <= set(c.get("versions") or [])
                                                               else "no")
        is_loaded = loaded is not None and bool(loaded) and os.path.realpath(loaded) == c["realpath"]
        if is_loaded:
            hl.append(len(rows))
        real = c["realpath"] if c["realpath"] != c["path"] else ""
        shipped = f"GCC {c.get('gcc_series') or c['gcc_release']}" if c.get("gcc_release") else "-"
        rows.append([c["path"] + (f" -> {real}" if real else "") + ("  (loaded)" if is_loaded else ""),
                     c.get("glibcxx_max") or "-", c.get("cxxabi_max") or "-", shipped, sat, "; ".join(c["found_as"])])
    return Evidence.of_table("every libstdc++.so.6 on this node",
                             ["copy", "newest GLIBCXX", "newest CXXABI", "shipped with", "has every need",
                              "found as"], rows, hl)


def compilers_table(audit: dict[str, Any], toolchain: dict[str, Any]) -> Evidence:
    """The fourth toolchain layer: the compiler that built each extension, from its .comment."""
    rows = []
    for t in audit.get("targets") or []:
        comps = [c for c in t.get("compilers") or [] if c.startswith("GCC:")] or t.get("compilers") or ["unknown"]
        newest = ""
        needs = [n for n in t.get("needs") or [] if n.startswith("GLIBCXX_")]
        if needs:
            newest = needs[-1]
        rows.append([t["target"]["name"], "; ".join(comps[:2]), newest or "-"])
    jit = (toolchain.get("jit") or {})
    if jit.get("path"):
        rows.append(["(next JIT build)", f"{jit.get('path')} {jit.get('version') or ''}".strip(),
                     jit.get("glibcxx_max") or "-"])
    return Evidence.of_table("the compiler that built each extension",
                             ["library", "built by (.comment)", "newest GLIBCXX needed"], rows)


# ---------------------------------------------------------------------------------------------- probes
@probe("libs", title="Which libstdc++ the training loads (static)", timeout=90, needs=("pyenv", "jitcache"),
       facts=LibsFacts)
def libs_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Emulate ld.so for the training process; inventory every libstdc++ copy."""

    env = _env(host)
    pyenv = facts_of(host, "pyenv")
    jit = facts_of(host, "jitcache")
    exe = interpreter_of(host, pyenv)
    if not exe:
        return {"skipped": "the training interpreter was not found"}, []
    torch = pyenv.get("torch") or {}
    ds = pyenv.get("deepspeed") or {}
    jit_good, jit_bad = jit_op_paths(jit)
    targets = training_targets(ext=list(target_of(host).ext),
                               torch_dir=torch.get("location") if torch.get("installed") else None,
                               deepspeed_ops=ds.get("prebuilt_ops") or [], jit_ops=jit_good)
    config = LoaderConfig.detect()
    audit = static_audit(exe, env, targets, config=config)
    cache_libstdcxx = [e.path for e in config.cache if e.soname == LIBSTDCXX]
    interp = _interp_dirs(audit, pyenv, config)
    copies = [c.to_dict() for c in take_inventory(env, system_dirs=config.system_dirs,
                                                 cache_paths=cache_libstdcxx, interpreter=interp)]
    needs = audit.get("needs") or []
    for c in copies:
        c["has_every_need"] = not c.get("error") and set(needs) <= set(c.get("versions") or [])
    toolchain = facts_of(host, "toolchain") if "toolchain" in getattr(host, "recorded", dict)() else {}
    for f in audit["failures"]:
        describe_provider(f)
    facts = {
        "interpreter": {**interp, "rpath": audit["interpreter"].get("rpath"),
                        "runpath": audit["interpreter"].get("runpath"),
                        "rpath_copies": rpath_copies(interp)},
        "env": {k: env.get(k) for k in ("LD_LIBRARY_PATH", "LD_PRELOAD", "CONDA_PREFIX", "CONDA_EXE")},
        "etc_preload": _read_preload(config.preload_file),
        "loader": {"system_dirs": list(config.system_dirs), "glibc": getattr(config, "glibc_version", None),
                   "hwcaps": list(getattr(config, "hwcaps_subdirs", []) or [])},
        "targets": audit["targets"],
        "needs": needs,
        "libstdcxx": audit.get("libstdcxx"),
        "failures": audit["failures"],
        "start_failures": audit["start_failures"],
        "errors": audit["errors"],
        "corrupt_jit_ops": [op.get("so_path") for op in jit_bad],
        "inventory": copies,
        "loaded": audit["loaded"],
    }
    ev = [targets_table(audit), needs_table(audit, {}),
          inventory_table(copies, needs, (audit.get("libstdcxx") or {}).get("path")),
          compilers_table(audit, toolchain)]
    return facts, ev


def describe_provider(failure: dict[str, Any]) -> dict[str, Any]:
    """Add what the failing provider really is (read now, so a replay never looks at its own machine)."""

    info = read_elf(failure["provider"])
    failure["provider_realpath"] = os.path.realpath(failure["provider"])
    failure["required_by_realpath"] = os.path.realpath(failure["required_by"])
    failure["provider_max"] = info.newest("GLIBCXX") if info.ok else None
    failure["provider_error"] = info.error
    return failure


def rpath_copies(interp: dict[str, Any]) -> list[dict[str, Any]]:
    """Each libstdc++.so.6 in the interpreter's DT_RPATH dirs, with the versions it defines."""

    out = []
    for d in interp.get("rpath_dirs") or []:
        cand = os.path.join(d, LIBSTDCXX)
        info = read_elf(cand)
        if info.ok:
            out.append({"path": cand, "glibcxx_max": info.newest("GLIBCXX"), "versions": list(info.verdef or [])})
    return out


def _read_preload(path: str | None) -> list[str]:
    if not path:  # a loader configured without /etc/ld.so.preload
        return []
    try:
        with open_regular_text(path, encoding="utf-8", errors="replace") as fh:
            return [w for line in fh for w in line.split("#", 1)[0].replace(":", " ").split()]
    except OSError:
        return []


def _flat_files(last_files: dict[int, list[Any]]) -> list[str]:
    out = []
    for pid in sorted(last_files):
        for ev in last_files[pid]:
            out.append(f"pid {pid}: {ev.syscall} {ev.path}")
    return out


def _loaded_all(lt: Any, cap: int = 2000) -> list[dict[str, Any]]:
    """Every object the traced processes loaded (name as asked for, path found), first pid first."""

    out: list[dict[str, Any]] = []
    for rec in summarize(lt.traces).values():
        for x in rec["loaded"]:
            if len(out) < cap and {"name": x["name"], "path": x["path"]} not in out:
                out.append({"name": x["name"], "path": x["path"]})
    return out


@probe("livetrace", title="What the real loader does (LD_DEBUG)", timeout=LIVE_TIMEOUT + 30, facts=LivetraceFacts)
def livetrace_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Run the command under LD_DEBUG=libs,files,versions (strace where it helps); record what loaded."""
    from zdoctor.layers.libraries.live import parse_probe_output, trace_command

    env = _env(host)
    timeout = trace_timeout(host)
    shared = import_run(host)
    if shared is not None:  # the default probe: the run the interpreter probe reads too
        shared.wait_end()
        if shared.failure is not None:
            raise shared.failure
        lt, why = shared.trace, "default probe"
        lt.evidence.stdout = without_records(lt.evidence.stdout)
        steps = parse_probe_output(shared.steps())
    else:
        argv, why = trace_argv(host, env)
        if argv is None:
            return {"skipped": why}, []
        # The user's command is traced from its start.
        lt = trace_command(argv, env, timeout=timeout, run_as=runs_as_of(host))
        steps = []
    loaded = [{"pid": pid, "path": path, "realpath": os.path.realpath(path), "via": via, "needed_by": nb}
              for pid, path, via, nb in lt.libstdcxx]
    errors = [{"provider": e.provider, "version": e.version, "required_by": e.required_by,
               "message": f"{e.provider}: version `{e.version}' not found (required by {e.required_by})"}
              for e in lt.version_errors if not e.weak]
    seen = {(e["provider"], e["version"], e["required_by"]) for e in errors}
    for e in lt.stderr_version_errors:
        d: dict[str, Any] = e if isinstance(e, dict) else {"provider": e.provider, "version": e.version,
                                                           "required_by": e.required_by, "message": e.message}
        if (d["provider"], d["version"], d["required_by"]) not in seen:
            errors.append(d)
    for known in errors:
        describe_provider(known)
    facts = {
        "argv": list(lt.argv),
        "source": why,
        "command": target_of(host).command,
        "timeout": timeout,
        "exit_code": lt.exit_code,
        "timed_out": lt.timed_out,
        # every process of the run the loader's trace saw: what ties a kernel record (an OOM kill) to it
        "pids": sorted(lt.traces),
        "ok": lt.exit_code == 0 and not lt.timed_out,
        "libstdcxx": loaded,
        "version_errors": errors,
        "last_files": _flat_files(lt.last_files),
        "pending_calls": [f"pid {e.pid}: {e.syscall} {e.path}" for e in lt.pending_calls],
        "strace_lines": list(lt.strace_lines),
        "stuck_states": list(lt.stuck_states),
        "compiling": [dict(c) for c in lt.compiling],
        "refused_locks": list(lt.refused_locks),
        "ranks": lt.ranks,
        "notes": list(lt.notes),
        "strace_available": lt.strace_available,
        "strace_used": lt.strace_used,
        "steps": steps,
        "stderr_tail": (lt.evidence.stderr or "")[-2000:],
        "loaded_all": _loaded_all(lt),
        # version -> objects needing it: every object the run mapped, read now (a replay never looks here)
        "needs": libstdcxx_needs(run_objects(lt.traces)),
    }
    return facts, [lt.evidence]


@probe("libfix", title="Remedies, each re-run to prove it", timeout=VERIFY_TIMEOUT + 60,
       needs=("pyenv", "libs", "livetrace"), facts=LibfixFacts)
def libfix_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Propose the remedies the evidence supports, then verify each by re-running the command.

    The fixes the static audit predicts are re-run at once, beside the traced run; the trace's own plans
    then take those results (the same change is never re-run twice) and only new ones are started."""

    env = _env(host)
    libs = facts_of(host, "libs")
    if not libs:
        return {"skipped": "no static audit"}, []
    timeout = target_of(host).limit(VERIFY_TIMEOUT)
    run_as = runs_as_of(host)

    def tried(done: int, total: int) -> None:
        progress.note("libfix", f"re-running the command with each of {total} fixes, {done} of {total} done")

    pool = TrialPool(lambda plan, argv, run_env: verify(plan, argv, run_env, timeout=timeout, run_as=run_as),
                     env, on_done=tried)
    guess, _why = trace_argv(host, env)
    if guess:
        for plan in propose(libs, {}, env):
            if plan.verifiable:
                pool.start(plan, guess)
    early = pool.started
    if early:
        progress.note("libfix", f"re-running the command with each of {early} predicted fixes, beside the traced run")
    try:
        live = facts_of(host, "livetrace")
        plans = propose(libs, live, env)
        argv = live.get("argv")
        to_verify = [p for p in plans if p.verifiable] if argv else []
        early_unused = pool.unused(to_verify, argv or [])
        evidence = pool.results(to_verify, list(argv or [])) if to_verify else []
    finally:
        pool.drop_all_but()  # a predicted re-run nobody took is not started now
        progress.note("libfix", "")
    for p in plans:
        if p.verifiable and not argv:
            p.verification = "no command to re-run (nothing to load)."
    order = {id(p): i for i, p in enumerate(plans)}
    plans.sort(key=lambda p: (not p.verified, order[id(p)]))
    return {"plans": [p.to_dict() for p in plans], "argv": argv,
            "needed": bool(libs.get("failures") or live.get("version_errors")),
            # re-runs started from the static audit's prediction, and those the trace then made moot
            "early_trials": {"started": early, "moot": early_unused}}, evidence


@probe("shellinit", title="Shell startup files that set LD_LIBRARY_PATH or LD_PRELOAD", timeout=20.0,
       facts=ShellinitFacts)
def shellinit_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Read (never run) the training user's and the system's shell startup files, and the activate.d
    scripts of the conda prefixes in play, for the lines that set LD_LIBRARY_PATH or LD_PRELOAD."""

    env = _env(host)
    prefixes: list[str] = []
    for entry in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        if entry and os.path.basename(os.path.normpath(entry)) in ("lib", "lib64"):
            prefixes.append(os.path.dirname(os.path.normpath(entry)))
    python = target_python(host)
    if python:
        prefixes.append(os.path.dirname(os.path.dirname(os.path.abspath(python))))
    facts = scan(env.get("HOME"), list(dict.fromkeys(prefixes)))
    rows = [[f"{x['file']}:{x['line']}", x["variable"], x["text"]] for x in facts["lines"]]
    return facts, [Evidence.of_table("shell startup lines that set LD_LIBRARY_PATH / LD_PRELOAD",
                                     ["where", "variable", "line"], rows)]
