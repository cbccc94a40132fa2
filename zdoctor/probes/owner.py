"""Which package a file belongs to: a pip distribution (its ``*.dist-info/RECORD``), a conda package
(``conda-meta/*.json``), or an OS package (``dpkg -S`` / ``rpm -qf``); unknown otherwise."""

from __future__ import annotations

import csv
import glob
import json
import os
from typing import Any

from ..runner import run, which_all

MAX_RECORDS = 2000
OS_TIMEOUT = 20.0


def _dist_name(info_dir: str) -> tuple[str, str | None]:
    """(name, version) from METADATA, else from the ``name-version.dist-info`` directory name."""
    name, _sep, version = os.path.basename(info_dir)[: -len(".dist-info")].partition("-")
    try:
        with open(os.path.join(info_dir, "METADATA"), encoding="utf-8", errors="replace") as fh:
            for line in fh.read(8192).splitlines():
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                elif not line.strip():
                    break
    except OSError:
        pass
    return name, version or None


def pip_owner(path: str, sites: list[str]) -> dict[str, Any] | None:
    """The pip distribution whose RECORD lists ``path`` (compared by real path)."""
    real = os.path.realpath(path)
    base = os.path.basename(path)
    seen = 0
    for site in dict.fromkeys(sites):
        for record in sorted(glob.glob(os.path.join(glob.escape(site), "*.dist-info", "RECORD"))):
            seen += 1
            if seen > MAX_RECORDS:
                return None
            try:
                with open(record, encoding="utf-8", errors="replace", newline="") as fh:
                    rows = list(csv.reader(fh))
            except (OSError, csv.Error):
                continue
            for row in rows:
                if not row or os.path.basename(row[0]) != base:
                    continue
                if os.path.realpath(os.path.join(site, row[0])) == real:
                    name, version = _dist_name(os.path.dirname(record))
                    return {"kind": "pip", "package": name, "version": version, "how": record}
    return None


def conda_owner(path: str) -> dict[str, Any] | None:
    """The conda package listing ``path`` in the ``conda-meta`` of the prefix above it."""
    real = os.path.realpath(path)
    d = os.path.dirname(real)
    while d and d != os.path.dirname(d):
        meta = os.path.join(d, "conda-meta")
        if os.path.isdir(meta):
            rel = os.path.relpath(real, d)
            for f in sorted(glob.glob(os.path.join(glob.escape(meta), "*.json")))[:MAX_RECORDS]:
                try:
                    with open(f, encoding="utf-8") as fh:
                        doc = json.load(fh)
                except (OSError, ValueError):
                    continue
                if isinstance(doc, dict) and rel in (doc.get("files") or []):
                    return {"kind": "conda", "package": doc.get("name"), "version": doc.get("version"), "how": f,
                            "prefix": d}
            return None
        d = os.path.dirname(d)
    return None


def _usrmerge_variants(path: str) -> list[str]:
    out = [path, os.path.realpath(path)]
    for p in list(out):
        if p.startswith("/usr/lib/"):
            out.append(p[4:])
        elif p.startswith("/lib/"):
            out.append("/usr" + p)
    return list(dict.fromkeys(out))


def os_owner(path: str, env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The distribution package owning ``path``: ``dpkg -S``, else ``rpm -qf``."""
    search = (env or {}).get("PATH") or "/usr/bin:/bin:/usr/sbin:/sbin"
    dpkg, rpm = which_all("dpkg", search), which_all("rpm", search)
    for p in _usrmerge_variants(path):
        if dpkg:
            ev = run([dpkg[0], "-S", p], timeout=OS_TIMEOUT, label=f"dpkg -S {p}")
            line = (ev.stdout or "").strip().splitlines()[:1]
            if ev.exit_code == 0 and line and ": " in line[0]:
                pkg = line[0].split(": ", 1)[0].split(", ")[0]
                return {"kind": "dpkg", "package": pkg.split(":")[0], "arch": pkg.partition(":")[2] or None,
                        "version": None, "how": f"dpkg -S {p}"}
        if rpm:
            ev = run([rpm[0], "-qf", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n", p], timeout=OS_TIMEOUT,
                     label=f"rpm -qf {p}")
            words = (ev.stdout or "").split()
            if ev.exit_code == 0 and len(words) >= 2:
                return {"kind": "rpm", "package": words[0], "version": words[1], "how": f"rpm -qf {p}"}
    return None


def owner_of(path: str, sites: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The package ``path`` belongs to, pip first (a wheel's file), then conda, then the OS's."""
    return (pip_owner(path, sites) or conda_owner(path) or os_owner(path, env)
            or {"kind": "unknown", "package": None, "version": None,
                "how": "not in a pip RECORD, a conda-meta file, dpkg or rpm"})
