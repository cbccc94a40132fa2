"""Check ``libs.glibc``: a library needs a newer glibc (``GLIBC_2.xx``, not ``GLIBCXX``) than the host has.

glibc is the operating system's C library: unlike libstdc++, another copy cannot be slipped in with
LD_LIBRARY_PATH or LD_PRELOAD (libc and the dynamic loader ld.so must come from the same build, and
ld.so is named in every executable). The real ways out are a build of the package made for this glibc,
or an OS image / container whose glibc is new enough.
"""

from __future__ import annotations

import os
from typing import Any

from ..forensics.versions import parse_version
from ..model import Finding, Remedy
from ..registry import Facts, check, predicate
from . import not_checked


def _num(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    p = parse_version(v if v.startswith("GLIBC_") else f"GLIBC_{v}")
    return p[1] if p else None


def glibc_errors(facts: Facts) -> list[dict[str, Any]]:
    """GLIBC_x version errors: the real loader's (live run), else the emulation's."""
    def glibc(errs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        return [e for e in errs or [] if str(e.get("version", "")).startswith("GLIBC_")]

    live = glibc(facts.get_fact("livetrace", "version_errors"))
    static = glibc(facts.get_fact("libs", "failures"))
    return live or static


def _remedies(host: str | None, need: str | None) -> list[Remedy]:
    return [
        Remedy(title="Install a build made for this host's glibc: pip picks a wheel whose manylinux tag the host "
                     "supports when one exists (the list shows which tags that is)",
               commands=["python -m pip debug --verbose 2>/dev/null | grep -m8 manylinux",
                         "python -m pip install --force-reinstall --no-cache-dir --only-binary :all: torch"],
               explanation="A wheel copied from a newer machine, a venv built in a newer container, or a conda "
                           "package for a newer sysroot brings a glibc need this host cannot meet."),
        Remedy(title=f"Or run the training on an OS image or in a container with glibc {need or 'new enough'} or "
                     f"newer (this host: {host or 'unknown'})",
               commands=["# e.g. a container image of a newer distribution release; check with: ldd --version"]),
    ]


@check("libs.glibc", title="glibc (GLIBC_x) needed vs the host's", probes=("glibc", "livetrace"))
def check_glibc(facts: Facts) -> list[Finding]:
    g = facts.of("glibc") or {}
    host = g.get("host")
    ev = facts.evidence("glibc")
    errs = glibc_errors(facts)
    out: list[Finding] = []
    if errs:
        need = max((e["version"] for e in errs), key=lambda v: _num(v) or ())
        who = sorted({os.path.basename(e.get("required_by") or "?") for e in errs})
        lines = [f"{', '.join(who)} need{'s' if len(who) == 1 else ''} {need}; the host's glibc is "
                 f"{host or 'unknown'} ({errs[0].get('provider') or 'libc.so.6'}).",
                 f"The loader said: {errs[0].get('message') or need + ' not found'}",
                 "This is glibc, the OS C library, not libstdc++ (GLIBCXX): another copy cannot be loaded for one "
                 "program with LD_LIBRARY_PATH or LD_PRELOAD (libc and ld.so come as one build), and replacing the "
                 "system's glibc breaks the OS. The library was built on a newer system than this one."]
        if g.get("torch_needs"):
            lines.append(f"torch's own libraries need up to {g['torch_needs']}"
                         + (f"; its wheel is tagged {', '.join(g['wheel_tags'])}" if g.get("wheel_tags") else "") + ".")
        out.append(Finding(id="libs.glibc", status="fail",
                           title=f"{', '.join(who)} need{'s' if len(who) == 1 else ''} {need}, newer than this host's "
                                 f"glibc {host or '(unknown)'}",
                           detail="\n".join(lines), evidence=ev, remedies=_remedies(host, need)))
        return out
    need = g.get("torch_needs")
    if not g:
        return [not_checked("libs.glibc", "glibc", facts.why_not("glibc"))]
    if not need or not host:
        return [Finding(id="libs.glibc", status="skip", title="glibc: nothing to compare",
                        detail=f"host glibc {host or 'unknown'}; torch's needs "
                               f"{'unknown (torch not found)' if not g.get('torch_location') else 'none read'}",
                        evidence=ev)]
    if (_num(need) or ()) > (_num(host) or ()):
        return [Finding(id="libs.glibc", status="fail",
                        title=f"torch needs {need}, newer than this host's glibc {host}",
                        detail=f"Read from torch's libraries "
                               f"({', '.join(x['path'] for x in g.get('torch_needs_by') or [])}). "
                               "import torch will fail with \"version `" + need + "' not found\". glibc cannot be "
                               "swapped per program like libstdc++.", evidence=ev, remedies=_remedies(host, need))]
    return [Finding(id="libs.glibc", status="ok", title=f"torch needs up to {need}; the host's glibc is {host}",
                    detail="Read from the GLIBC_x version needs of torch's libraries.", evidence=ev)]


@predicate("glibc_too_old", doc="a library needs a newer glibc (GLIBC_x) than the host has",
           probes=("glibc", "livetrace"))
def glibc_too_old(facts: Facts) -> bool:
    return any(f.status == "fail" for f in check_glibc(facts))
