"""Probe ``pyenv``: the training interpreter, seen from inside, in a subprocess with a timeout.

zdoctor never imports torch itself. It runs ``probe_script.py`` under the target interpreter with the
training environment and reads the records it prints. When the live trace runs the same script in the same
round (no ``--command``), the records are read from that run as they arrive
(:mod:`zdoctor.layers.libraries.importrun`): torch is imported once. Facts (all plain JSON):

- ``target``: requested, explicit (the user named it), resolved path, realpath.
- ``error`` / ``error_kind``: why the interpreter is unusable (missing, not_executable, not_python,
  too_old, crashed, timeout, failed), or None.
- ``exit_code``, ``signal`` ("SIGSEGV"), ``timed_out``, ``hung_in`` (the stage that never finished),
  ``complete`` (the probe reached its end), ``stages`` (records received, in order).
- After a time-out: ``stuck_states`` (each process of the run sampled just before the limit), ``waiting``
  (whether one of them waited: hang evidence; all running is a slow run, not a hang) and ``node_load``
  (the node's load when the limit came).
- ``python``: version, version_info, prefix, base_prefix, in_venv, conda, sysconfig, glibc, sys_path.
- ``env``: the variables that matter to builds and the loader, as the interpreter saw them.
- ``packages``: torch, deepspeed, numpy, ninja, triton: installed, version, location (not imported).
- ``torch``: installed, ``import`` {state ok|failed|crashed|timeout|not_attempted, seconds, error,
  error_type, error_line, traceback}, version, file, cuda, git_version, config, parallel_info,
  cxx11_abi, ``cuda_check`` {state, available, device_count, cudnn, nccl}, libstdcxx, libgcc_s,
  mapped_libs (every shared object mapped after the import).
- ``deepspeed``: installed, version, location, prebuilt_ops (read from files, never imported).
- ``candidates``: other interpreters worth trying: ``active`` (VIRTUAL_ENV, CONDA_PREFIX) and
  ``on_path`` (pythons on PATH), the probed one left out.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from zdoctor import scripts
from zdoctor.core.factstypes import PyenvFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.libraries.importrun import ImportRun, shared_with_trace
from zdoctor.proc.nodeload import budget_stretch, load_words, node_load
from zdoctor.proc.privilege import RunAs, code_runs_as
from zdoctor.proc.runner import run, which_all
from zdoctor.proc.target import Target, target_of
from zdoctor.readers.stuck import StuckSampler, describe, shows_wait

SENTINEL = scripts.RECORD_SENTINEL
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_script.py"
#: Seconds the probe script may run: ``import torch`` on a cold NFS home can take tens of seconds.
TARGET_TIMEOUT = 60.0
MIN_VERSION = (3, 8)
#: The records (torch's config, every mapped library) must never be cut in the middle.
OUTPUT_CAP_TARGET = 1024 * 1024

_ERROR_LINE = (
    re.compile(r"version `[^']+' not found"),
    re.compile(r"undefined symbol"),
    re.compile(r"cannot open shared object file"),
    re.compile(r"(?:wrong ELF class|invalid ELF header|file too short)"),
)


def parse_records(stdout: str) -> dict[str, Any]:
    """Parse the probe's output: ``{"stages": [...], "records": {stage: record}, "bad": n}``.

    Only lines that start with the sentinel count; anything else (a library printing to stdout before
    the probe took fd 1 over) is ignored. A sentinel line whose JSON is broken counts in ``bad``.
    """
    stages: list[str] = []
    records: dict[str, dict[str, Any]] = {}
    bad = 0
    for line in (stdout or "").splitlines():
        if not line.startswith(SENTINEL):
            continue
        try:
            rec = json.loads(line[len(SENTINEL):])
        except ValueError:
            bad += 1
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("stage"), str):
            bad += 1
            continue
        stage = rec.pop("stage")
        stages.append(stage)
        records[stage] = rec
    return {"stages": stages, "records": records, "bad": bad}


def error_line(message: str | None) -> str | None:
    """The line of an import error that names the cause (the GLIBCXX line when there is one)."""
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    for pattern in _ERROR_LINE:
        for ln in lines:
            if pattern.search(ln):
                return ln
    return lines[-1] if lines else None


def signal_name(exit_code: int | None) -> str | None:
    """``-11`` -> ``"SIGSEGV"``; None for a normal exit."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def resolve_target(python: str, env: dict[str, str]) -> tuple[str | None, str | None, str | None]:
    """``(path, problem, message)`` for the interpreter ``python`` (see :meth:`Target.resolve_python`)."""
    return Target(python=python, env=env).resolve_python()


