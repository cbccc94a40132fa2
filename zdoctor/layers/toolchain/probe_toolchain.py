"""Probe ``toolchain``: the compilers that matter to a DeepSpeed node, layer by layer, side by side.

Layers: (a) every gcc/g++/cc/c++ on the target PATH and the one that wins for the JIT build of ops
(torch.utils.cpp_extension runs ``$CXX``, else ``c++``) and for nvcc's host compiler (``$CC``, else
gcc on PATH); (b) Python's sysconfig CC/CXX, which setuptools uses for builds at ``pip install``
time; (c) the compiler that built torch, from ``torch.__config__.show()``, and torch's C++11 ABI flag;
(d) Red Hat devtoolset / gcc-toolset directories on PATH or enabled through ``scl``.

Facts: ``compilers`` (every match, with realpath, family, version, vendor, toolset, ``wins``),
``winners`` (name -> path), ``jit``, ``cuda_host``, ``sysconfig`` {CC, CXX}, ``torch_build``,
``toolsets``, ``devtoolset_on_path``, ``distro``, ``torch_installed``, ``deepspeed_installed``,
``pyenv_ok``. A resolved compiler is a dict with value, command, wrapper, path, realpath, family,
version, major, vendor, toolset and error.
"""

from __future__ import annotations

import glob
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from zdoctor.core.factstypes import ToolchainFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.layers.python_env.probe_pyenv import TARGET_TIMEOUT
from zdoctor.proc.runner import run, which_all
from zdoctor.proc.target import target_of
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.gccver import glibcxx_for_gcc, parse_torch_config, parse_version_output, toolset_bin, toolset_of

COMPILER_NAMES = ("gcc", "g++", "cc", "c++")
WRAPPERS = ("ccache", "sccache", "distcc")
VERSION_TIMEOUT = 10.0
OS_RELEASE = "/etc/os-release"
OPT_RH = "/opt/rh"


def read_os_release(path: str = OS_RELEASE) -> dict[str, Any]:
    """ID, ID_LIKE (as a list) and VERSION_ID from os-release; empty values when unreadable."""
    out: dict[str, Any] = {"id": None, "id_like": [], "version_id": None}
    try:
        with open_regular_text(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, val = line.strip().partition("=")
                val = val.strip().strip('"').strip("'")
                if key == "ID":
                    out["id"] = val.lower()
                elif key == "ID_LIKE":
                    out["id_like"] = val.lower().split()
                elif key == "VERSION_ID":
                    out["version_id"] = val
    except OSError:
        pass
    return out


def find_compilers(path: str, names: tuple[str, ...] = COMPILER_NAMES) -> list[dict[str, Any]]:
    """Every ``names`` executable on ``path`` in search order (like ``which -a``), with realpaths.

    Matches that are the same file (``/bin/gcc`` beside ``/usr/bin/gcc`` on a merged-/usr system)
    fold into the first one's ``also`` list.
    """
    out: list[dict[str, Any]] = []
    for name in names:
        seen: dict[str, dict[str, Any]] = {}
        for cand in which_all(name, path):
            real = os.path.realpath(cand)
            if real in seen:
                seen[real]["also"].append(cand)
                continue
            seen[real] = {"name": name, "path": cand, "realpath": real, "wins": not seen, "also": []}
            out.append(seen[real])
    return out


def resolve_command(value: str | None, path: str, default: str) -> dict[str, Any]:
    """What a compiler variable like ``$CXX`` runs: its first word (past a ccache-style wrapper) on PATH."""
    raw = value if value else default
    out: dict[str, Any] = {"value": raw, "command": None, "wrapper": None, "path": None,
                           "realpath": None, "error": None}
    if "/" in raw and os.path.isfile(raw) and os.access(raw, os.X_OK):  # a path with spaces, unsplit
        out.update(command=raw, path=raw, realpath=os.path.realpath(raw))
        return out
    try:
        words = shlex.split(raw)
    except ValueError:
        words = raw.split()
    if not words:
        out["error"] = "empty"
        return out
    if os.path.basename(words[0]) in WRAPPERS and len(words) > 1:
        out["wrapper"] = words[0]
        words = words[1:]
    cmd = words[0]
    out["command"] = cmd
    if "/" in cmd:
        if os.path.isfile(cmd) and os.access(cmd, os.X_OK):
            out["path"] = cmd
        else:
            out["error"] = f"{cmd}: no such executable"
    else:
        found = which_all(cmd, path)
        if found:
            out["path"] = found[0]
        else:
            out["error"] = f"{cmd}: not found on PATH"
    if out["path"]:
        out["realpath"] = os.path.realpath(out["path"])
    return out


def _key(path: str) -> tuple[str, str]:
    # argv[0] matters (ccache symlinks, gcc vs g++ drivers), so the name is part of the identity.
    return os.path.realpath(path), os.path.basename(path)


def identify_all(paths: list[str], env: dict[str, str], timeout: float = VERSION_TIMEOUT
                 ) -> tuple[dict[tuple[str, str], dict[str, Any]], list[Evidence]]:
    """Run ``P --version`` once per distinct compiler, concurrently; parse each banner."""
    unique: dict[tuple[str, str], str] = {}
    for p in paths:
        unique.setdefault(_key(p), p)
    run_env = dict(env, LC_ALL="C", LANG="C")

    def one(p: str) -> Evidence:
        return run([p, "--version"], env=run_env, timeout=timeout, label=f"{p} --version")

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(unique)))) as pool:
        evs = dict(zip(unique, pool.map(one, unique.values())))
    info: dict[tuple[str, str], dict[str, Any]] = {}
    for key, ev in evs.items():
        parsed = parse_version_output(ev.stdout or ev.stderr)
        err = ev.error or (f"exit code {ev.exit_code}" if ev.exit_code not in (0, None) else None)
        parsed["error"] = err if not parsed["first_line"] or ev.error else None
        parsed["wrapper"] = os.path.basename(key[0]) if os.path.basename(key[0]) in WRAPPERS else None
        info[key] = parsed
    return info, list(evs.values())


