"""Probe ``dsrelease``: which behaviour the installed DeepSpeed release has for the rules that changed
between releases (zdoctor/layers/python_env/dsrules.py) and which known launcher bugs it has
(zdoctor/layers/python_env/dsbugs.py), read from its files, and which install built each JIT op."""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.factstypes import DsreleaseFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.python_env import dsbugs, jitorigin
from zdoctor.layers.python_env import dsrules as dsr
from zdoctor.proc.target import target_of


def collect_dsrelease(pyenv: dict[str, Any], jit: dict[str, Any], env: dict[str, str] | None = None,
                      cwd: str | None = None) -> tuple[dict[str, Any], list[Evidence]]:
    """The facts for the DeepSpeed described by the pyenv facts and the ops of the jitcache facts; with the
    launch's ``env`` and directory ``cwd``, the exported values the pdsh launcher would break on."""
    ds = (pyenv or {}).get("deepspeed") or {}
    pkg = ((pyenv or {}).get("packages") or {}).get("deepspeed") or {}
    installed = bool(ds.get("installed") or pkg.get("installed"))
    loc = ds.get("location") or pkg.get("location")
    version = ds.get("version") or ds.get("dist_version") or pkg.get("version")
    rules = dsr.installed_rules(loc if installed else None, version) if installed else {}
    bugs = dsbugs.installed_bugs(loc, version) if installed else {}
    target = (pyenv or {}).get("target") or {}
    origins = []
    for op in (jit or {}).get("ops") or []:
        if not op.get("so_path"):
            continue
        rec = jitorigin.origin(op["dir"], op.get("so_path"))
        rec["op"] = op.get("name")
        rec["in_use"] = op.get("in_use")
        rec["same_install"] = jitorigin.same_dir(rec["deepspeed_dir"], loc)
        origins.append(rec)
    facts = {"installed": installed, "version": version, "location": loc, "rules": rules, "jit_origins": origins,
             "bugs": bugs, "python": target.get("resolved") or target.get("requested"),
             "exports": dsbugs.exported_with_syntax(env, cwd or os.getcwd()) if env is not None else None}
    rows = [[rid, rec["state"], rec.get("file") or rec.get("why") or "-"] for rid, rec in rules.items()]
    ev = [Evidence.of_table(f"DeepSpeed {version or '?'}: behaviour of the installed release",
                            ["rule", "installed release has", "read from"], rows,
                            [i for i, r in enumerate(rows) if r[1] == "old"])]
    if bugs:
        bug_rows = [[bid, rec["state"], rec.get("file") or rec.get("how") or rec.get("why") or "-"]
                    for bid, rec in bugs.items()]
        ev.append(Evidence.of_table(f"DeepSpeed {version or '?'}: known launcher bugs of its release",
                                    ["bug", "installed release", "read from"], bug_rows,
                                    [i for i, r in enumerate(bug_rows) if r[1] == "affected"]))
    if origins:
        ev.append(Evidence.of_table("JIT ops: the DeepSpeed install that built them",
                                    ["op", "built from", "its version now", "same install as the training's"],
                                    [[o["op"], o["deepspeed_dir"] or "?", o["version"] or "unknown",
                                      {True: "yes", False: "no", None: "unknown"}[o["same_install"]]]
                                     for o in origins]))
    return facts, ev


@probe("dsrelease", title="Rules of the installed DeepSpeed release", timeout=30, needs=("pyenv", "jitcache"),
       facts=DsreleaseFacts)
def dsrelease_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    return collect_dsrelease(facts_of(host, "pyenv"), facts_of(host, "jitcache"), env=target_of(host).env)
