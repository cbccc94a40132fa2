"""Probe ``origins``: where each line the user saw comes from in the training environment's installed code.

Facts:

- ``origins``: {symptom id: [origin]}, each origin (see :func:`.origin._describe`) a Python site (``file``
  relative to its site-packages folder, ``path``, ``line``, ``kind`` such as ``raise ValueError``, ``assert``
  or ``logger.warning``, ``guard`` as source text, ``reads`` {config, env, attrs}) or a library's format
  string (``file``, ``offset``, ``library_version``), with ``package``, ``version``, ``template`` and
  ``text`` (the origin in words).
  ``line_seen``: the line after the symptom's that the template matched, when the message went on there.
- ``env``: {variable: its value in the job's environment, or None when unset} for each variable an origin reads.
- ``index``: what building or reading the index did (:meth:`.origin_index.EnvIndex.summary`), ``site_dirs``,
  ``named`` (the packages what the user saw names: indexed first), ``whole`` (the whole environment was read
  too: a line was still not located and no catalogue entry knows it).
- ``skipped``: why nothing was located (no symptom, no interpreter that answered).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.factstypes import OriginsFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.proc.target import target_of
from zdoctor.symptoms.origin import OriginIndex, located
from zdoctor.symptoms.origin_index import index_env
from zdoctor.symptoms.probe_symptoms import log_tail

#: Seconds the packages named in what the user saw (a traceback's files) may take to index.
NAMED_BUDGET = 90.0
#: Seconds the rest of the environment may take to index, for a line still not located that the catalogue
#: does not know either (a later run continues where a cut one stopped: each package is cached).
REST_BUDGET = 30.0
#: A line no template matches is tried with at most this many of the lines after it: a message printed on
#: several lines (pydantic's validation error puts the raised message on the next line).
NEXT_LINES = 6


def seen_texts(host: Any) -> dict[str, str]:
    """What the user saw in full, by symptom source: the command's output, the log's end, the pasted messages."""
    out: dict[str, str] = {}
    target = target_of(host)
    out["user"] = "\n".join(str(t) for t in target.options.get("symptom") or [])
    res = host.result("livetrace")
    if res.status == "ok" and res.evidence:
        out["command"] = f"{res.evidence[0].stdout or ''}\n{res.evidence[0].stderr or ''}"
    log = target.options.get("train_log")
    if log:
        with contextlib.suppress(InputError):  # the symptoms probe said it could not be read
            out["log"] = log_tail(str(log))[0]
    return out


#: A file under a site-packages folder, as a traceback names it: its top-level package or module.
SITE_FILE = re.compile(r"/(?:site|dist)-packages/([A-Za-z_][\w-]*(?:\.py)?)(?=[/\"'\s:]|$)")


def packages_named(texts: Iterable[str], sites: list[str]) -> list[str]:
    """The top-level packages of ``sites`` whose files what the user saw names (a traceback's ``File "..."``)."""
    out: list[str] = []
    for text in texts:
        for m in SITE_FILE.finditer(text):
            name = m.group(1)
            if name not in out and any(os.path.exists(os.path.join(site, name)) for site in sites):
                out.append(name)
    return out


def locate(index: OriginIndex, s: dict[str, Any], texts: dict[str, str]) -> list[dict[str, Any]]:
    """The origins of symptom ``s``'s line, or of the first of the lines after it that has one."""
    hits = index.find(str(s["text"]))
    for nxt in [] if hits else next_lines(texts.get(str(s.get("source")), ""), str(s["text"])):
        hits = index.find(nxt)
        for o in hits:
            o["line_seen"] = nxt
        if hits:
            break
    return hits


def next_lines(text: str, line: str) -> list[str]:
    """The lines after the last one of ``text`` that is ``line``, up to a blank line or a new traceback."""
    lines = text.splitlines()
    key = " ".join(line.split())
    at = next((i for i in range(len(lines) - 1, -1, -1) if " ".join(lines[i].split()) == key), None)
    out: list[str] = []
    for ln in lines[at + 1:at + 1 + NEXT_LINES] if at is not None else []:
        if not ln.strip() or ln.startswith("Traceback") or ln.lstrip().startswith('File "'):
            break
        out.append(ln.strip())
    return out


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
       timeout=NAMED_BUDGET + REST_BUDGET + 60, needs=("symptoms", "pyenv", "livetrace"), facts=OriginsFacts)
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
    texts = seen_texts(host)
    named = packages_named(texts.values(), sites)
    built = index_env(sites, NAMED_BUDGET, names=named)
    index = OriginIndex(built)
    found = {str(s["id"]): locate(index, s, texts) for s in lines}
    rest = [s for s in lines if not found[str(s["id"])] and not s.get("signature")]
    if rest:  # a message nothing knows: the whole environment (cached packages read back, the rest built)
        built = index_env(sites, REST_BUDGET)
        index = OriginIndex(built)
        found.update({str(s["id"]): locate(index, s, texts) for s in rest})
    job_env = target_of(host).env
    values: dict[str, str | None] = {}
    for hits in found.values():
        for o in hits:
            o["text"] = located(o)
            for var in (o.get("reads") or {}).get("env") or []:
                values[var] = job_env.get(var)
    found = {sid: hits for sid, hits in found.items() if hits}
    facts = {"origins": found, "env": values, "index": {**built.summary(), "site_dirs": sites, "named": named,
                                                        "whole": bool(rest)}}
    rows = [[sid, o["text"], f"{o['package']} {o['version']}".strip()] for sid, hits in found.items() for o in hits]
    ev = [Evidence.of_table("where each message comes from", ["symptom", "origin", "package"], rows)] if rows else []
    return facts, ev
