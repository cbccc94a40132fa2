"""Which installed package a library file belongs to, and its release, from the package metadata on disk.

pip: the ``*.dist-info`` of the ``site-packages`` directory above the file whose ``RECORD`` lists it
(``Name`` and ``Version`` from its ``METADATA``). dpkg: the ``/var/lib/dpkg/info/*.list`` naming the file,
its ``Version`` from ``/var/lib/dpkg/status``. Every read is bounded; nothing here raises.
"""

from __future__ import annotations

import glob
import os
from typing import Any

MAX_DIST_INFOS = 2000
MAX_FILE_BYTES = 4 * 1024 * 1024
DPKG_INFO = "/var/lib/dpkg/info"
DPKG_STATUS = "/var/lib/dpkg/status"


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


def pip_owner(path: str) -> dict[str, Any] | None:
    """The pip distribution whose RECORD lists ``path`` (by its path as given or its real file)."""
    site = _site_dir(path)
    if site is None:
        return None
    wanted = {os.path.relpath(os.path.abspath(path), site), os.path.relpath(os.path.realpath(path), site)}
    for info in sorted(glob.glob(os.path.join(glob.escape(site), "*.dist-info")))[:MAX_DIST_INFOS]:
        record = _read(os.path.join(info, "RECORD"))
        if any(line.split(",", 1)[0] in wanted for line in record.splitlines()):
            meta = _headers(_read(os.path.join(info, "METADATA")))
            return {"manager": "pip", "name": meta.get("name"), "version": meta.get("version"),
                    "metadata": os.path.join(info, "METADATA")}
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
            return {"manager": "dpkg", "name": package, "version": _dpkg_version(package, status),
                    "metadata": lst}
    return None


def _dpkg_version(package: str, status: str) -> str | None:
    for block in _read(status, 64 * 1024 * 1024).split("\n\n"):
        h = _headers(block)
        if h.get("package") == package and h.get("version"):
            return h["version"]
    return None


def package_of(path: str) -> dict[str, Any] | None:
    """The package ``path`` belongs to (pip first, then dpkg), or None when no metadata names it."""
    return pip_owner(path) or dpkg_owner(path)
