"""How CUDA's libraries are looked up: libcuda by the loader, by triton and by the linker; the CUDA sonames
each extension needs.

Three lookups find the driver library by different names, and a node can satisfy one and fail another:

- the loader (and ``dlopen("libcuda.so.1")`` in torch, triton and the CUDA runtime) asks for the SONAME
  ``libcuda.so.1``: LD_LIBRARY_PATH, the ld.so cache, the default directories;
- triton runs ``/sbin/ldconfig -p`` and keeps the directories of the lines naming libcuda (which name it
  looks for, and which file it then requires in those directories, changed across triton releases: the
  rule is read from the installed triton's own source, :func:`triton_rule`);
- the linker (``-lcuda``: triton's launcher build, a JIT op) wants the *unversioned* ``libcuda.so`` (or
  ``libcuda.a``) in a ``-L`` directory or in the compiler's library search path; GNU ld never reads the
  ld.so cache for ``-l``.

Everything here is pure: paths come in as parameters, so tests point them at files they built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zdoctor.layers.cuda_lookup.rules import CUDA_FAMILIES, MAJOR_IS_CUDA, TRITON_FILES
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.ldcache import X86_64_FLAGS, CacheEntry

LIBCUDA = "libcuda.so.1"
LIBCUDA_DEV = "libcuda.so"

_SONAME = re.compile(r"^(?P<family>lib[\w+-]+?)\.so\.(?P<major>\d+)(?:\.[\d.]+)?$")


# --------------------------------------------------------------------------------------------- names
def cuda_soname(name: str) -> dict[str, Any] | None:
    """``libcudart.so.11.0`` -> ``{"soname", "family": "libcudart", "major": 11, "is_cuda_major": True}``;
    None for a library that is not one of CUDA's."""
    m = _SONAME.match(os.path.basename(name))
    if not m:
        return None
    family = m.group("family")
    base = family.split("_")[0] if family.startswith(("libcudnn_", "libnpp")) else family
    if base not in CUDA_FAMILIES and not family.startswith(("libcudnn", "libnpp")):
        return None
    return {"soname": os.path.basename(name), "family": family, "major": int(m.group("major")),
            "is_cuda_major": family in MAJOR_IS_CUDA}


def cuda_major(version: str | None) -> int | None:
    """``"12.8"`` -> 12; None for a CPU torch (no CUDA version) or an unreadable one."""
    m = re.match(r"\s*(\d+)(?:\.\d+)*\s*$", str(version or ""))
    return int(m.group(1)) if m else None


def is_stub_path(path: str | None) -> bool:
    """Whether ``path`` (or the file it links to) lies in a toolkit's ``stubs`` directory."""
    if not path:
        return False
    return any("stubs" in os.path.normpath(p).split(os.sep)[:-1] for p in (path, os.path.realpath(path)))


# --------------------------------------------------------------------------------------------- the cache
def cache_libcuda(entries: Iterable[CacheEntry]) -> dict[str, list[str]]:
    """The 64-bit ld.so cache entries for ``libcuda.so.1`` and ``libcuda.so``: name -> paths, in file order."""
    out: dict[str, list[str]] = {LIBCUDA: [], LIBCUDA_DEV: []}
    for e in entries:
        if e.soname in out and e.flags == X86_64_FLAGS and e.path not in out[e.soname]:
            out[e.soname].append(e.path)
    return out


_LDCONFIG_LINE = re.compile(r"^\s+(?P<name>\S+) \((?P<kind>[^)]*)\) => (?P<path>.+?)\s*$")


def parse_ldconfig_p(text: str) -> list[dict[str, str]]:
    """``ldconfig -p``'s entry lines as ``{name, kind, path, line}`` (the count and generator lines skipped)."""
    out = []
    for line in (text or "").splitlines():
        m = _LDCONFIG_LINE.match(line)
        if m:
            out.append({**m.groupdict(), "line": line})
    return out