def env_interpreters(env: dict[str, str]) -> list[str]:
    """The interpreters of the environments the training shell has activated (VIRTUAL_ENV, CONDA_PREFIX)."""
    out: list[str] = []
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        root = env.get(var)
        for name in ("python", "python3"):
            cand = os.path.join(root, "bin", name) if root else ""
            if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
                out.append(cand)
                break
    return out


def candidates(env: dict[str, str], exclude: str | None) -> dict[str, list[str]]:
    """Interpreters the user may have meant: ``active`` (activated envs) and ``on_path`` (pythons on PATH).

    Both leave out the probed interpreter itself (compared by realpath).
    """
    real_ex = os.path.realpath(exclude) if exclude else None

    def keep(paths: list[str]) -> list[str]:
        seen: list[str] = []
        for cand in paths:
            if cand not in seen and (real_ex is None or os.path.realpath(cand) != real_ex):
                seen.append(cand)
        return seen[:8]

    on_path = [p for name in ("python3", "python") for p in which_all(name, env.get("PATH"))]
    return {"active": keep(env_interpreters(env)), "on_path": keep(on_path)}


def _hung_in(stages: list[str]) -> str:
    if "torch_cuda_check" in stages and "torch_cuda" not in stages:
        return "torch.cuda.is_available()"
    if "torch_import" in stages and "torch" not in stages:
        return "import torch"
    if "hello" not in stages:
        return "interpreter start-up"
    if "basics" not in stages:
        return "reading interpreter basics"
    return "after " + stages[-1]


def empty_facts(target: dict[str, Any]) -> dict[str, Any]:
    """The pyenv facts of a probe that learned nothing yet."""
    return {
        "target": target, "error": None, "error_kind": None, "exit_code": None, "signal": None,
        "timed_out": False, "hung_in": None, "complete": False, "stages": [], "bad_records": 0,
        "python": None, "env": {}, "packages": {},
        "torch": {"installed": None, "import": {"state": "not_attempted"}},
        "deepspeed": {"installed": None}, "candidates": {"active": [], "on_path": []},
    }


