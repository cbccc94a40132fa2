"""Check ``jit.build-log``: will the next launch rebuild each JIT op, and why. One finding per op: its
``.ninja_log`` against the ninja each shell of the launch resolves, and its ``build.ninja`` against the
compiler, nvcc, include dirs and arch flags torch would write in this environment."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from zdoctor.core.factstypes import JitbuildlogFacts, JitbuildlogNinjas, JitbuildlogOps
from zdoctor.core.model import Finding, Remedy
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.symptoms.match import ids_for

NAME = "jit.build-log"
TITLE = "JIT ops' build logs against the next launch"


def _seconds(ms: int | None) -> str:
    if not ms:
        return "an unknown time"
    s = ms / 1000
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def _ninja_word(n: Mapping[str, Any]) -> str:
    return f"{n['path']} ({n.get('version') or '?'})"


def _same_ninja_remedies(launch: Mapping[str, Any], others: Sequence[Mapping[str, Any]], op: Mapping[str, Any],
                         python: str | None) -> list[Remedy]:
    """One ninja for every shell: the one that reads this op's log as up to date when there is one."""
    preds = op.get("predictions") or {}
    keep = next((n for n in [launch, *others] if (preds.get(n["path"]) or {}).get("rebuild") is False), launch)
    why = " (it reads this op's log as up to date: no rebuild)" if keep is not launch or \
        (preds.get(launch["path"]) or {}).get("rebuild") is False else ""
    d = os.path.dirname(keep["path"])
    rems = [Remedy(title=f"Make every shell of the launch resolve {_ninja_word(keep)}{why}: put its directory first "
                         "on PATH and forward that PATH to the ranks through ~/.deepspeed_env (DeepSpeed exports "
                         "each NAME=VALUE line on every node)",
                   commands=[f'export PATH={shlex.quote(d)}:"$PATH"',
                             'printf \'PATH=%s\\n\' "$PATH" >> ~/.deepspeed_env'],
                   undo=["sed -i '/^PATH=/d' ~/.deepspeed_env"],
                   note="not tried: it changes the PATH of every rank")]
    env_bin = os.path.dirname(python) if python else None
    mine = next((n for n in [launch, *others] if env_bin and os.path.dirname(n["path"]) == env_bin), None)
    other = next((n for n in [launch, *others] if n is not mine and n.get("version")), None)
    if mine is not None and other is not None and python:
        want = ".".join(other["version"].split(".")[:3])
        rems.append(Remedy(title=f"Or pin the training environment's own ninja ({_ninja_word(mine)}) to {want}, the "
                                 f"release of {other['path']}, so both write and read the same log format",
                           commands=[f"{shlex.quote(python)} -m pip install {shlex.quote('ninja==' + want)}"],
                           note="not tried: it replaces an installed package"))
    return rems


def _op_finding(facts: Facts, f: JitbuildlogFacts, op: JitbuildlogOps, launch: JitbuildlogNinjas,
                others: Sequence[Mapping[str, Any]]) -> Finding:
    fid = f"{NAME}.{op['name']}"
    if op.get("error"):
        return Finding(id=fid, status="skip", title=f"op {op['name']}: build.ninja could not be read",
                       detail=str(op["error"]))
    pred = (op.get("predictions") or {}).get(launch["path"]) or {}
    reasons: list[str] = []
    if pred.get("rebuild"):
        reasons.append(pred["why"])
    for d in op.get("differences") or []:
        reasons.append(f"build.ninja's {d['what']} is {d['build']} and this environment's is {d['now']} "
                       "('command line changed')")
    other_reasons = []
    for o in others:
        p = (op.get("predictions") or {}).get(o["path"]) or {}
        if p.get("rebuild") and o.get("hash") != launch.get("hash"):
            other_reasons.append(f"{', '.join(o['roles'])} resolve {_ninja_word(o)}, which writes v{o.get('writes')} "
                                 f"logs with {o.get('hash')} hashes: a launch from there rebuilds it too ({p['why']}), "
                                 "and each switch between the two ninjas rebuilds it again")
    # ninja's "build log version is too old/new" comes from a ninja that refuses the log: one resolved here
    # would, or two resolved ninjas write different formats and keep refusing each other's log
    refused = any(p.get("message") for p in (op.get("predictions") or {}).values()) or \
        any(o.get("writes") != launch.get("writes") for o in others)
    took = _seconds(op.get("last_build_ms"))
    if pred.get("rebuild") is None and not op.get("differences") and not other_reasons:
        return Finding(id=fid, status="skip",
                       title=f"op {op['name']}: whether the next launch rebuilds it is not known",
                       detail=str(pred.get("why") or "no prediction for the launch's ninja"))
    if not reasons and not other_reasons:
        return Finding(id=fid, status="ok",
                       title=f"op {op['name']}: the next launch does not rebuild it",
                       detail=f"{pred.get('why')}; build.ninja's compiler, nvcc, include dirs and arch flags are what "
                              "torch writes in this environment.")
    remedies: list[Remedy] = []
    if other_reasons or (pred.get("rebuild") and others):
        remedies += _same_ninja_remedies(launch, others, op, f.get("python"))
    for d in op.get("differences") or []:
        if d["what"].startswith("the C++ compiler"):
            remedies.append(Remedy(title=f"Launch with the compiler the op was built with ({d['build']})",
                                   commands=[f"export CXX={shlex.quote(d['build'].split()[-1])}"],
                                   undo=["unset CXX"], note="not tried: it changes the compiler of every JIT build"))
    if not remedies:
        remedies.append(Remedy(title="Let one launch rebuild it, then launch from this same environment",
                               note="not tried: the rebuild is the next launch itself"))
    why = "; ".join(reasons) if reasons else other_reasons[0]
    rest = other_reasons if reasons else other_reasons[1:]
    return Finding(
        id=fid, status="warn",
        title=f"The next launch rebuilds op {op['name']} because {why[:300]}",
        detail=f"{op['dir']}: its last build took {took} (the .ninja_log's times). While one rank builds, the others "
               "wait on the op's build lock (torch's FileBaton) without a word: minutes that look like a hang."
               + "".join(f" Also: {r}." for r in rest),
        remedies=remedies,
        explains=ids_for(facts, "ninja-log-version") if refused else [])


@check(NAME, title=TITLE, probes=("jitbuildlog",), findings=("jit.build-log.*",), explains=("ninja-log-version",),
       layer="jit-build-log")
def check_build_log(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("jitbuildlog")
    if not f:
        return [me.not_checked(facts.why_not("jitbuildlog"), sub="not-checked")]
    ops = f.get("ops") or []
    if not ops:
        return [me.not_checked(f"no JIT-built op in {f.get('root') or 'the extension cache'}"
                               + (f" ({'; '.join(f['unread'][:2])})" if f.get("unread") else ""), sub="not-checked")]
    ninjas = f.get("ninjas") or []
    launch = next((n for n in ninjas if n.get("path") == f.get("launch")), None)
    if launch is None:
        return [me.not_checked("no ninja on the training PATH: torch cannot build (the "
                                                          "toolchain.jit-prereq check says why)", sub="not-checked")]
    if not launch.get("runs"):
        return [me.not_checked(f"{launch['path']} --version did not run: {launch['error']}", sub="not-checked")]
    others = [n for n in ninjas if n is not launch and n.get("runs")]
    return [_op_finding(facts, f, op, launch, others) for op in ops]
