"""Probe ``symbols``: every ``undefined symbol`` error of the live run, demangled and triaged
(C++11 ABI mismatch, shadowed library copy, never-linked library; see forensics/symbols.py)."""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.factstypes import SymbolsFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.libraries import symbols as sy
from zdoctor.layers.libraries.linkerrors import link_libraries, parse_link_errors, triage_link
from zdoctor.layers.libraries.runneeds import is_libstdcxx_version
from zdoctor.layers.libraries.symtrials import plans_for, try_plans
from zdoctor.proc.target import target_of

#: Libraries the run loaded that are searched for the other-ABI twin of an undefined reference.
MAX_LOADED_SCANNED = 40
#: Each environment-only workaround is tried by re-running the failing command within this time.
TRIAL_TIMEOUT = 60.0


def error_text(live: dict[str, Any]) -> str:
    """The live run's error output: stderr's tail and each failed step's error."""
    parts = [live.get("stderr_tail") or ""]
    parts += [str(s.get("error") or "") for s in live.get("steps") or [] if s.get("ok") is False]
    return "\n".join(parts)


def collect_symbols(live: dict[str, Any], pyenv: dict[str, Any], env: dict[str, str],
                    trial_timeout: float = TRIAL_TIMEOUT) -> tuple[dict[str, Any], list[Evidence]]:
    """The facts for the live run ``live`` (livetrace facts) of the environment ``pyenv``."""
    errors = sy.parse_undefined(error_text(live))
    loaded: dict[str, str] = {}
    for x in live.get("loaded_all") or []:
        if x.get("path"):
            loaded.setdefault(x["name"], x["path"])
            loaded.setdefault(os.path.basename(x["path"]), x["path"])
    torch = (pyenv or {}).get("torch") or {}
    abi = torch.get("cxx11_abi")
    sites = []
    for pkg in ((pyenv or {}).get("packages") or {}).values():
        loc = (pkg or {}).get("location") if isinstance(pkg, dict) else None
        if isinstance(loc, str):
            sites.append(os.path.dirname(loc))
    found = [sy.triage(e["object"], e["symbol"], loaded, env, abi, list(dict.fromkeys(sites)), e.get("version"))
             for e in errors[:8]]
    for e in live.get("version_errors") or []:
        v = str(e.get("version") or "")
        if e.get("provider") and not is_libstdcxx_version(v) and not v.startswith("GLIBC_") and len(found) < 16:
            found.append(sy.triage_version(e, env, list(dict.fromkeys(loaded.values())), list(dict.fromkeys(sites))))
    for rec in found:
        plans = plans_for(rec, env, list(dict.fromkeys(loaded.values())), list(dict.fromkeys(sites)))
        rec["plans"] = [p.to_dict() for p in try_plans(plans, live.get("argv"), env, trial_timeout)]
    refs = parse_link_errors(error_text(live))
    if refs:
        # the link line (the command, or the failing build line in the output) and what the run loaded
        libraries = link_libraries([live.get("command") or "", error_text(live)])
        libraries += [p for p in dict.fromkeys(loaded.values()) if p not in libraries][:MAX_LOADED_SCANNED]
        found += [triage_link(r, libraries, abi) for r in refs[:8]]
    facts = {"errors": found, "torch_cxx11_abi": abi, "loaded_count": len(live.get("loaded_all") or [])}
    rows = [[os.path.basename(f["object"] or "?"), (f["symbol"] or f"version node {f.get('version')}")[:60],
             (f.get("demangled") or "-")[:80], f["kind"]] for f in found]
    ev = [Evidence.of_table("undefined symbols of the live run", ["object", "symbol", "demangled", "cause"],
                            rows, list(range(len(rows))))] if rows else []
    return facts, ev


@probe("symbols", title="Undefined symbols, demangled and triaged", timeout=90 + 3 * TRIAL_TIMEOUT,
       needs=("livetrace", "pyenv"), facts=SymbolsFacts)
def symbols_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    live = facts_of(host, "livetrace")
    if not live:
        return {"skipped": "no live run to read"}, []
    env = dict(getattr(host, "env", None) or os.environ)
    timeout = min(float(getattr(target_of(host), "timeout", None) or TRIAL_TIMEOUT), TRIAL_TIMEOUT)
    return collect_symbols(live, facts_of(host, "pyenv"), env, timeout)
