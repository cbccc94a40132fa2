"""The index of message templates in a training environment's installed code, built once and cached.

Each top-level package of a site-packages folder is indexed on its own (its ``.py`` files' message sites,
its shared libraries' printf format strings) and cached in zdoctor's cache folder under a key made of the
package's real path, its distribution's version and the modification times of its folder and its
distribution's ``RECORD``: a package that changes is indexed again, the others are read back. Building is
bounded: files above :data:`MAX_PY_BYTES` / :data:`MAX_RODATA_BYTES` are skipped, each package reads at
most :data:`MAX_FILES` files, and the whole build stops at its time budget (what it did not reach is named).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import stat
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from zdoctor.proc.userfile import open_regular, read_prefix
from zdoctor.symptoms.origin_templates import (
    MIN_LITERAL,
    literal_chars,
    printf_template,
    python_sites,
    resolve_constants,
)

#: Bump when the cached record's shape changes.
INDEX_VERSION = 3
MAX_PY_BYTES = 2 * 1024 * 1024
MAX_FILES = 6000
MAX_RODATA_BYTES = 96 * 1024 * 1024
MAX_LIBRARY_STRINGS = 60000
#: Folders of test code, never where a training job's message comes from.
SKIP_DIRS = frozenset({"tests", "test", "testing", "__pycache__", "benchmarks", "examples"})
#: Indexed first: the packages a ZeRO-3 training job's messages come from.
FIRST = ("deepspeed", "torch", "accelerate", "transformers", "nvidia", "triton", "apex", "peft", "bitsandbytes")
#: A printable run in a library's read-only data that may be a message.
RODATA_STRING = re.compile(rb"[\x20-\x7e\t]{16,}")
LIBRARY_NAME = re.compile(r"^lib[\w.+-]*\.so(\.[\d.]+)?$")


def cache_root() -> str:
    """zdoctor's cache folder: ``$ZDOCTOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/zdoctor``, else ``.cache/zdoctor``
    in the current user's home from the password database (never ``$HOME``: root started with another
    user's ``HOME`` must not write there). A relative value is ignored, as the XDG spec says."""
    own = os.environ.get("ZDOCTOR_CACHE_DIR", "")
    if own and os.path.isabs(own):
        return own
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not (base and os.path.isabs(base)):
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = "/nonexistent"
        base = os.path.join(home, ".cache")
    return os.path.join(base, "zdoctor")


def _private_dir(path: str) -> bool:
    """Create ``path`` (mode 0700) when missing, only below an existing folder of the current user other than
    ``/``; whether it is then a real folder of the current user (no link, no one else's)."""
    probe = path
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.lstat(probe)
        if probe != path and (probe == "/" or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()):
            return False
        os.makedirs(path, 0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


@dataclass
class PackageIndex:
    """One package's message sites: ``sites`` (Python) and ``strings`` (libraries), paths relative to its
    site-packages folder."""

    name: str
    version: str
    sites: list[dict[str, Any]] = field(default_factory=list)
    strings: list[dict[str, Any]] = field(default_factory=list)
    files: int = 0
    bytes_read: int = 0
    cut: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"v": INDEX_VERSION, "name": self.name, "version": self.version, "sites": self.sites,
                "strings": self.strings, "files": self.files, "bytes_read": self.bytes_read, "cut": self.cut}


def distributions(site: str) -> dict[str, tuple[str, str]]:
    """``{top-level name or namespace/name: (version, RECORD path)}`` of the distributions in ``site``."""
    out: dict[str, tuple[str, str]] = {}
    try:
        names = os.listdir(site)
    except OSError:
        return out
    for d in names:
        if not d.endswith(".dist-info"):
            continue
        version = d[:-len(".dist-info")].rpartition("-")[2]
        record = os.path.join(site, d, "RECORD")
        try:
            raw, _cut = read_prefix(record, 16 * 1024 * 1024)
        except OSError:
            continue
        for line in raw.decode("utf-8", "replace").splitlines():
            parts = line.split(",", 1)[0].split("/")
            if len(parts) < 2 or parts[0].endswith((".dist-info", ".data")) or parts[0] == "..":
                continue
            out.setdefault(parts[0], (version, record))
            out.setdefault("/".join(parts[:2]), (version, record))
    return out


def _key(path: str, version: str, record: str) -> str:
    stamps = []
    for p in (path, record):
        try:
            stamps.append(str(os.stat(p).st_mtime_ns))
        except OSError:
            stamps.append("-")
    raw = "\0".join([str(INDEX_VERSION), os.path.realpath(path), version, *stamps])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _walk(top: str, deadline: float):
    """``(path, is_library)`` of the package's ``.py`` files and shared libraries, no links followed."""
    stack = [top]
    while stack:
        if time.monotonic() > deadline:
            return
        d = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.name not in SKIP_DIRS:
                        stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    if e.name.endswith(".py"):
                        yield e.path, False
                    elif LIBRARY_NAME.match(e.name):
                        yield e.path, True
            except OSError:
                continue


