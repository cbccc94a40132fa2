"""Check ``libs.glibc``: a library needs a newer glibc (``GLIBC_2.xx``, not ``GLIBCXX``) than the host has.

glibc is the operating system's C library: unlike libstdc++, another copy cannot be slipped in with
LD_LIBRARY_PATH or LD_PRELOAD (libc and the dynamic loader ld.so must come from the same build, and
ld.so is named in every executable). The real ways out are a build of the package made for this glibc,
or an OS image / container whose glibc is new enough.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.packages import managers_of_owner
from zdoctor.core.registry import CheckSpec, Facts, check
from zdoctor.core.shellquote import shell_quote
from zdoctor.layers.libraries.probe_glibc import glibc_version_errors
from zdoctor.readers.versions import parse_version
from zdoctor.symptoms.match import ids_for


def _num(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    p = parse_version(v if v.startswith("GLIBC_") else f"GLIBC_{v}")
    return p[1] if p else None


def glibc_errors(facts: Facts) -> list[dict[str, Any]]:
    """GLIBC_x version errors: the real loader's (live run), else the emulation's."""
    return glibc_version_errors((facts.of("livetrace") or {}).get("version_errors"),
                                (facts.of("libs") or {}).get("failures"))


def _python(facts: Facts) -> str:
    return str(((facts.of("pyenv") or {}).get("target") or {}).get("resolved") or "python")


def _build_remedy(facts: Facts, who: str, owners: list[dict[str, Any]]) -> Remedy:
    """Reinstall the package the refused library belongs to, from a build for this host's glibc."""
    kinds = {o["manager"] for o in owners}
    pkgs = sorted({o["name"] for o in owners if o.get("name")})
    py = shell_quote(_python(facts))
    if kinds == {"pip"}:
        return Remedy(
            title=f"Reinstall {', '.join(pkgs)} (the pip package {who} belongs to) from a build for this host's "
                  "glibc: pip picks a wheel whose manylinux tag the host supports when one exists",
            commands=[f"{py} -m pip debug --verbose 2>/dev/null | grep -m8 manylinux",
                      f"{py} -m pip install --force-reinstall --no-cache-dir --only-binary :all: "
                      + " ".join(shlex.quote(p) for p in pkgs)],
            note="not tried: it replaces installed packages",
            explanation="A wheel copied from a newer machine, a venv built in a newer container, or a wheel "
                        "built from source on a newer OS brings a glibc need this host cannot meet. If pip "
                        "finds no wheel for this glibc, build the package from source here (`--no-binary`).")
    if kinds == {"conda"}:
        prefix = owners[0].get("prefix") or ""
        return Remedy(title=f"Reinstall the conda package {', '.join(pkgs)} for this host",
                      commands=[f"conda install -p {shell_quote(prefix)} --force-reinstall "
                                + " ".join(shlex.quote(p) for p in pkgs)],
                      note="not tried: it replaces installed packages",
                      explanation="conda packages are built against a sysroot; a package for a newer one needs a "
                                  "newer glibc. The conda package __glibc pins what the solver assumes.")
    if kinds <= {"dpkg", "rpm"}:
        pm = managers_of_owner("dpkg" if kinds == {"dpkg"} else "rpm", (facts.of("toolchain") or {}).get("distro"))[0]
        return Remedy(title=f"Install the {', '.join(pkgs)} package built for this distribution release "
                            f"({pm.label})",
                      commands=pm.reinstall(" ".join(shlex.quote(p) for p in pkgs)), requires_root=True,
                      note="not tried: it needs root",
                      explanation="An OS package that needs a newer glibc than the OS has comes from a newer "
                                  "release of the distribution (a .deb or .rpm copied in, or a mixed "
                                  "repository); the package of this release is built for this glibc.")
    return Remedy(title=f"Replace {who}: no package was found that owns it",
                  commands=[f"ls -l {' '.join(shell_quote(o['path']) for o in owners if o.get('path'))}".strip()],
                  note="not tried: zdoctor does not know where it came from",
                  explanation="It is not listed in any pip RECORD, conda-meta file, dpkg or rpm database: it was "
                              "copied or built by hand. Rebuild it on this host, or take a build made for this "
                              "glibc.")


def _owner_line(lib: str, o: dict[str, Any]) -> str:
    if not o.get("name"):
        return f"{lib}: no pip RECORD, conda-meta file, dpkg or rpm database lists it."
    return f"{lib} belongs to the {o['manager']} package {o['name']}" + (f" {o['version']}." if o.get("version")
                                                                          else ".")


def _owner_by_place(lib: str, torch_dir: str | None) -> dict[str, Any]:
    """The owner when no package database names one: torch's when the file is under torch's directory."""
    if torch_dir and os.path.realpath(lib).startswith(os.path.realpath(torch_dir) + os.sep):
        return {"manager": "pip", "name": "torch", "version": None}
    return {"manager": "unknown", "name": None, "version": None}


