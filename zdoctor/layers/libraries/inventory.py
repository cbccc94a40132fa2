"""Every libstdc++.so.6 that matters on this node: where it is, what it provides, which GCC shipped it.

Places looked at: the loader's system dirs and ``ld.so.cache`` entries, each LD_LIBRARY_PATH entry,
LD_PRELOAD entries, the interpreter's prefixes and RPATH/RUNPATH dirs, conda environments (from
CONDA_PREFIX and CONDA_EXE's root, its ``envs/*``), and gcc toolset trees. Each copy is read once (by
real file), and keeps every reason it was found.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.readers.elf import read_elf
from zdoctor.readers.versions import gcc_release_for, gcc_series

LIBSTDCXX = "libstdc++.so.6"
TOOLSET_GLOBS = (
    "/opt/rh/*/root/usr/lib64", "/opt/rh/*/root/usr/lib", "/usr/lib/gcc/*/*", "/usr/lib64/gcc/*/*",
    "/usr/local/lib64", "/usr/local/lib", "/opt/gcc*/lib64", "/opt/gcc*/lib",
)
MAX_CONDA_ENVS = 64


@dataclass
class Copy:
    """One libstdc++ file and what it provides."""

    path: str
    realpath: str
    found_as: list[str] = field(default_factory=list)  # why it is listed: "LD_LIBRARY_PATH entry 1", ...
    glibcxx_max: str | None = None
    cxxabi_max: str | None = None
    gcc_release: str | None = None  # the first GCC release whose libstdc++ has glibcxx_max
    gcc_series: str | None = None  # the GCC releases whose libstdc++ tops out there ("9.3 to 10.x")
    conda_prefix: str | None = None
    error: str | None = None
    versions: list[str] = field(default_factory=list)

    def provides_all(self, needs: Iterable[str]) -> bool:
        have = set(self.versions)
        return self.error is None and all(n in have for n in needs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def conda_prefix_of(path: str) -> str | None:
    """The conda environment a file lives in (its prefix holds ``conda-meta``), if any."""
    d = os.path.dirname(os.path.abspath(path))
    for _ in range(4):
        if os.path.isdir(os.path.join(d, "conda-meta")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return None


def conda_roots(env: Mapping[str, str]) -> list[str]:
    """Conda environment prefixes named by the environment: CONDA_PREFIX, and CONDA_EXE's root + envs."""
    roots: list[str] = []
    for key in ("CONDA_PREFIX", "CONDA_PREFIX_1", "MAMBA_ROOT_PREFIX"):
        if env.get(key):
            roots.append(env[key])
    exe = env.get("CONDA_EXE") or env.get("MAMBA_EXE")
    if exe:
        base = os.path.dirname(os.path.dirname(exe))
        roots.append(base)
        roots.extend(sorted(glob.glob(os.path.join(glob.escape(base), "envs", "*")))[:MAX_CONDA_ENVS])
    out: list[str] = []
    for r in roots:
        if r not in out:
            out.append(r)
    return out


def candidate_dirs(env: Mapping[str, str], *, system_dirs: Iterable[str] = (), interpreter: dict[str, Any] | None
                   = None, toolsets: bool = True) -> list[tuple[str, str]]:
    """(directory, reason) pairs to look for libstdc++ in, most relevant first."""
    out: list[tuple[str, str]] = []
    for i, entry in enumerate(e for e in (env.get("LD_LIBRARY_PATH") or "").replace(";", ":").split(":")):
        if entry:
            out.append((entry, f"LD_LIBRARY_PATH entry {i + 1}"))
    interp = interpreter or {}
    for d in interp.get("rpath_dirs") or []:
        out.append((d, f"RPATH of {interp.get('path')}"))
    for d in interp.get("runpath_dirs") or []:
        out.append((d, f"RUNPATH of {interp.get('path')}"))
    for key in ("prefix", "base_prefix"):
        if interp.get(key):
            out.append((os.path.join(interp[key], "lib"), f"interpreter {key.replace('_', ' ')}"))
    for root in conda_roots(env):
        out.append((os.path.join(root, "lib"), "conda environment"))
    for d in system_dirs:
        out.append((d, "system dir"))
    if toolsets:
        for pattern in TOOLSET_GLOBS:
            for d in sorted(glob.glob(pattern)):
                out.append((d, "gcc toolset"))
    return out


def take_inventory(env: Mapping[str, str], *, system_dirs: Iterable[str] = (),
                   cache_paths: Iterable[str] = (), interpreter: dict[str, Any] | None = None,
                   extra: Iterable[tuple[str, str]] = (), toolsets: bool = True) -> list[Copy]:
    """Every distinct libstdc++.so.6 reachable from the places above, with what it provides."""
    found: list[tuple[str, str]] = []
    for path, reason in extra:
        found.append((path, reason))
    for entry in (env.get("LD_PRELOAD") or "").replace(":", " ").split():
        if os.path.basename(entry).startswith("libstdc++.so"):
            found.append((entry, "LD_PRELOAD"))
    for d, reason in candidate_dirs(env, system_dirs=system_dirs, interpreter=interpreter, toolsets=toolsets):
        found.append((os.path.join(d, LIBSTDCXX), reason))
    for p in cache_paths:
        found.append((p, "ld.so.cache"))
    copies: dict[str, Copy] = {}
    for path, reason in found:
        if not os.path.isfile(path):
            continue
        real = os.path.realpath(path)
        copy = copies.get(real)
        if copy is None:
            copy = describe_copy(path)
            copies[real] = copy
        if reason not in copy.found_as:
            copy.found_as.append(reason)
    return list(copies.values())


def describe_copy(path: str) -> Copy:
    """Read one libstdc++ file: its newest GLIBCXX/CXXABI, the GCC release that shipped it."""
    info = read_elf(path)
    copy = Copy(path=path, realpath=os.path.realpath(path), conda_prefix=conda_prefix_of(os.path.realpath(path)))
    if not info.ok:
        copy.error = info.error
        return copy
    copy.versions = list(info.verdef or [])
    copy.glibcxx_max = info.newest("GLIBCXX")
    copy.cxxabi_max = info.newest("CXXABI")
    copy.gcc_release = gcc_release_for(copy.glibcxx_max) if copy.glibcxx_max else None
    copy.gcc_series = gcc_series(copy.glibcxx_max)
    return copy
