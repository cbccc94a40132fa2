"""Every libnccl.so.2 the training could load, with its version, and the NCCL torch was built to use.

Providers: pip wheels (``nvidia-nccl-cu12`` / ``-cu13`` install ``<site>/nvidia/nccl/lib/libnccl.so.2``: both
wheels own the same file, so the one installed last wins and removing either deletes it), conda's
``$CONDA_PREFIX/lib``, directories on ``LD_LIBRARY_PATH``, ``LD_PRELOAD`` entries and the system copy
``ld.so.cache`` names. Versions come from the wheel's dist-info (and its RECORD, whose size for the
library tells which wheel's copy is on disk) or from the real file name (``libnccl.so.2.28.3``); the
symbol table of a 200-300 MB library is never read. torch's expectation comes from its own metadata
(``Requires-Dist: nvidia-nccl-cu13==2.28.9``) and ``torch.cuda.nccl.version()``.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.proc.userfile import open_regular_text

NCCL_SONAME = "libnccl.so.2"
WHEEL_LIB = os.path.join("nvidia", "nccl", "lib", NCCL_SONAME)
_FILE_VERSION = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
_WHEEL_DIR = re.compile(r"^nvidia_nccl_cu(\d+)-(\d+(?:\.\d+)+)[^/]*\.dist-info$")
_REQUIRES = re.compile(r"^Requires-Dist:\s*(nvidia-nccl-cu(\d+))\s*==\s*([0-9.]+)", re.MULTILINE | re.IGNORECASE)


def version_from_filename(path: str) -> str | None:
    """``/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.3`` -> ``"2.28.3"``."""
    m = _FILE_VERSION.match(os.path.basename(path))
    return m.group(1) if m else None


def version_str(code: Any) -> str | None:
    """torch.cuda.nccl.version(): ``(2, 28, 9)`` / ``[2, 28, 9]`` / ``22809`` / ``2708`` -> ``"2.28.9"``."""
    if isinstance(code, (list, tuple)) and len(code) >= 3 and all(isinstance(p, int) for p in code[:3]):
        return ".".join(str(p) for p in code[:3])
    if isinstance(code, int) and not isinstance(code, bool) and code > 0:
        if code >= 10000:  # NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch
            return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"
        return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"
    if isinstance(code, str) and re.fullmatch(r"\d+\.\d+\.\d+", code.strip()):
        return code.strip()
    return None


def vtuple(version: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version or ""))


def site_dirs(sys_path: Iterable[str]) -> list[str]:
    """The site-packages / dist-packages directories on an interpreter's sys.path, in order."""
    out = []
    for p in sys_path or []:
        if p and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages") and p not in out:
            out.append(p)
    return out


