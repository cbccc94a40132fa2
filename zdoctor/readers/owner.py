"""Which installed package a file belongs to, and its release, from the package metadata on disk.

pip: a ``*.dist-info/RECORD`` of the ``site-packages`` above the file (or of the interpreter's other site
directories) that lists it, ``Name`` and ``Version`` from its ``METADATA``. conda: the ``conda-meta/*.json``
of the prefix above it. dpkg: the ``/var/lib/dpkg/info/*.list`` naming the file (either spelling of a
merged ``/usr``), its ``Version`` from ``/var/lib/dpkg/status``. rpm: ``rpm -qf``. Every read is bounded;
nothing here raises. An owner is ``{manager, name, version, how}`` (``prefix`` too for conda).
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.proc.runner import run, which_all

MAX_DIST_INFOS = 2000
MAX_FILE_BYTES = 4 * 1024 * 1024
DPKG_INFO = "/var/lib/dpkg/info"
DPKG_STATUS = "/var/lib/dpkg/status"
RPM_TIMEOUT = 20.0
UNKNOWN_HOW = "not in a pip RECORD, a conda-meta file, dpkg's file lists or rpm"


def _read(path: str, limit: int = MAX_FILE_BYTES) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return ""


def _headers(text: str) -> dict[str, str]:
    """``Name: x`` lines up to the first blank line (an email-style header block)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and not line.startswith((" ", "\t")):
            out.setdefault(key.strip().lower(), value.strip())
    return out


def _site_dir(path: str) -> str | None:
    d = os.path.dirname(os.path.abspath(path))
    while d and d != os.path.dirname(d):
        if os.path.basename(d) in ("site-packages", "dist-packages"):
            return d
        d = os.path.dirname(d)
    return None


def pip_owner(path: str, sites: Iterable[str] = ()) -> dict[str, Any] | None:
    """The pip distribution whose RECORD lists ``path`` (compared by real path), looked for in the
    ``site-packages`` above it and in ``sites``."""
    real = os.path.realpath(path)
    base = os.path.basename(path)
    roots = [d for d in (_site_dir(path), _site_dir(real), *sites) if d]
    seen = 0
    for site in dict.fromkeys(roots):
        for info in sorted(glob.glob(os.path.join(glob.escape(site), "*.dist-info"))):
            seen += 1
            if seen > MAX_DIST_INFOS:
                return None
            record = _read(os.path.join(info, "RECORD"))
            if base not in record:
                continue
            try:
                rows = list(csv.reader(io.StringIO(record)))
            except csv.Error:
                continue
            if any(row and os.path.basename(row[0]) == base and os.path.realpath(os.path.join(site, row[0])) == real
                   for row in rows):
                meta = _headers(_read(os.path.join(info, "METADATA")))
                name, _sep, version = os.path.basename(info)[: -len(".dist-info")].partition("-")
                return {"manager": "pip", "name": meta.get("name") or name, "version": meta.get("version") or
                        version or None, "how": os.path.join(info, "RECORD")}
    return None


def conda_owner(path: str) -> dict[str, Any] | None:
    """The conda package listing ``path`` in the ``conda-meta`` of the prefix above it."""
    real = os.path.realpath(path)
    d = os.path.dirname(real)
    while d and d != os.path.dirname(d):
        meta = os.path.join(d, "conda-meta")
        if os.path.isdir(meta):
            rel = os.path.relpath(real, d)
            for f in sorted(glob.glob(os.path.join(glob.escape(meta), "*.json")))[:MAX_DIST_INFOS]:
                try:
                    doc = json.loads(_read(f))
                except ValueError:
                    continue
                if isinstance(doc, dict) and rel in (doc.get("files") or []):
                    return {"manager": "conda", "name": doc.get("name"), "version": doc.get("version"), "how": f,
                            "prefix": d}
            return None
        d = os.path.dirname(d)
    return None


def dpkg_owner(path: str, info_dir: str = DPKG_INFO, status: str = DPKG_STATUS) -> dict[str, Any] | None:
    """The dpkg package whose file list names ``path`` (or its real file), with its installed version."""
    wanted = {os.path.abspath(path), os.path.realpath(path)}
    # /lib is a link to /usr/lib on merged-/usr systems: dpkg lists either spelling
    wanted |= {p[4:] if p.startswith("/usr/") else "/usr" + p for p in list(wanted)}
    for lst in sorted(glob.glob(os.path.join(glob.escape(info_dir), "*.list"))):
        if any(line.strip() in wanted for line in _read(lst).splitlines()):
            name = os.path.basename(lst)[:-len(".list")]
            package = name.split(":", 1)[0]
            return {"manager": "dpkg", "name": package, "version": _dpkg_version(package, status), "how": lst}
    return None


def _dpkg_version(package: str, status: str) -> str | None:
    for block in _read(status, 64 * 1024 * 1024).split("\n\n"):
        h = _headers(block)
        if h.get("package") == package and h.get("version"):
            return h["version"]
    return None


def rpm_owner(path: str, env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The RPM package owning ``path`` (``rpm -qf``), where rpm is installed."""
    found = which_all("rpm", (env or {}).get("PATH") or "/usr/bin:/bin:/usr/sbin:/sbin")
    if not found:
        return None
    ev = run([found[0], "-qf", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n", path], timeout=RPM_TIMEOUT,
             label=f"rpm -qf {path}")
    words = (ev.stdout or "").split()
    if ev.exit_code == 0 and len(words) >= 2:
        return {"manager": "rpm", "name": words[0], "version": words[1], "how": f"rpm -qf {path}"}
    return None


def package_of(path: str, sites: Iterable[str] = (), env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The package ``path`` belongs to (pip, then conda, then dpkg, then rpm), or None when none names it."""
    return pip_owner(path, sites) or conda_owner(path) or dpkg_owner(path) or rpm_owner(path, env)


def owner_of(path: str, sites: Iterable[str] = (), env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """:func:`package_of`, or an ``unknown`` owner that says where zdoctor looked."""
    return package_of(path, sites, env) or {"manager": "unknown", "name": None, "version": None, "how": UNKNOWN_HOW}
