"""Probe ``glibc``: the host's glibc, and the newest glibc the installed torch needs (the GLIBC_x version
needs of its libraries, and the manylinux tag of its wheel)."""

from __future__ import annotations

import glob
import os
import platform
import re
from typing import Any

from zdoctor.core.factstypes import GlibcFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import facts_of, probe
from zdoctor.layers.libraries.probe_libs import LIVE_TIMEOUT
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.elf import read_elf
from zdoctor.readers.owner import owner_of
from zdoctor.readers.versions import newest

LIBC_SONAMES = ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1")
MAX_LIBS = 80
_TAG = re.compile(r"manylinux_(\d+)_(\d+)|manylinux(2014|2010|1)")
#: The glibc each legacy manylinux alias stands for (PEP 600).
LEGACY = {"2014": (2, 17), "2010": (2, 12), "1": (2, 5)}


def host_glibc(pyenv: dict[str, Any] | None = None) -> str | None:
    """``"2.36"``: the training interpreter's glibc (pyenv facts), else this process's."""
    g = (((pyenv or {}).get("python") or {}).get("glibc") or {})
    text = g.get("confstr") or " ".join(g.get("libc_ver") or [])
    if not text:
        try:
            text = os.confstr("CS_GNU_LIBC_VERSION")
        except (AttributeError, ValueError, OSError):
            text = " ".join(platform.libc_ver())
    m = re.search(r"(\d+\.\d+)", text or "")
    return m.group(1) if m else None


def wheel_tags(site: str, dist: str) -> list[str]:
    """The ``Tag:`` lines of ``<dist>-*.dist-info/WHEEL`` in ``site``."""
    out: list[str] = []
    for wheel in sorted(glob.glob(os.path.join(site, f"{dist}-*.dist-info", "WHEEL")))[:2]:
        try:
            with open_regular_text(wheel, encoding="utf-8", errors="replace") as fh:
                out += [ln.split(":", 1)[1].strip() for ln in fh.read(16384).splitlines() if ln.startswith("Tag:")]
        except OSError:
            continue
    return out


def tag_glibc(tag: str) -> str | None:
    """``cp311-cp311-manylinux_2_28_x86_64`` -> ``"2.28"``; ``manylinux2014`` -> ``"2.17"``."""
    m = _TAG.search(tag)
    if not m:
        return None
    if m.group(3):
        major, minor = LEGACY[m.group(3)]
        return f"{major}.{minor}"
    return f"{m.group(1)}.{m.group(2)}"


def glibc_needs(paths: list[str]) -> list[dict[str, Any]]:
    """Per library: its newest GLIBC_x need."""
    out = []
    for p in paths[:MAX_LIBS]:
        info = read_elf(p)
        if not info.ok:
            continue
        needs = [v for so in LIBC_SONAMES for v, _weak in info.needs_from(so) if v.startswith("GLIBC_2")]
        top = newest(needs, "GLIBC")
        if top:
            out.append({"path": p, "newest": top})
    return out


def collect_glibc(pyenv: dict[str, Any]) -> tuple[GlibcFacts, list[Evidence]]:
    torch = ((pyenv or {}).get("packages") or {}).get("torch") or {}
    loc = torch.get("location") if isinstance(torch.get("location"), str) else None
    libs = sorted(glob.glob(os.path.join(loc, "lib", "*.so*")))[:MAX_LIBS] + \
        sorted(glob.glob(os.path.join(loc, "_C*.so"))) if loc else []
    per_lib = glibc_needs(libs)
    top = newest([x["newest"] for x in per_lib], "GLIBC")
    tags = wheel_tags(os.path.dirname(loc), "torch") if loc else []
    tag_glibcs = [g for g in (tag_glibc(t) for t in tags) if g]
    tag_need = max(tag_glibcs, default=None, key=lambda v: tuple(int(p) for p in v.split(".")))
    facts: GlibcFacts = {"host": host_glibc(pyenv), "torch_location": loc, "torch_needs": top,
                         "torch_needs_by": [x for x in per_lib if x["newest"] == top][:3], "wheel_tags": tags,
                         "wheel_tag_glibc": tag_need, "libs_read": len(libs)}
    rows = [["host glibc", "gnu_get_libc_version", facts["host"] or "unknown"],
            ["torch needs (ELF version needs)", f"{len(libs)} libraries under {loc or '-'}",
             top or "unknown"],
            ["torch wheel tag", ", ".join(tags) or "-", tag_need or "unknown"]]
    return facts, [Evidence.of_table("glibc: the host's vs what torch needs", ["what", "from", "value"], rows)]


def glibc_version_errors(live: list[dict[str, Any]] | None, static: list[dict[str, Any]] | None
                         ) -> list[dict[str, Any]]:
    """GLIBC_x version errors: the real loader's (live run), else the emulation's."""
    def glibc(errs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        return [e for e in errs or [] if str(e.get("version", "")).startswith("GLIBC_")]

    return glibc(live) or glibc(static)


OWNERS_TIMEOUT = max(LIVE_TIMEOUT + 30, 90) + 30


@probe("glibc", title="The host's glibc vs what torch needs, and who owns a library needing a newer one",
       timeout=OWNERS_TIMEOUT, needs=("pyenv", "libs", "livetrace"), facts=GlibcFacts)
def glibc_probe(host) -> tuple[GlibcFacts, list[Evidence]]:
    """The host's glibc, torch's GLIBC_x needs, and the package (pip RECORD, conda-meta, dpkg -S or rpm -qf)
    of every library the loader refused for its GLIBC_x need (``owners``: {library: owner})."""

    pyenv = facts_of(host, "pyenv")
    facts, evidence = collect_glibc(pyenv)
    errs = glibc_version_errors(facts_of(host, "livetrace").get("version_errors"),
                                facts_of(host, "libs").get("failures"))
    sites = [p for p in ((pyenv.get("python") or {}).get("sys_path") or []) if isinstance(p, str) and p]
    env = dict(target_of(host).env)
    owners: dict[str, Any] = {}
    for e in errs[:20]:
        lib = e.get("required_by")
        if isinstance(lib, str) and lib and lib not in owners:
            owners[lib] = owner_of(lib, sites, env)
    facts["owners"] = owners
    if owners:
        rows = [[lib, o["manager"], f"{o.get('name') or '?'} {o.get('version') or ''}".strip(), o.get("how") or "-"]
                for lib, o in owners.items()]
        evidence.append(Evidence.of_table("owner of each library needing a newer glibc",
                                          ["library", "manager", "package", "found by"], rows))
    return facts, evidence
