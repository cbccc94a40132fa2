"""The libstdc++ tables of a failure, with what the real run adds to the static audit.

The static audit (the ``libs`` probe) reads the training's own libraries; the traced run also loads
programs it starts (ninja, the compilers) and the object that asked for libstdc++.so.6 first in each
process (the extension imported first). The tables a failure is shown with name those too: every version
any of them needs has its row, with who needs it, and every object that loaded the failing copy first
has its row in "what each library gets".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Evidence
from zdoctor.layers.libraries.runneeds import is_libstdcxx_version, needed_versions

NEEDS_LABEL = "needed vs provided by the loaded libstdc++"
TARGETS_LABEL = "what each library the training imports gets"
MAX_NAMES = 3


def _name(path: str) -> str:
    return os.path.basename(path) or path


def needers_of(libs: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each needed version -> the objects needing it, by name: the static audit's targets, every object the
    traced run mapped, and each object the real loader reported it missing for."""
    out: dict[str, list[str]] = {}

    def add(version: str, name: str) -> None:
        names = out.setdefault(version, [])
        if name and name not in names:
            names.append(name)

    for t in libs.get("targets") or []:
        for v in t.get("needs") or []:
            add(v, str(t["target"]["name"]))
    for v, paths in (live.get("needs") or {}).items():
        for p in paths or []:
            add(v, _name(str(p)))
    for e in live.get("version_errors") or []:
        if is_libstdcxx_version(str(e.get("version") or "")):
            add(str(e["version"]), _name(str(e.get("required_by") or "")))
    return out


def needs_table(libs: Mapping[str, Any], live: Mapping[str, Any]) -> Evidence:
    """Every version the training needs (its libraries' and the run's) against the loaded copy, with who
    needs it; a version the loaded copy lacks, or the real loader reported missing, is marked."""
    winner = libs.get("libstdcxx") or {}
    have = winner.get("versions")
    missing = {str(e.get("version")) for e in live.get("version_errors") or []}
    needers = needers_of(libs, live)
    rows: list[list[str]] = []
    hot: list[int] = []
    for v in needed_versions(libs, live):
        ok = v not in missing and (have is None or v in set(have))
        if not ok:
            hot.append(len(rows))
        names = needers.get(v, [])
        rows.append([v, ", ".join(names[:MAX_NAMES]) + (" ..." if len(names) > MAX_NAMES else ""),
                     "yes" if ok else "NO"])
    loaded = winner.get("path") or "none"
    return Evidence.of_table(f"{NEEDS_LABEL} ({loaded})", ["version needed", "needed by", "provided"], rows, hot)


def with_first_loaders(targets: Evidence, live: Mapping[str, Any], failing: set[str]) -> Evidence:
    """``targets`` (what each library gets) with a row for each object that asked for libstdc++.so.6 first in
    a traced process and is not a row yet (the extension imported first, a program the run started); a row
    that got one of the ``failing`` copies and lacked a version there is marked."""
    if targets.table is None:
        return targets
    rows: list[list[str]] = [list(r) for r in targets.table.rows]
    hot = list(targets.table.highlight)
    names = {r[0] for r in rows}
    errors: dict[str, list[str]] = {}
    for e in live.get("version_errors") or []:
        errors.setdefault(_name(str(e.get("required_by") or "")), []).append(str(e.get("version")))
    loaded = live.get("libstdcxx") or []
    pids = sorted({x.get("pid") for x in loaded if isinstance(x.get("pid"), int)})
    for x in loaded:
        who = _name(str(x.get("needed_by") or ""))
        if not x.get("needed_by") or who in names:
            continue
        names.add(who)
        path = str(x.get("path") or "")
        lacks = ", ".join(sorted(set(errors.get(who, []))))
        if lacks and (os.path.normpath(path) in failing or str(x.get("realpath") or "") in failing):
            hot.append(len(rows))
        where = f" in process {pids.index(x['pid']) + 1}" if len(pids) > 1 and x.get("pid") in pids else ""
        rows.append([who, f"asked for it first{where}", f"{path} {x.get('via') or ''}".strip(), lacks or "-"])
    return Evidence.of_table(targets.label, list(targets.table.columns), rows, hot)


def failure_tables(evidence: list[Evidence], libs: Mapping[str, Any], live: Mapping[str, Any],
                   failing: set[str]) -> list[Evidence]:
    """The static audit's tables with the run's needs and first loaders added (see the module's text)."""
    out = []
    for ev in evidence:
        if ev.table is not None and ev.label.startswith(NEEDS_LABEL):
            out.append(needs_table(libs, live))
        elif ev.table is not None and ev.label == TARGETS_LABEL:
            out.append(with_first_loaders(ev, live, failing))
        else:
            out.append(ev)
    return out
