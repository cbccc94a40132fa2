"""Probe ``jitbuildlog``: each JIT op's ``.ninja_log`` and ``build.ninja`` against the ninja each shell of the
launch resolves and the environment it builds in (the rules are in :mod:`zdoctor.layers.jit_build_log.ninjalog`,
:mod:`zdoctor.layers.jit_build_log.ninjahash`, :mod:`zdoctor.layers.jit_build_log.ninjafile` and
:mod:`zdoctor.layers.jit_build_log.jitenv`).

Facts (plain JSON):

- ``ninjas``: [{role (``this shell`` | ``pdsh/ssh shells`` | ``beside the interpreter``), path, version, runs,
  error, writes (the log format it writes), hash}] one per distinct file, from the jitprereq probe's lookup;
  ``launch``: the path torch runs in this shell (None: no ninja on the PATH).
- ``now``: {cxx, cxx_how, nvcc, torch_include, python_include, arch_pairs, arch_source}: what torch would write
  into build.ninja in this environment (each None when not known).
- ``ops``: [{name, dir, log_version, log_lines, log_error, last_build_ms, outputs, vars {cxx, nvcc}, arch_pairs,
  differences [{what, build, now}], predictions {ninja path: {rebuild, why, message, outputs}}}] for the ops
  the training interpreter uses; ``root``: where they were looked for; ``unread``: op dirs not read;
  ``python``: the training interpreter.
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.factstypes import JitbuildlogFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.gpu_capability import capability as cap
from zdoctor.layers.jit_build_log import jitenv, ninjafile, ninjalog
from zdoctor.proc.runner import run
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import read_prefix

NINJA_TIMEOUT = 20.0
MAX_NINJA_BYTES = 256 * 1024


def version_facts(version: str | None, ran: bool, error: str | None) -> dict[str, Any]:
    """What a ninja's ``--version`` answer says: the version, whether it runs, and its log's rule."""
    ok = ran and ninjalog.parse_version(version) is not None
    rule = ninjalog.rule_for(ninjalog.parse_version(version)) if ok else None
    return {"version": version if ok else None, "runs": ok, "error": None if ok else error,
            "writes": rule.writes if rule else None, "hash": rule.hash if rule else None}


def ninja_version(path: str, env: dict[str, str], timeout: float = NINJA_TIMEOUT) -> tuple[dict[str, Any], Evidence]:
    """``ninja --version`` of ``path``, run for real."""
    ev = run([path, "--version"], env=env, timeout=timeout, label=f"{path} --version")
    error = ev.error or (ev.stderr or "").strip()[-300:] or f"exit code {ev.exit_code}"
    return version_facts((ev.stdout or "").strip()[:60] or None, ev.exit_code == 0 and not ev.error, error), ev


def ran_by_prereq(runs: Any, path: str) -> tuple[dict[str, Any], Evidence] | None:
    """The version jitprereq's run of the same ninja under the same environment gave (one run, not two: a
    ninja the loader blocks on waits its whole time limit each time it is run)."""
    if not isinstance(runs, dict) or "ok" not in runs:
        return None
    error = (runs.get("error") or "")[-300:] or f"exit code {runs.get('exit_code')}"
    info = version_facts((runs.get("version") or "").strip()[:60] or None, bool(runs["ok"]), error)
    said = info["version"] or f"did not run: {info['error']}"
    return info, Evidence.note(f"{path} --version", f"{said} (run once, by the JIT prerequisites probe)")


def resolved_ninjas(prereq: dict[str, Any], env: dict[str, str]) -> tuple[list[dict[str, Any]], list[Evidence]]:
    """The distinct ninjas the launch's shells resolve (jitprereq's lookup), each run for its version."""
    n = prereq.get("ninja") or {}
    out: list[dict[str, Any]] = []
    evidence: list[Evidence] = []
    for role, key in (("this shell", "on_path"), ("pdsh/ssh shells", "on_noninteractive_path"),
                      ("beside the interpreter", "beside_interpreter")):
        path = n.get(key)
        if not path:
            continue
        same = next((x for x in out if os.path.realpath(x["path"]) == os.path.realpath(path)), None)
        if same is not None:
            same["roles"].append(role)
            continue
        known = ran_by_prereq(n.get("runs"), path) if key == "on_path" else None
        info, ev = known or ninja_version(path, env)
        evidence.append(ev)
        out.append({"role": role, "roles": [role], "path": path, **info})
    return out, evidence


def _now(env: dict[str, str], pyenv: dict[str, Any], prereq: dict[str, Any], cuda_stack: dict[str, Any],
         nv: dict[str, Any]) -> dict[str, Any]:
    torch = (pyenv or {}).get("torch") or {}
    loc = torch.get("location") if isinstance(torch.get("location"), str) else None
    wraps = jitenv.torch_wraps_compilers(loc)
    cxx, how = jitenv.expected_cxx(env, wraps)
    home = ((cuda_stack or {}).get("cuda_home") or {}).get("path")
    ccs = [g.get("compute_capability") for g in (nv or {}).get("gpus") or [] if isinstance(g, dict)]
    listed, source = cap.deepspeed_jit_list(env.get("TORCH_CUDA_ARCH_LIST"), ccs)
    parsed = cap.expand_arch_list(listed) if listed else None
    pairs = [list(p) for p in cap.gencode_of_entries(parsed["entries"])] if parsed and not parsed["unknown"] else None
    return {"cxx": cxx, "cxx_how": how, "nvcc": jitenv.expected_nvcc(env, home, wraps),
            "torch_include": os.path.join(loc, "include") if loc else None,
            "python_include": ((prereq or {}).get("python_headers") or {}).get("include"),
            "arch_pairs": pairs, "arch_source": source if pairs is not None else f"not known: {source}"}


def read_op(op: dict[str, Any], ninjas: list[dict[str, Any]], now: dict[str, Any]) -> dict[str, Any]:
    """One op dir's log, its build.ninja's commands and what each ninja would do with them."""
    d = str(op.get("dir"))
    rec: dict[str, Any] = {"name": op.get("name"), "dir": d, "log_version": None, "log_lines": 0, "log_error": None,
                           "last_build_ms": None, "outputs": 0, "vars": {}, "arch_pairs": [], "differences": [],
                           "predictions": {}, "error": None}
    try:
        data, _cut = read_prefix(os.path.join(d, "build.ninja"), MAX_NINJA_BYTES, nofollow=True)
    except OSError as exc:
        rec["error"] = f"build.ninja: {exc.strerror or exc}"
        return rec
    text = data.decode("utf-8", "replace")
    man = ninjafile.parse(text)
    commands = ninjafile.commands(text)
    rec["outputs"] = len(commands)
    rec["vars"] = {k: man.variables[k] for k in ("cxx", "nvcc") if k in man.variables}
    log: dict[str, Any] | None = None
    try:
        raw, _cut = read_prefix(os.path.join(d, ".ninja_log"), ninjalog.MAX_LOG_BYTES, nofollow=True)
        log = ninjalog.read_log(raw.decode("utf-8", "replace"))
    except FileNotFoundError:
        rec["log_error"] = "no .ninja_log"
    except OSError as exc:
        rec["log_error"] = f".ninja_log: {exc.strerror or exc}"
    if log is not None:
        rec.update(log_version=log["version"], log_lines=log["lines"],
                   last_build_ms=ninjalog.last_build_ms(log["entries"]))
    diffs = jitenv.differences(man.variables, now)
    if "nvcc" in man.variables:
        rec["arch_pairs"] = [list(p) for p in cap.gencode_pairs(" ".join(man.variables.values()))]
        want = now.get("arch_pairs")
        if want is not None and sorted(map(tuple, want)) != sorted(map(tuple, rec["arch_pairs"])):
            diffs.append({"what": "the -gencode flags", "build": " ".join(sorted(c for _a, c in rec["arch_pairs"])),
                          "now": " ".join(sorted(c for _a, c in want)) + f" (from {now.get('arch_source')})"})
    rec["differences"] = diffs
    for n in ninjas:
        if n.get("runs"):
            rec["predictions"][n["path"]] = ninjalog.predict(log, commands, ninjalog.parse_version(n["version"]))
    return rec


def collect_jitbuildlog(env: dict[str, str], jit: dict[str, Any], prereq: dict[str, Any], pyenv: dict[str, Any],
                        cuda_stack: dict[str, Any], nv: dict[str, Any]) -> tuple[dict[str, Any], list[Evidence]]:
    """The jitbuildlog facts from the other probes' facts (``{}`` for one that gave none)."""
    ninjas, evidence = resolved_ninjas(prereq or {}, env)
    now = _now(env, pyenv, prereq, cuda_stack, nv)
    ops = [read_op(op, ninjas, now) for op in (jit or {}).get("ops") or []
           if isinstance(op, dict) and op.get("in_use") is not False]
    launch = ((prereq or {}).get("ninja") or {}).get("on_path")
    facts = {"ninjas": ninjas, "launch": launch, "now": now, "ops": ops, "python": (prereq or {}).get("python"),
             "root": (jit or {}).get("base"), "unread": list((jit or {}).get("unscanned") or [])}
    rows = [[", ".join(n["roles"]), n["path"], n["version"] or f"does not run: {n['error']}",
             f"v{n['writes']}" if n.get("writes") else "?"] for n in ninjas]
    evidence.insert(0, Evidence.of_table("ninja each shell of the launch resolves",
                                         ["shell", "ninja", "version", "writes .ninja_log"], rows))
    if ops:
        evidence.insert(1, Evidence.of_table(
            "JIT ops: build log and build.ninja", ["op", ".ninja_log", "last build", "differs from now"],
            [[o["name"], f"v{o['log_version']}" if o["log_version"] else (o["log_error"] or o["error"] or "?"),
              f"{o['last_build_ms'] / 1000:.0f} s" if o["last_build_ms"] else "?",
              "; ".join(d["what"] for d in o["differences"]) or "-"] for o in ops]))
    return facts, evidence


@probe("jitbuildlog", title="JIT ops' build logs against the ninja and environment of the next launch",
       timeout=NINJA_TIMEOUT * 3 + 20, needs=("jitcache", "jitprereq", "pyenv", "cuda_stack", "nvml"), background=True,
       facts=JitbuildlogFacts)
def jitbuildlog_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Each JIT op's .ninja_log format and command hashes against each shell's ninja, and build.ninja's
    compiler, nvcc, include dirs and arch flags against what torch would write now."""
    jit = facts_of(host, "jitcache")
    # With no JIT-built op there is no log to judge: the shells' ninjas (jitprereq compiles and runs
    # programs, seconds) are not waited for.
    prereq = facts_of(host, "jitprereq") if jit.get("ops") else {}
    return collect_jitbuildlog(dict(target_of(host).env), jit, prereq,
                               facts_of(host, "pyenv"), facts_of(host, "cuda_stack"), facts_of(host, "nvml"))