def _remedies(facts: Facts, host: str | None, need: str | None, libs: list[str]) -> list[Remedy]:
    glibc = facts.of("glibc") or {}
    owners_fact = glibc.get("owners") or {}
    torch_dir = glibc.get("torch_location")
    owners = []
    for lib in libs:
        o = owners_fact.get(lib) or {}
        if o.get("manager") in (None, "unknown"):
            o = _owner_by_place(lib, torch_dir)
        owners.append({**o, "path": lib})
    torch_only = all(o.get("manager") == "pip" and str(o.get("name") or "").lower() == "torch" for o in owners)
    if libs and not torch_only:
        first = _build_remedy(facts, ", ".join(os.path.basename(x) for x in libs), owners)
    else:
        py = shell_quote(_python(facts))
        first = Remedy(
            title="Install a build made for this host's glibc: pip picks a wheel whose manylinux tag the host "
                  "supports when one exists (the list shows which tags that is)",
            commands=[f"{py} -m pip debug --verbose 2>/dev/null | grep -m8 manylinux",
                      f"{py} -m pip install --force-reinstall --no-cache-dir --only-binary :all: torch"],
            explanation="A wheel copied from a newer machine, a venv built in a newer container, or a conda "
                        "package for a newer sysroot brings a glibc need this host cannot meet.")
    return [first,
            Remedy(title=f"Or run the training on an OS image or in a container with glibc {need or 'new enough'} or "
                         f"newer (this host: {host or 'unknown'})",
                   commands=["# e.g. a container image of a newer distribution release; check with: ldd --version"])]


@check("libs.glibc", title="glibc (GLIBC_x) needed vs the host's", probes=("glibc", "livetrace"),
       optional=("toolchain",), explains=("version-not-found",))
def check_glibc(facts: Facts, me: CheckSpec) -> list[Finding]:
    g = facts.of("glibc") or {}
    host = g.get("host")
    ev = facts.evidence("glibc")
    errs = glibc_errors(facts)
    out: list[Finding] = []
    if errs:
        need = max((e["version"] for e in errs), key=lambda v: _num(v) or ())
        who = sorted({os.path.basename(e.get("required_by") or "?") for e in errs})
        libs = sorted({e["required_by"] for e in errs if e.get("required_by")})
        owners = g.get("owners") or {}
        lines = [f"{', '.join(who)} need{'s' if len(who) == 1 else ''} {need}; the host's glibc is "
                 f"{host or 'unknown'} ({errs[0].get('provider') or 'libc.so.6'}).",
                 f"The loader said: {errs[0].get('message') or need + ' not found'}",
                 *[_owner_line(lib, o) for lib, o in owners.items() if lib in libs],
                 "This is glibc, the OS C library, not libstdc++ (GLIBCXX): another copy cannot be loaded for one "
                 "program with LD_LIBRARY_PATH or LD_PRELOAD (libc and ld.so come as one build), and replacing the "
                 "system's glibc breaks the OS. The library was built on a newer system than this one."]
        if g.get("torch_needs"):
            lines.append(f"torch's own libraries need up to {g['torch_needs']}"
                         + (f"; its wheel is tagged {', '.join(g['wheel_tags'])}" if g.get("wheel_tags") else "") + ".")
        out.append(me.finding(status="fail",
                           title=f"{', '.join(who)} need{'s' if len(who) == 1 else ''} {need}, newer than this host's "
                                 f"glibc {host or '(unknown)'}",
                           detail="\n".join(lines), evidence=ev,
                           remedies=_remedies(facts, host, need, libs),
                           explains=list(dict.fromkeys(
                               sid for e in errs for sid in ids_for(facts, "version-not-found",
                                                                    version=e.get("version"),
                                                                    object=e.get("required_by"))))))
        return out
    need = g.get("torch_needs")
    if not g:
        return [me.not_checked(facts.why_not("glibc"))]
    if not need or not host:
        return [me.finding(status="skip", title="glibc: nothing to compare",
                           detail=f"host glibc {host or 'unknown'}; torch's needs "
                                  f"{'unknown (torch not found)' if not g.get('torch_location') else 'none read'}",
                           evidence=ev)]
    if (_num(need) or ()) > (_num(host) or ()):
        return [me.finding(status="fail",
                           title=f"torch needs {need}, newer than this host's glibc {host}",
                           detail=f"Read from torch's libraries "
                                  f"({', '.join(x['path'] for x in g.get('torch_needs_by') or [])}). "
                                  "import torch will fail with \"version `" + need + "' not found\". glibc cannot be "
                                  "swapped per program like libstdc++.", evidence=ev,
                           remedies=_remedies(facts, host, need, []))]
    return [me.finding(status="ok", title=f"torch needs up to {need}; the host's glibc is {host}",
                       detail="Read from the GLIBC_x version needs of torch's libraries.", evidence=ev)]