def library_strings(path: str) -> tuple[list[dict[str, Any]], int, str]:
    """The message-like strings of ``path``'s ``.rodata``: printf formats with enough literal text, as
    templates. Returns (strings, bytes read, why it was cut or "")."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        with open_regular(path) as fh:
            elf = ELFFile(fh)
            sec = elf.get_section_by_name(".rodata")
            if sec is None:
                return [], 0, ""
            if sec["sh_size"] > MAX_RODATA_BYTES:
                return [], 0, f".rodata of {sec['sh_size']} bytes is above the cap"
            fh.seek(sec["sh_offset"])
            data = fh.read(sec["sh_size"])
    except (OSError, ELFError, ValueError) as exc:
        return [], 0, f"not read: {exc}"
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for m in RODATA_STRING.finditer(data):
        text = m.group().decode("ascii").strip()
        if text in seen or " " not in text:
            continue
        t = printf_template(text)
        if None not in t and not re.search(r"(?i)error|fail|cannot|unable|invalid|not |no |unsupported", text):
            continue
        if literal_chars(t) < MIN_LITERAL:
            continue
        seen.add(text)
        out.append({"offset": m.start(), "template": t})
        if len(out) >= MAX_LIBRARY_STRINGS:
            return out, len(data), f"more than {MAX_LIBRARY_STRINGS} strings"
    return out, len(data), ""


def build_package(site: str, name: str, version: str, deadline: float) -> PackageIndex:
    """Index one top-level package (a folder, a single module, or a library) of ``site``."""
    top = os.path.join(site, name)
    idx = PackageIndex(name, version)
    constants: dict[str, set[str]] = {}
    items = _walk(top, deadline) if os.path.isdir(top) else iter([(top, not top.endswith(".py"))])
    for path, is_lib in items:
        if idx.files >= MAX_FILES:
            idx.cut = f"stopped at {MAX_FILES} files"
            break
        if time.monotonic() > deadline:
            idx.cut = "the time budget ran out"
            break
        rel = os.path.relpath(path, site)
        if is_lib:
            found, n, why = library_strings(path)
            idx.files += 1
            idx.bytes_read += n
            for s in found:
                s["file"] = rel
            idx.strings += found
            continue
        try:
            raw, cut = read_prefix(path, MAX_PY_BYTES)
        except OSError:
            continue
        idx.files += 1
        idx.bytes_read += len(raw)
        if cut:
            continue
        sites, names = python_sites(raw.decode("utf-8", "replace"))
        for s in sites:
            s["file"] = rel
            idx.sites.append(s)
        for name, value in names.items():
            constants.setdefault(name, set()).add(value)
    resolve_constants(idx.sites, constants)
    return idx


def _read_cached(path: str) -> PackageIndex | None:
    try:
        raw, cut = read_prefix(path, 512 * 1024 * 1024)
        d = json.loads(raw)
    except (OSError, ValueError):
        return None
    if cut or not isinstance(d, dict) or d.get("v") != INDEX_VERSION or d.get("cut"):
        return None
    return PackageIndex(str(d.get("name")), str(d.get("version")), list(d.get("sites") or []),
                        list(d.get("strings") or []), int(d.get("files") or 0), int(d.get("bytes_read") or 0))


def _write_cached(folder: str, path: str, idx: PackageIndex) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "w") as fh:
            json.dump(idx.to_dict(), fh, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        return


def top_level(site: str) -> list[str]:
    """The top-level packages, modules and libraries of ``site``, the :data:`FIRST` ones first."""
    try:
        names = os.listdir(site)
    except OSError:
        return []
    keep = [n for n in names if not n.startswith((".", "_")) and not n.endswith((".dist-info", ".egg-info", ".pth"))
            and n not in ("__pycache__", "bin") and (os.path.isdir(os.path.join(site, n)) or n.endswith(".py"))]
    rank = {n: i for i, n in enumerate(FIRST)}
    return sorted(keep, key=lambda n: (rank.get(n, len(FIRST)), n))


@dataclass
class EnvIndex:
    """The indexes of every package reached, and what the build did."""

    packages: dict[str, tuple[str, PackageIndex]] = field(default_factory=dict)
    from_cache: int = 0
    built: int = 0
    seconds: float = 0.0
    not_indexed: list[str] = field(default_factory=list)
    cache: str = ""

    def summary(self) -> dict[str, Any]:
        return {"packages": len(self.packages), "from_cache": self.from_cache, "built": self.built,
                "seconds": round(self.seconds, 2), "not_indexed": self.not_indexed, "cache": self.cache,
                "sites": sum(len(p.sites) for _s, p in self.packages.values()),
                "library_strings": sum(len(p.strings) for _s, p in self.packages.values())}


def index_env(sites: list[str], budget: float = 90.0, names: Collection[str] | None = None) -> EnvIndex:
    """Every package of the ``sites`` folders (only those ``names`` when given), read back from the cache or
    built within ``budget`` seconds."""
    start = time.monotonic()
    deadline = start + budget
    out = EnvIndex()
    folder = os.path.join(cache_root(), "origins")
    writable = _private_dir(folder)
    out.cache = folder if writable else ""
    for site in sites:
        late: list[str] = []
        dists = distributions(site)
        for name in top_level(site):
            if names is not None and name not in names:
                continue
            version, record = dists.get(name, dists.get(name[:-3] if name.endswith(".py") else name, ("", "")))
            key = f"{site}::{name}"
            path = os.path.join(folder, _key(os.path.join(site, name), version, record) + ".json")
            cached = _read_cached(path) if writable else None
            if cached is not None:
                out.packages[key] = (site, cached)
                out.from_cache += 1
                continue
            if time.monotonic() > deadline:
                late.append(name)
                continue
            idx = build_package(site, name, version, deadline)
            out.packages[key] = (site, idx)
            out.built += 1
            if idx.cut:
                out.not_indexed.append(f"{name} ({site}): part only, {idx.cut}")
            elif writable:
                _write_cached(folder, path, idx)
        if late:
            out.not_indexed.append(f"{len(late)} packages of {site}, not reached in the time budget of {budget:.0f} s "
                                   f"(a later run continues): {', '.join(late[:12])}{' ...' if len(late) > 12 else ''}")
    out.seconds = time.monotonic() - start
    return out