def _with_info(entry: dict[str, Any], info: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    out = dict(entry)
    path = out.get("path")
    ident = info.get(_key(path), {}) if path else {}
    for k in ("family", "version", "major", "vendor", "first_line"):
        out[k] = ident.get(k)
    if ident.get("error") and not out.get("error"):
        out["error"] = ident["error"]
    if ident.get("wrapper") and not out.get("wrapper"):
        out["wrapper"] = ident["wrapper"]
    out["toolset"] = toolset_of(out.get("realpath")) or toolset_of(path)
    return out


def find_toolsets(path: str, env: dict[str, str], opt_rh: str = OPT_RH
                  ) -> tuple[dict[str, Any], list[Evidence]]:
    """devtoolset / gcc-toolset on PATH, enabled by ``scl`` (X_SCLS), or merely installed."""
    on_path = []
    for i, entry in enumerate(d for d in path.split(os.pathsep) if d):
        name = toolset_bin(entry)
        if name:
            on_path.append({"name": name, "dir": entry, "index": i})
    installed = sorted({os.path.basename(d) for d in glob.glob(os.path.join(opt_rh, "*-toolset-*"))
                        + glob.glob(os.path.join(opt_rh, "devtoolset-*")) if os.path.isdir(d)})
    evidence = []
    scl = which_all("scl", path)
    scl_list: list[str] = []
    if scl:
        ev = run([scl[0], "-l"], env=env, timeout=VERSION_TIMEOUT, label="scl -l")
        evidence.append(ev)
        scl_list = [ln.strip() for ln in ev.stdout.splitlines() if ln.strip()]
    return {"on_path": on_path, "enabled": env.get("X_SCLS", "").split(), "installed": installed,
            "scl": scl[0] if scl else None, "scl_list": scl_list}, evidence


def _describe(c: dict[str, Any] | None) -> tuple[str, str]:
    """(compiler cell, version cell) for the layers table."""
    if not c or not c.get("path"):
        return (c or {}).get("error") or "none", "-"
    where = c["path"]
    if c.get("realpath") and c["realpath"] != c["path"]:
        where += f" -> {c['realpath']}"
    if c.get("wrapper"):
        where = f"{c['wrapper']} {where}"
    fam = {"gcc": "GCC", "clang": "clang"}.get(c.get("family") or "", c.get("family") or "?")
    version = f"{fam} {c['version']}" if c.get("version") else (c.get("error") or "unknown")
    if c.get("vendor"):
        version += f" ({c['vendor']})"
    if c.get("toolset"):
        version += f" [{c['toolset']}]"
    return where, version


def layers_table(facts: dict[str, Any]) -> Evidence:
    """The side-by-side table: layer | compiler | version | source."""
    rows: list[list[str]] = []
    highlight: list[int] = []

    def add(layer: str, c: dict[str, Any] | None, source: str, stress: bool = False,
            show_value: bool = False) -> None:
        if stress:
            highlight.append(len(rows))
        where, version = _describe(c)
        if show_value and c and c.get("value"):
            where = f"{c['value']!r}: {where}"
        rows.append([layer, where, version, source])

    jit = facts["jit"]
    add("JIT ops (torch.utils.cpp_extension)", jit,
        "$CXX" if jit["source"] == "CXX" else "c++ on PATH", not jit.get("path") or bool(jit.get("toolset")),
        show_value=jit["source"] == "CXX")
    host = facts["cuda_host"]
    add("nvcc host compiler (CUDA ops)", host, "-ccbin $CC" if host["source"] == "CC" else "gcc on PATH",
        bool(host.get("toolset")), show_value=host["source"] == "CC")
    for c in facts["compilers"]:
        label = f"{c['name']} on PATH" + ("" if c["wins"] else " (shadowed)")
        add(label, c, "PATH, first match" if c["wins"] else "PATH, later match", bool(c.get("toolset")))
    for var in ("CC", "CXX"):
        sc = facts["sysconfig"].get(var)
        if sc is not None:
            src = "sysconfig (setuptools builds)"
            if sc.get("overridden_by"):
                src += f"; ${sc['overridden_by']} overrides it"
            add(f"Python sysconfig {var}", sc, src, bool(sc.get("error")), show_value=True)
        else:
            rows.append([f"Python sysconfig {var}", "unknown", "-", "interpreter not probed"])
    tb = facts.get("torch_build")
    if tb:
        ver = f"{tb['compiler']} {tb['version']}" if tb.get("compiler") else "unknown"
        if tb.get("toolset"):
            ver += f" [{tb['toolset']}]"
        rows.append(["torch build", tb.get("cxx_compiler") or "-", ver, "torch.__config__.show()"])
        abi = tb.get("cxx11_abi")
        rows.append(["torch C++11 ABI", "-", "unknown" if abi is None else f"_GLIBCXX_USE_CXX11_ABI={int(abi)}",
                     "torch._C"])
    else:
        rows.append(["torch build", "-", "unknown", "torch not imported"])
    return Evidence.of_table("compiler layers", ["layer", "compiler", "version", "source"], rows, highlight)


def collect(env: dict[str, str], pyenv: dict[str, Any] | None, *, opt_rh: str = OPT_RH,
            os_release: str = OS_RELEASE, timeout: float = VERSION_TIMEOUT
            ) -> tuple[dict[str, Any], list[Evidence]]:
    """Gather the toolchain facts for ``env`` (the training environment) and the pyenv facts."""
    pyenv = pyenv or {}
    path = env.get("PATH", "")
    found = find_compilers(path)
    jit = resolve_command(env.get("CXX"), path, "c++")
    jit["source"] = "CXX" if env.get("CXX") else "default"
    cuda_host = resolve_command(env.get("CC"), path, "gcc")
    cuda_host["source"] = "CC" if env.get("CC") else "default"
    python = pyenv.get("python") or {}
    sysconfig_vars = python.get("sysconfig") or {}
    sysconfig: dict[str, Any] = {}
    if python.get("sysconfig") is not None:
        for var in ("CC", "CXX"):
            value = sysconfig_vars.get(var)
            if value:
                sc = resolve_command(value, path, "")
                sc["overridden_by"] = var if env.get(var) else None
                sysconfig[var] = sc
            else:
                sysconfig[var] = {"value": None, "command": None, "wrapper": None, "path": None,
                                  "realpath": None, "error": "not set in sysconfig", "overridden_by": None}
    to_run = [c["path"] for c in found]
    to_run += [c["path"] for c in (jit, cuda_host, *sysconfig.values()) if c.get("path")]
    info, evidence = identify_all(to_run, env, timeout) if to_run else ({}, [])
    compilers = [_with_info(c, info) for c in found]
    toolsets, scl_ev = find_toolsets(path, env, opt_rh)
    torch = pyenv.get("torch") or {}
    torch_build = None
    if torch.get("config"):
        torch_build = parse_torch_config(torch["config"])
        torch_build.pop("settings", None)
        torch_build["cxx11_abi"] = torch.get("cxx11_abi")
        torch_build["torch_version"] = torch.get("version")
    jit = _with_info(jit, info)
    if jit.get("family") == "gcc":
        jit["glibcxx_max"] = glibcxx_for_gcc(jit.get("version"))
    facts: dict[str, Any] = {
        "path": path,
        "compilers": compilers,
        "winners": {n: next((c["path"] for c in compilers if c["name"] == n and c["wins"]), None)
                    for n in COMPILER_NAMES},
        "jit": jit,
        "cuda_host": _with_info(cuda_host, info),
        "sysconfig": {k: _with_info(v, info) for k, v in sysconfig.items()},
        "torch_build": torch_build,
        "toolsets": toolsets,
        "distro": read_os_release(os_release),
        "env": {k: env[k] for k in ("CC", "CXX", "CUDAHOSTCXX", "X_SCLS") if k in env},
        "pyenv_ok": bool(python) and not pyenv.get("error"),
        "torch_installed": torch.get("installed"),
        "torch_version": torch.get("version"),
        "deepspeed_installed": (pyenv.get("deepspeed") or {}).get("installed"),
    }
    in_toolset = [c["path"] for c in (facts["jit"], facts["cuda_host"], *compilers)
                  if c.get("path") and c.get("toolset")]
    toolsets["compilers"] = sorted(set(in_toolset))
    facts["devtoolset_on_path"] = bool(toolsets["on_path"] or toolsets["enabled"] or in_toolset)
    return facts, [layers_table(facts), *evidence, *scl_ev]


@probe("toolchain", title="Compiler toolchain layers", timeout=TARGET_TIMEOUT + 60, needs=("pyenv",),
       facts=ToolchainFacts)
def toolchain_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    """Compilers on PATH, the JIT and nvcc host compilers, sysconfig's, torch's, and toolsets."""
    env = dict(target_of(host).env)
    res = host.result("pyenv")
    pyenv = res.facts if res.status == "ok" else None
    return collect(env, pyenv)