def build_facts(parsed: dict[str, Any], ev: Evidence, target: dict[str, Any],
                stuck: list[str] | None = None, load: str | None = None) -> dict[str, Any]:
    """Turn parsed records and the run's evidence into the ``pyenv`` facts (pure); ``stuck`` is where the
    run's processes were just before its limit (:func:`~zdoctor.readers.stuck.describe`), ``load`` the node's
    load then."""
    recs = parsed["records"]
    stages = parsed["stages"]
    timed_out = ev.error is not None and ev.error.startswith("timed out")
    sig = signal_name(ev.exit_code)
    facts = empty_facts(target)
    facts.update(exit_code=ev.exit_code, signal=sig, timed_out=timed_out,
                 hung_in=_hung_in(stages) if timed_out else None, complete="done" in recs, stages=stages,
                 bad_records=parsed["bad"])
    if timed_out:
        facts.update(stuck_states=list(stuck or []), waiting=shows_wait(stuck or []), node_load=load)
    stderr_tail = (ev.stderr or "").strip().splitlines()[-3:]
    hello = recs.get("hello")
    basics = recs.get("basics")
    if hello is None:
        if ev.error and not timed_out:
            kind = ("missing" if "not found" in ev.error else
                    "not_executable" if "permission denied" in ev.error else "not_python")
            msg = ev.error
        elif timed_out:
            kind, msg = "timeout", f"{target['resolved']} did not start within the probe's time limit"
        elif sig:
            kind, msg = "crashed", f"{target['resolved']} was killed by {sig} before it could run Python"
        else:
            kind = "not_python"
            msg = (f"{target['resolved']} printed no probe records (exit code {ev.exit_code}); "
                   "is it a Python interpreter?")
            said = stderr_tail or (ev.stdout or "").strip().splitlines()[:2]
            if said:
                msg += " It said: " + " | ".join(said)
        facts.update(error=msg, error_kind=kind)
        return facts
    facts["python"] = {"executable": hello.get("executable"), "version": hello.get("version"),
                       "version_info": hello.get("version_info")}
    if "too_old" in recs or tuple(hello.get("version_info") or ()) < MIN_VERSION:
        ver = ".".join(str(p) for p in hello.get("version_info") or [])
        facts.update(error_kind="too_old",
                     error=f"{target['resolved']} is Python {ver}; zdoctor needs the training "
                           f"interpreter to be Python {MIN_VERSION[0]}.{MIN_VERSION[1]} or newer")
        return facts
    if basics is None:
        why = (f"timed out {_hung_in(stages)}" if timed_out else f"killed by {sig}" if sig
               else f"stopped (exit code {ev.exit_code})")
        facts.update(error_kind="timeout" if timed_out else "crashed" if sig else "failed",
                     error=f"{target['resolved']} started but the probe {why} before reporting basics")
        return facts
    facts["python"] = {k: v for k, v in basics.items() if k not in ("env", "packages")}
    facts["env"] = basics.get("env") or {}
    facts["packages"] = basics.get("packages") or {}
    torch_pkg = facts["packages"].get("torch") or {}
    facts["torch"] = _torch_facts(recs, torch_pkg, timed_out, sig)
    ds = recs.get("deepspeed") or facts["packages"].get("deepspeed") or {"installed": None}
    facts["deepspeed"] = {k: v for k, v in ds.items() if k != "t"}
    if "probe_error" in recs:
        facts["probe_error"] = recs["probe_error"].get("error")
    return facts


def _torch_facts(recs: dict[str, Any], pkg: dict[str, Any], timed_out: bool, sig: str | None
                 ) -> dict[str, Any]:
    out: dict[str, Any] = {"installed": pkg.get("installed"), "dist_version": pkg.get("version"),
                           "location": pkg.get("location"), "import": {"state": "not_attempted"},
                           "cuda_check": {"state": "not_attempted"}}
    if "torch_import" not in recs:
        return out
    rec = recs.get("torch")
    if rec is None:
        out["import"] = {"state": "timeout" if timed_out else "crashed" if sig else "failed",
                         "signal": sig, "seconds": None}
        return out
    if not rec.get("imported"):
        out["import"] = {"state": "failed", "seconds": rec.get("seconds"),
                         "error_type": rec.get("error_type"), "error": rec.get("error"),
                         "error_line": error_line(rec.get("error")), "traceback": rec.get("traceback")}
    else:
        out["import"] = {"state": "ok", "seconds": rec.get("seconds")}
        for key in ("version", "file", "cuda", "hip", "git_version", "config", "parallel_info",
                    "cxx11_abi", "sharing_strategy"):
            out[key] = rec.get(key)
    for key in ("libstdcxx", "libgcc_s", "mapped_libs"):
        out[key] = rec.get(key) or []
    if rec.get("errors"):
        out["errors"] = rec["errors"]
    if "torch_cuda_check" in recs:
        cuda = recs.get("torch_cuda")
        if cuda is None:
            out["cuda_check"] = {"state": "timeout" if timed_out else "crashed" if sig else "failed",
                                 "signal": sig}
        else:
            out["cuda_check"] = {"state": "ok", **cuda}
    return out


def script_path() -> Path:
    """The probe script as a file another interpreter can run (see :func:`zdoctor.scripts.script_path`)."""
    return scripts.script_path(SCRIPT.name)


