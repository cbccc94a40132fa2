"""Probe ``origins``: where each line the user saw comes from in the training environment's installed code.

Facts:

- ``origins``: {symptom id: [origin]}, each origin (see :func:`.origin._describe`) a Python site (``file``
  relative to its site-packages folder, ``path``, ``line``, ``kind`` such as ``raise ValueError``, ``assert``
  or ``logger.warning``, ``guard`` as source text, ``reads`` {config, env, attrs}) or a library's format
  string (``file``, ``offset``, ``library_version``), with ``package``, ``version``, ``template`` and
  ``text`` (the origin in words).
- ``env``: {variable: its value in the job's environment, or None when unset} for each variable an origin reads.
- ``index``: what building or reading the index did (:meth:`.origin_index.EnvIndex.summary`), ``site_dirs``.
- ``skipped``: why nothing was located (no symptom, no interpreter that answered).
"""

from __future__ import annotations

import os
from typing import Any

from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.proc.target import target_of
from zdoctor.symptoms.origin import OriginIndex, located
from zdoctor.symptoms.origin_index import index_env

#: Seconds the index may take to build (a later run continues where a cut one stopped).
BUILD_BUDGET = 120.0


def site_dirs(pyenv: dict[str, Any]) -> list[str]:
    """The training interpreter's site-packages folders, from its ``sys.path``."""
    path = ((pyenv or {}).get("python") or {}).get("sys_path") or []
    out = []
    for p in path:
        if isinstance(p, str) and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages") \
                and os.path.isdir(p) and os.path.realpath(p) not in out:
            out.append(os.path.realpath(p))
    return out


@probe("origins", title="Where each message comes from in the training environment's installed code",
       timeout=BUILD_BUDGET + 60, needs=("symptoms", "pyenv"))
def origins_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    """Each symptom's line matched against the index of the environment's message templates."""
    seen = host.result("symptoms")
    symptoms = (seen.facts or {}).get("symptoms") or [] if seen.status == "ok" else []
    lines = [s for s in symptoms if isinstance(s, dict) and s.get("text") and s.get("kind") != "exit-status"]
    if not lines:
        return {"skipped": "no line the user saw to locate", "origins": {}}, []
    env_res = host.result("pyenv")
    sites = site_dirs(env_res.facts if env_res.status == "ok" else {})
    if not sites:
        return {"skipped": "the training interpreter named no site-packages folder", "origins": {}}, []
    built = index_env(sites, BUILD_BUDGET)
    env = OriginIndex(built)
    found: dict[str, list[dict[str, Any]]] = {}
    job_env = target_of(host).env
    values: dict[str, str | None] = {}
    for s in lines:
        hits = env.find(str(s["text"]))
        for o in hits:
            o["text"] = located(o)
            for var in (o.get("reads") or {}).get("env") or []:
                values[var] = job_env.get(var)
        if hits:
            found[str(s["id"])] = hits
    facts = {"origins": found, "env": values, "index": {**built.summary(), "site_dirs": sites}}
    rows = [[sid, o["text"], f"{o['package']} {o['version']}".strip()] for sid, hits in found.items() for o in hits]
    ev = [Evidence.of_table("where each message comes from", ["symptom", "origin", "package"], rows)] if rows else []
    return facts, ev