def _record_size(dist_info: str) -> int | None:
    """The size RECORD lists for ``nvidia/nccl/lib/libnccl.so.2`` (None when not listed)."""
    try:
        with open_regular_text(os.path.join(dist_info, "RECORD"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.rstrip("\n").rsplit(",", 2)
                if len(parts) == 3 and parts[0].replace("\\", "/") == "nvidia/nccl/lib/libnccl.so.2":
                    return int(parts[2]) if parts[2].isdigit() else None
    except OSError:
        return None
    return None


def wheels(sites: Iterable[str]) -> list[dict[str, Any]]:
    """Installed ``nvidia-nccl-cuXX`` wheels: dist, version, cuda_major, site, dist_info, record_size."""
    out = []
    for site in sites:
        try:
            names = sorted(os.listdir(site))
        except OSError:
            continue
        for name in names:
            m = _WHEEL_DIR.match(name)
            if m:
                di = os.path.join(site, name)
                out.append({"dist": f"nvidia-nccl-cu{m.group(1)}", "version": m.group(2),
                            "cuda_major": int(m.group(1)), "site": site, "dist_info": di,
                            "record_size": _record_size(di)})
    return out


def torch_requirement(torch_location: str | None) -> dict[str, Any] | None:
    """The NCCL wheel torch's metadata pins (``{"dist": "nvidia-nccl-cu13", "version": "2.28.9",
    "cuda_major": 13, "metadata": path}``), or None (a source build or a conda torch pins none)."""
    if not torch_location:
        return None
    parent = os.path.dirname(torch_location.rstrip("/"))
    for meta in sorted(glob.glob(os.path.join(glob.escape(parent), "torch-*.dist-info", "METADATA"))):
        try:
            with open_regular_text(meta, encoding="utf-8", errors="replace") as fh:
                text = fh.read(512 * 1024)
        except OSError:
            continue
        m = _REQUIRES.search(text)
        if m:
            return {"dist": m.group(1).lower(), "version": m.group(3), "cuda_major": int(m.group(2)),
                    "metadata": meta}
        return {"dist": None, "version": None, "cuda_major": None, "metadata": meta}
    return None


def _provider(path: str, kind: str, via: str) -> dict[str, Any]:
    real = os.path.realpath(path)
    try:
        size = os.stat(real).st_size
    except OSError:
        size = None
    version = version_from_filename(real) or version_from_filename(path)
    return {"path": path, "realpath": real, "kind": kind, "via": via, "size": size, "version": version,
            "version_source": "file name" if version else None, "dist": None, "soname": None, "elf_error": None,
            "loaded": False}


def find_providers(env: Mapping[str, str], sites: Iterable[str], cache_paths: Iterable[str],
                   loaded: Iterable[str] = ()) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(providers, wheels): every libnccl.so.2 reachable from ``env`` and ``sites``, deduplicated by real file.

    ``cache_paths`` are the ld.so.cache entries for libnccl.so.2; ``loaded`` are the paths a live import
    of torch really mapped (first-loaded wins for the rest of the process).
    """
    found: list[dict[str, Any]] = []
    sites = list(sites)
    whl = wheels(sites)
    for path in (p for p in (env.get("LD_PRELOAD") or "").replace(":", " ").split() if "libnccl" in p):
        found.append(_provider(path, "preload", "LD_PRELOAD"))
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        cand = os.path.join(d, NCCL_SONAME) if d else ""
        if cand and os.path.exists(cand):
            found.append(_provider(cand, "ld_library_path", f"LD_LIBRARY_PATH entry {d}"))
    for site in sites:
        cand = os.path.join(site, WHEEL_LIB)
        if os.path.exists(cand):
            p = _provider(cand, "pip", f"wheel in {site}")
            mine = [w for w in whl if w["site"] == site]
            owner = [w for w in mine if w["record_size"] is not None and w["record_size"] == p["size"]]
            pick = owner[0] if len(owner) == 1 else mine[0] if len(mine) == 1 else None
            if pick is not None:
                p.update(dist=pick["dist"], version=pick["version"], version_source=f"{pick['dist']} dist-info")
            found.append(p)
    conda = env.get("CONDA_PREFIX")
    if conda:
        cand = os.path.join(conda, "lib", NCCL_SONAME)
        if os.path.exists(cand):
            found.append(_provider(cand, "conda", f"conda env {conda}"))
    for path in cache_paths:
        if os.path.exists(path):  # a stale cache entry is skipped by ld.so too
            found.append(_provider(path, "system", "ld.so.cache"))
    for path in loaded:
        if not any(os.path.realpath(path) == f["realpath"] for f in found):
            found.append(_provider(path, "other", "mapped by the torch import"))
    out: list[dict[str, Any]] = []
    for f in found:
        same = next((o for o in out if o["realpath"] == f["realpath"]), None)
        if same is not None:
            same.setdefault("also", []).append(f["via"])
            continue
        out.append(f)
    real_loaded = {os.path.realpath(p) for p in loaded}
    for f in out:
        f["loaded"] = f["realpath"] in real_loaded
    return out, whl


def fill_elf(providers: list[dict[str, Any]]) -> None:
    """Check each provider is a loadable ELF and record its SONAME (dynamic section only, cached)."""
    from zdoctor.readers.elf import read_elf

    for p in providers:
        info = read_elf(p["realpath"])
        p["soname"] = info.soname
        p["elf_error"] = info.error


# -- recorded readelf output ----------------------------------------------------------------------------

_DYN = re.compile(r"^\s*0x[0-9a-f]+\s+\((\w+)\)\s+(.*)$")


def parse_readelf_dynamic(text: str) -> list[dict[str, Any]]:
    """Each ``Dynamic section`` of recorded ``readelf -d`` output: soname, needed, rpath, runpath."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in (text or "").splitlines():
        if line.startswith("Dynamic section at offset"):
            cur = {"soname": None, "needed": [], "rpath": None, "runpath": None}
            out.append(cur)
            continue
        m = _DYN.match(line)
        if cur is None or not m:
            continue
        tag, value = m.group(1), m.group(2)
        inner = re.search(r"\[(.*)\]", value)
        val = inner.group(1) if inner else value.strip()
        if tag == "NEEDED":
            cur["needed"].append(val)
        elif tag == "SONAME":
            cur["soname"] = val
        elif tag == "RPATH":
            cur["rpath"] = val
        elif tag == "RUNPATH":
            cur["runpath"] = val
    return out


# -- analysis -------------------------------------------------------------------------------------------


def analyze(facts: dict[str, Any]) -> dict[str, Any]:
    """Judge the ``nccl`` probe facts: ``status`` ok | warn | fail | skip and the ``problems`` found.

    - fail: the loaded NCCL is older than the one torch's metadata pins (symbols torch calls, such as
      ncclCommRegister, are missing: ``undefined symbol``); or the torch import itself failed on an
      NCCL symbol.
    - warn: two nvidia-nccl wheels in one environment (they overwrite each other's file); an NCCL
      preloaded or on LD_LIBRARY_PATH with another version than torch's; non-system providers of different
      versions. A system copy (ld.so.cache) of another version is only a note: torch's RPATH comes first.
    """
    if facts.get("skipped"):
        return {"status": "skip", "problems": [], "reason": facts["skipped"]}
    problems: list[dict[str, Any]] = []
    providers = facts.get("providers") or []
    req = facts.get("torch_requires") or {}
    want = req.get("version")
    loaded = [p for p in providers if p.get("loaded")]
    runtime = facts.get("torch_nccl")
    if facts.get("import_error_nccl"):
        problems.append({"kind": "import_symbol", "status": "fail", "text": facts["import_error_nccl"]})
    have = runtime or (loaded[0]["version"] if loaded else None)
    if want and have and vtuple(have) < vtuple(want):
        problems.append({"kind": "loaded_older", "status": "fail",
                         "text": f"torch uses NCCL {have} but its wheel requires {req.get('dist')}=={want}"})
    whl = facts.get("wheels") or []
    majors = sorted({w["cuda_major"] for w in whl})
    if len({(w["site"], w["dist"]) for w in whl}) > 1 and len(majors) > 1:
        problems.append({"kind": "two_wheels", "status": "warn",
                         "text": "several NCCL wheels are installed: " + ", ".join(
                             f"{w['dist']}=={w['version']}" for w in whl)})
    ref = want or have
    for p in providers:
        if p["kind"] in ("preload", "ld_library_path") and p.get("version") != ref:
            problems.append({"kind": p["kind"], "status": "warn", "path": p["path"],
                             "text": f"{p['via']} provides NCCL {p.get('version') or '(version unknown)'} "
                                     f"at {p['path']}" + (f"; torch expects {ref}" if ref else "")})
        if p.get("elf_error"):
            problems.append({"kind": "broken_file", "status": "warn", "path": p["path"],
                             "text": f"{p['path']}: {p['elf_error']}"})
    own = {p["version"] for p in providers if p["kind"] != "system" and p.get("version")}
    if len(own) > 1:
        problems.append({"kind": "versions_differ", "status": "warn",
                         "text": "NCCL providers of different versions can be loaded: "
                                 + ", ".join(sorted(own, key=vtuple))})
    notes = [f"{p['path']} (NCCL {p.get('version') or 'version unknown'}) is in ld.so.cache: torch's own "
             "RPATH finds its wheel first, but a program or extension without that RPATH, or an LD_PRELOAD, "
             "loads this copy" for p in providers if p["kind"] == "system" and ref and p.get("version") != ref]
    versions = {p.get("version") for p in providers if p.get("version")}
    status = "ok"
    if any(pr["status"] == "fail" for pr in problems):
        status = "fail"
    elif problems:
        status = "warn"
    return {"status": status, "problems": problems, "notes": notes, "versions": sorted(versions, key=vtuple),
            "expected": want, "runtime": have}