def read_shared(shared: ImportRun, resolved: str, timeout: float) -> tuple[Evidence, list[str]] | None:
    """The records of the live trace's run as this probe's evidence, once they are complete, the run is
    over, or ``timeout`` seconds after the run started (then as a time-out, whatever the run does next), and
    where its processes were when that time came. None when the trace itself could not run: the probe then
    runs the script on its own."""
    complete = shared.wait_records(timeout)
    stuck = [] if complete else [describe(s) for s in shared.sample()]
    if shared.failure is not None and not shared.done:
        return None
    ev = Evidence(label=f"probe script under {resolved} (in the live trace's run)", argv=list(shared.argv),
                  started=shared.started, stdout=shared.records(), duration_s=round(shared.seconds(), 3))
    trace = shared.trace if shared.ended else None
    if not complete:
        ev.error = f"timed out after {timeout:g}s; the run goes on under the live trace"
    elif trace is not None and not shared.done:  # the run ended before the records did
        ev.exit_code, ev.error = trace.exit_code, trace.evidence.error
        ev.stderr = trace.evidence.stderr
        stuck = list(trace.stuck_states)  # sampled by the trace just before its own limit
    return ev, stuck


def run_script(resolved: str, env: dict[str, str], timeout: float, run_as: RunAs | None
               ) -> tuple[Evidence, list[str]]:
    """The probe script run by itself, and, when it reached ``timeout``, where its processes were just
    before."""
    sampler = StuckSampler(max(0.2, timeout - min(2.0, timeout * 0.1)))
    ev = run([resolved, "-B", str(script_path())], env=env, timeout=timeout, cap=OUTPUT_CAP_TARGET,
             label=f"probe script under {resolved}", run_as=run_as, on_start=sampler.start)
    sampler.stop()
    return ev, [describe(s) for s in sampler.states]


def probe_target(python: str, env: dict[str, str], *, explicit: bool = False,
                 timeout: float = TARGET_TIMEOUT, run_as: RunAs | None = None,
                 shared: ImportRun | None = None) -> tuple[dict[str, Any], list[Evidence]]:
    """Run the probe script under ``python`` with ``env`` (as ``run_as`` when given) and return
    (facts, evidence); with ``shared``, read that run's records instead of running it again."""
    resolved, kind, err = resolve_target(python, env)
    target = {"requested": python, "explicit": explicit, "resolved": resolved,
              "realpath": os.path.realpath(resolved) if resolved else None}
    if resolved is None:
        facts = empty_facts(target)
        facts.update(error=err, error_kind=kind, candidates=candidates(env, None))
        return facts, [Evidence.note(f"target interpreter {python}", err or "")]
    got = read_shared(shared, resolved, timeout) if shared is not None else None
    ev, stuck = got if got is not None else run_script(resolved, env, timeout, run_as)
    facts = build_facts(parse_records(ev.stdout), ev, target, stuck, load_words(*node_load()))
    facts["candidates"] = candidates(env, resolved)
    facts["ran_as"] = run_as.name if run_as is not None else None
    evidence = [ev]
    tb = (facts["torch"].get("import") or {}).get("traceback")
    if tb:
        evidence.append(Evidence(label="import torch: traceback", kind="traceback", stdout=tb,
                                 started=ev.started))
    return facts, evidence


@probe("pyenv", title="Target Python interpreter", timeout=TARGET_TIMEOUT + 30, facts=PyenvFacts)
def pyenv_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    """The training interpreter: version, prefixes, packages, and an isolated ``import torch``. On a node
    busier than its CPUs the import is given longer (:func:`~zdoctor.proc.nodeload.budget_stretch`)."""
    target = target_of(host)
    return probe_target(target.python, dict(target.env), explicit=target.python_explicit,
                        timeout=TARGET_TIMEOUT * budget_stretch(*node_load()), run_as=code_runs_as(target),
                        shared=shared_with_trace(host))