# --------------------------------------------------------------------------------------------- the files
def driver_dirs(dirs: Sequence[str], cache: Mapping[str, list[str]], env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Each directory that holds a ``libcuda.so.1`` or ``libcuda.so``: the usual places, the cache's and
    LD_LIBRARY_PATH's directories. Per directory: which of the two files exist, where each leads, whether
    the directory is one the cache names, and whether it is a toolkit's stubs directory."""
    in_cache = {os.path.dirname(p) for paths in cache.values() for p in paths}
    llp = [e for e in (env.get("LD_LIBRARY_PATH") or "").replace(";", ":").split(":") if e]
    order = list(dict.fromkeys([*(os.path.normpath(d) for d in dirs), *sorted(in_cache),
                                *(os.path.normpath(e) for e in llp)]))
    out = []
    seen_real: set[str] = set()
    for d in order:
        real = os.path.realpath(d)
        files = {}
        for name in (LIBCUDA, LIBCUDA_DEV):
            p = os.path.join(d, name)
            if os.path.lexists(p):
                files[name] = {"path": p, "exists": os.path.exists(p), "realpath": os.path.realpath(p),
                               "link": os.readlink(p) if os.path.islink(p) else None}
        if not files or real in seen_real:
            continue
        seen_real.add(real)
        out.append({"dir": d, "files": files, "in_cache": d in in_cache or real in {os.path.realpath(x)
                                                                                    for x in in_cache},
                    "on_ld_library_path": d in {os.path.normpath(e) for e in llp},
                    "stubs": is_stub_path(os.path.join(d, "x")), "owner_uid": _owner(d)})
    return out


def _owner(path: str) -> int | None:
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def stubs_dirs(cuda_homes: Iterable[str]) -> list[str]:
    """The toolkit stubs directories that hold a ``libcuda.so`` (``lib64/stubs``, ``targets/*/lib/stubs``)."""
    out: list[str] = []
    for home in cuda_homes:
        for sub in ("lib64/stubs", "lib/stubs", "targets/x86_64-linux/lib/stubs", "targets/sbsa-linux/lib/stubs"):
            d = os.path.join(home, sub)
            if os.path.isfile(os.path.join(d, LIBCUDA_DEV)) and os.path.realpath(d) not in map(os.path.realpath, out):
                out.append(d)
    return out


def linker_finds(name: str, dirs: Sequence[str]) -> str | None:
    """The file ``-l<name>`` links against: ``lib<name>.so`` then ``lib<name>.a`` in each directory in order
    (GNU ld's search; the ld.so cache plays no part)."""
    for d in dirs:
        for suffix in (".so", ".a"):
            p = os.path.join(d, f"lib{name}{suffix}")
            if os.path.isfile(p):
                return p
    return None


def parse_search_dirs(text: str) -> list[str]:
    """The ``libraries: =a:b`` line of ``gcc -print-search-dirs``, normalised, existing order kept."""
    for line in (text or "").splitlines():
        if line.startswith("libraries:"):
            value = line.split(":", 1)[1].strip().lstrip("=")
            return list(dict.fromkeys(os.path.normpath(d) for d in value.split(":") if d))
    return []


# --------------------------------------------------------------------------------------------- triton
_T_SEARCH = re.compile(r"""for\s+line\s+in\s+libs\.splitlines\(\)\s+if\s+"""
                       r"""['"](?P<name>libcuda\.so[.\d]*)['"]\s+in\s+line""")
_T_REQUIRE = re.compile(r"""os\.path\.join\(\s*path\s*,\s*['"](?P<name>libcuda\.so[.\d]*)['"]\s*\)\)"""
                        r"""\s*for\s+path\s+in\s+dirs""")
_T_LIBRARIES = re.compile(r"""^libraries\s*=\s*\[(?P<list>[^\]]*)\]""", re.M)


def triton_rule(sources: Mapping[str, str]) -> dict[str, Any]:
    """What the installed triton's libcuda lookup does, read from its own files (``relpath -> text``):
    ``search`` (the name a ``ldconfig -p`` line must contain), ``require`` (the file that must exist in a
    found directory), ``env_override`` (TRITON_LIBCUDA_PATH honoured), ``ld_library_path`` (the fallback),
    ``link`` (the ``-l`` argument of its launcher build: ``cuda`` needs the unversioned libcuda.so), ``file``.
    ``state`` is ``read`` or ``unknown`` (no file of the lookup found; the other keys are then None)."""
    for rel in TRITON_FILES[:2]:
        text = sources.get(rel)
        if not text:
            continue
        search, require = _T_SEARCH.search(text), _T_REQUIRE.search(text)
        if not search or not require:
            continue
        libs = _T_LIBRARIES.search(text)
        link = None
        if libs:
            names = re.findall(r"""['"]([^'"]+)['"]""", libs.group("list"))
            link = names[0] if names else None
        elif "-lcuda" in text:
            link = "cuda"
        return {"state": "read", "file": rel, "search": search.group("name"), "require": require.group("name"),
                "env_override": "TRITON_LIBCUDA_PATH" in text or "libcuda_path" in text,
                "ld_library_path": "LD_LIBRARY_PATH" in text, "link": link}
    return {"state": "unknown", "file": None, "search": None, "require": None, "env_override": None,
            "ld_library_path": None, "link": None}


def read_triton_sources(triton_dir: str) -> dict[str, str]:
    """The files :func:`triton_rule` reads, from an installed triton package directory."""
    out = {}
    for rel in TRITON_FILES:
        try:
            with open_regular_text(os.path.join(triton_dir, rel), encoding="utf-8", errors="replace") as fh:
                out[rel] = fh.read(400_000)
        except OSError:
            continue
    return out


def triton_dirs(rule: Mapping[str, Any], ldconfig_lines: Sequence[Mapping[str, str]],
                env: Mapping[str, str]) -> dict[str, Any]:
    """triton's ``libcuda_dirs()`` for ``rule``: ``{"dirs", "error", "via", "locs"}``; ``error`` is the
    assertion text triton raises (None when the lookup passes)."""
    if rule.get("env_override") and env.get("TRITON_LIBCUDA_PATH"):
        return {"dirs": [env["TRITON_LIBCUDA_PATH"]], "error": None, "via": "TRITON_LIBCUDA_PATH", "locs": []}
    search, require = str(rule.get("search")), str(rule.get("require"))
    locs = [ln["line"].split()[-1] for ln in ldconfig_lines if search in ln["line"]]
    dirs = [os.path.dirname(p) for p in locs]
    via = "ldconfig -p"
    llp = env.get("LD_LIBRARY_PATH")
    if rule.get("ld_library_path") and llp and not dirs:
        dirs = [d for d in llp.split(":") if os.path.exists(os.path.join(d, require))]
        via = "LD_LIBRARY_PATH"
    if any(os.path.exists(os.path.join(d, require)) for d in dirs):
        return {"dirs": dirs, "error": None, "via": via, "locs": locs}
    msg = "libcuda.so cannot found!\n"
    if locs:
        msg += f"Possible files are located at {locs!s}.Please create a symlink of libcuda.so to any of the files."
    else:
        msg += ('Please make sure GPU is set up and then run "/sbin/ldconfig" (requires sudo) to refresh the '
                'linker cache.')
    return {"dirs": dirs, "error": msg, "via": via, "locs": locs}


# --------------------------------------------------------------------------------------------- wheels
def wheel_libraries(site_dirs: Iterable[str]) -> dict[str, str]:
    """CUDA sonames the ``nvidia-*`` wheels provide (``site-packages/nvidia/<pkg>/lib/lib*.so.N``): soname ->
    path."""
    out: dict[str, str] = {}
    for site in site_dirs:
        root = os.path.join(site, "nvidia")
        try:
            pkgs = sorted(os.listdir(root))
        except OSError:
            continue
        for pkg in pkgs[:64]:
            lib = os.path.join(root, pkg, "lib")
            try:
                names = sorted(os.listdir(lib))
            except OSError:
                continue
            for n in names[:256]:
                if cuda_soname(n) is not None:
                    out.setdefault(n, os.path.join(lib, n))
    return out


# --------------------------------------------------------------------------------------------- verdicts
def has_driver(facts: Mapping[str, Any]) -> bool:
    """Whether the node has a driver libcuda.so.1 anywhere zdoctor looks (the cache or a driver directory),
    a toolkit stub not counted."""
    cache = facts.get("cache") or {}
    if any(not is_stub_path(p) for p in cache.get(LIBCUDA) or []):
        return True
    return any((d.get("files") or {}).get(LIBCUDA, {}).get("exists") and not d.get("stubs")
               for d in facts.get("driver_dirs") or [])


def uncached_driver_dirs(facts: Mapping[str, Any]) -> list[str]:
    """Driver directories holding libcuda.so.1 that the ld cache does not name (stubs not counted)."""
    cache = facts.get("cache") or {}
    if any(not is_stub_path(p) for p in cache.get(LIBCUDA) or []):
        return []
    return [d["dir"] for d in facts.get("driver_dirs") or []
            if (d.get("files") or {}).get(LIBCUDA, {}).get("exists") and not d.get("in_cache") and not d.get("stubs")]


def lookup_problems(facts: Mapping[str, Any]) -> dict[str, Any]:
    """What fails, from the probe's facts: ``stub`` (the loader picks a stub libcuda.so.1; ``stub_dev``: only
    for the unversioned libcuda.so some libraries dlopen), ``triton`` (its
    lookup raises), ``link`` (``-lcuda`` finds no file), ``uncached`` (driver dirs the cache does not name),
    ``driver`` (a driver library exists at all)."""
    loader = facts.get("loader") or {}
    triton = facts.get("triton") or {}
    rule = triton.get("rule") or {}
    lookup = triton.get("lookup") or {}
    link = facts.get("link") or {}
    links_cuda = bool(triton.get("installed")) and rule.get("link") == "cuda"
    dev = facts.get("loader_dev") or {}
    return {"driver": has_driver(facts), "stub": bool(loader.get("stub")),
            "stub_dev": bool(dev.get("stub")) and not loader.get("stub"),
            "triton": bool(lookup.get("error")), "link": links_cuda and not lookup.get("error")
            and not link.get("finds") and not link.get("error"),
            "links_cuda": links_cuda, "uncached": uncached_driver_dirs(facts)}
