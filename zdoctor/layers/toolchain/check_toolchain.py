"""Checks and predicates over the ``toolchain`` probe: the compiler that will build JIT ops, the layers
side by side, Python's sysconfig compilers, and devtoolset/gcc-toolset on PATH."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.packages import managers, package_name
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.core.shellquote import shell_quote
from zdoctor.readers.gccver import version_tuple

#: PyTorch documents gcc 9.4+ for its own C++17 build; torch >= 2.1 compiles extensions with -std=c++17.
MIN_GCC_MAJOR = 9

NO_FACTS = "the toolchain probe gave no facts"




def _compiler_name(c: Mapping[str, Any]) -> str:
    fam = {"gcc": "GCC", "clang": "clang"}.get(c.get("family") or "", "unknown compiler")
    return f"{fam} {c['version']}" if c.get("version") else fam


def install_remedies(distro: Mapping[str, Any]) -> list[Remedy]:
    """Install the C++ compiler with this node's package manager (root), by its package name there."""
    out = []
    for pm in managers(distro):
        pkg = package_name("c++ compiler", pm.family)
        out.append(Remedy(title=f"Install g++ ({pm.label})", commands=pm.install(pkg), requires_root=True,
                          undo=pm.remove(pkg),
                          explanation="Installs the distribution's C++ compiler; `c++` then points at it."))
    return out


def build_safe(path: str) -> bool:
    """True when ``path`` survives being pasted unquoted into a shell command line.

    torch writes $CXX unquoted into build.ninja and setuptools splits $CC/$CXX on spaces, so a
    compiler path with spaces or shell syntax would break (or run) there even when exported safely.
    """
    return shlex.quote(path) == path


def _export_cxx(path: str, old: str | None) -> Remedy:
    return Remedy(
        title=f"Build JIT ops with {path}",
        commands=[f"export CXX={shlex.quote(path)}"],
        undo=[f"export CXX={shell_quote(old)}"] if old else ["unset CXX"],
        explanation="torch.utils.cpp_extension runs $CXX when it is set; this compiler is already "
                    "installed and answers --version.",
    )


@check("toolchain.jit-compiler", title="C++ compiler for JIT-built ops", probes=("toolchain",))
def check_jit_compiler(facts: Facts, me: CheckSpec) -> list[Finding]:
    t = me.require(facts.of("toolchain"), NO_FACTS)
    jit = t["jit"]
    ev = facts.evidence("toolchain", kinds=None)
    ds = bool(t.get("deepspeed_installed"))
    why = ("torch.utils.cpp_extension compiles C++ extensions with $CXX when it is set, else with `c++` "
           "from PATH. DeepSpeed builds its ops (cpu_adam for ZeRO-Offload, async_io for NVMe offload, "
           "fused_adam ...) this way the first time they are used, unless they were prebuilt at install time.")
    if not jit.get("path"):
        status = "fail" if ds else "warn"
        if jit.get("source") == "CXX":
            title = f"$CXX={jit['value']!r} does not resolve: {jit.get('error')}"
        else:
            title = "No C++ compiler for JIT-built ops: `c++` is not on PATH"
        detail = why + ("\nDeepSpeed is installed, so the first ZeRO-Offload run will fail with "
                        "'DeepSpeedCPUAdam requires the cpu_adam op, which failed to build/load'."
                        if ds else "\nDeepSpeed is not installed in the target interpreter (yet)."
                        if t.get("deepspeed_installed") is False
                        else "\nWhether DeepSpeed is installed is unknown: the interpreter was not probed.")
        remedies: list[Remedy] = []
        gxx = t["winners"].get("g++") or t["winners"].get("c++")
        if jit.get("source") == "CXX" and t["winners"].get("c++"):
            remedies.append(Remedy(title="Unset the broken $CXX (torch then uses c++ from PATH)",
                                   commands=["unset CXX"], undo=[f"export CXX={shell_quote(jit.get('value') or '')}"],
                                   explanation=f"c++ on PATH is {t['winners']['c++']}."))
        elif gxx and build_safe(gxx):
            remedies.append(_export_cxx(gxx, jit["value"] if jit.get("source") == "CXX" else None))
        elif gxx:
            detail += (f"\n{gxx} exists, but its path contains spaces or shell syntax: torch writes $CXX "
                       "unquoted into build.ninja, so pointing CXX at it would break the build.")
        remedies.extend(install_remedies(t.get("distro") or {}))
        return [me.finding(status=status, title=title, detail=detail, evidence=ev, remedies=remedies)]
    name = _compiler_name(jit)
    lines = [why, f"Source: {'$CXX=' + repr(jit['value']) if jit.get('source') == 'CXX' else 'c++ on PATH'}; "
                  f"resolves to {jit['path']}" + (f" -> {jit['realpath']}" if jit.get('realpath') != jit['path']
                                                  else "")]
    if jit.get("wrapper"):
        lines.append(f"It runs through the {jit['wrapper']} wrapper.")
    if jit.get("glibcxx_max"):
        lines.append(f"Objects it builds may need libstdc++ version nodes up to {jit['glibcxx_max']}; the "
                     "libstdc++.so.6 loaded at run time must provide the ones they use (the loader steps "
                     "check that).")
    status, title = "ok", f"JIT ops will build with {jit['path']} ({name})"
    if t.get("torch_installed") is False:
        status, title = "skip", (f"JIT ops: none build here, torch is not installed in the probed interpreter "
                                 f"(the compiler would be {jit['path']}, {name})")
        lines.append("torch.utils.cpp_extension is what builds the ops; name the training interpreter with --python.")
    elif jit.get("family") not in ("gcc", "clang"):
        status = "warn"
        title = f"JIT compiler {jit['path']} is not recognisably GCC or clang"
        lines.append("torch accepts only gcc/g++ and clang/clang++ here and otherwise warns that the "
                     "compiler is not compatible with the one PyTorch was built with. First line of "
                     f"--version: {jit.get('first_line') or jit.get('error')!r}")
    elif jit.get("family") == "gcc" and jit.get("major") and jit["major"] < MIN_GCC_MAJOR:
        tv = version_tuple(t.get("torch_version"))
        if not tv or tv >= (2, 1):
            status = "warn"
            title = f"JIT compiler is {name}: older than GCC {MIN_GCC_MAJOR}"
            lines.append("torch >= 2.1 compiles extensions with -std=c++17, and PyTorch documents gcc 9.4 or "
                         "newer for its own C++17 code; older GCC commonly fails on torch's headers.")
    return [me.finding(status=status, title=title, detail="\n".join(lines), evidence=ev)]


@check("toolchain.layers", title="Compiler layers side by side", probes=("toolchain",))
def check_layers(facts: Facts, me: CheckSpec) -> list[Finding]:
    t = me.require(facts.of("toolchain"), NO_FACTS)
    jit, tb = t["jit"], t.get("torch_build")
    parts = [f"JIT {_compiler_name(jit) if jit.get('path') else 'none'}"]
    if tb and tb.get("compiler"):
        parts.append(f"torch built with {tb['compiler']} {tb['version']}")
    lines = [
        "Four layers decide which compiler touches your C++ code:",
        "- JIT ops: what torch.utils.cpp_extension runs ($CXX, else c++); DeepSpeed ops built at first use.",
        "- nvcc host compiler: what nvcc hands host code to (torch passes -ccbin $CC when CC is set).",
        "- Python's sysconfig CC/CXX: what setuptools uses at `pip install` time (e.g. prebuilt "
        "DeepSpeed ops with DS_BUILD_OPS=1), unless CC/CXX are set.",
        "- The compiler that built torch: informational. Its version need not match yours: torch passes "
        "its own -D_GLIBCXX_USE_CXX11_ABI flag to every extension, and libstdc++ is backward compatible, "
        "so a GCC 11.2 vs 11.4 or 12 vs 13 difference is not an ABI break.",
        "What can break is the run time: an extension built by a newer GCC needs newer GLIBCXX version "
        "nodes than an older libstdc++.so.6 (conda's, or one put first by LD_LIBRARY_PATH) provides.",
    ]
    if tb and tb.get("toolset"):
        lines.append(f"torch itself was built with {tb['toolset']} on its build machine: that toolset links "
                     "newer C++ pieces statically, which keeps the wheel's libstdc++ needs low. It says "
                     "nothing about this machine.")
    shadowed = [c for c in t.get("compilers") or [] if not c.get("wins")]
    if shadowed:
        lines.append("Later PATH matches are never used unless named explicitly: "
                     + ", ".join(f"{c['path']} ({_compiler_name(c)})" for c in shadowed) + ".")
    if t.get("torch_installed") is False:
        return [me.finding(status="skip", title="Compiler layers: not compared, torch is not installed in the "
                           f"probed interpreter ({'; '.join(parts)})", detail="\n".join(lines),
                           evidence=facts.evidence("toolchain", kinds=("table",)))]
    return [me.finding(status="ok", title="Compiler layers: " + "; ".join(parts), detail="\n".join(lines),
                       evidence=facts.evidence("toolchain", kinds=("table",)))]


@check("toolchain.sysconfig", title="Python's sysconfig compilers", probes=("toolchain",))
def check_sysconfig(facts: Facts, me: CheckSpec) -> list[Finding]:
    t = me.require(facts.of("toolchain"), NO_FACTS)
    sc = t.get("sysconfig") or {}
    if not sc:
        return [me.not_checked("the target interpreter was not probed")]
    broken = {k: v for k, v in sc.items() if not v.get("path") and v.get("value") and not v.get("overridden_by")}
    desc = ", ".join(f"{k}={v.get('value')!r} -> {v.get('path') or v.get('error')}" for k, v in sorted(sc.items()))
    if not broken:
        return [me.finding(status="ok", title="Python's sysconfig compilers resolve", detail=desc,
                           evidence=facts.evidence("toolchain", kinds=("table",)))]
    detail = (f"{desc}\nsetuptools compiles C/C++ extensions at `pip install` time with these (unless $CC/$CXX "
              "are set). They name compilers recorded when this Python was built, often a conda or "
              "cross-compiler name that does not exist here, so building DeepSpeed ops at install time "
              "(DS_BUILD_OPS=1 pip install deepspeed) fails with \"command '...' failed: No such file or "
              "directory\". JIT builds at run time are not affected.")
    remedies = []
    gcc, gxx = t["winners"].get("gcc") or t["winners"].get("cc"), t["winners"].get("g++") or t["winners"].get("c++")
    if gcc and gxx and build_safe(gcc) and build_safe(gxx):
        env = t.get("env") or {}
        remedies.append(Remedy(
            title="Build extensions with the compilers on PATH",
            commands=[f"export CC={shlex.quote(gcc)}", f"export CXX={shlex.quote(gxx)}"],
            undo=[f"export {k}={shell_quote(env[k])}" if env.get(k) else f"unset {k}" for k in ("CC", "CXX")],
            explanation="setuptools and torch.utils.cpp_extension both honour $CC/$CXX."))
    return [me.finding(status="warn", title="Python's sysconfig " + " and ".join(sorted(broken))
                       + " not found on PATH", detail=detail, evidence=facts.evidence("toolchain", kinds=("table",)),
                       remedies=remedies)]


DEVTOOLSET_EXPLAINED = (
    "A Red Hat devtoolset / gcc-toolset g++ links against a linker script: the C++ symbols newer than the "
    "system libstdc++ are copied statically into each binary (from libstdc++_nonshared.a), and the binary "
    "still depends on the system libstdc++.so.6. At run time the loader loads that system library. So the "
    "toolset is fine for building, but enabling or installing it never makes the system libstdc++ provide a "
    "newer GLIBCXX version: it does not fix a run-time \"version `GLIBCXX_3.4.x' not found\" error, and an "
    "object built elsewhere with a newer GCC still needs a newer libstdc++.so.6 at run time."
)


@check("toolchain.devtoolset", title="devtoolset / gcc-toolset", probes=("toolchain",))
def check_devtoolset(facts: Facts, me: CheckSpec) -> list[Finding]:
    t = me.require(facts.of("toolchain"), NO_FACTS)
    ts = t.get("toolsets") or {}
    if t.get("devtoolset_on_path"):
        names = sorted({e["name"] for e in ts.get("on_path") or []} | set(ts.get("enabled") or [])
                       | {name for c in (t["jit"], t["cuda_host"], *t["compilers"]) if (name := c.get("toolset"))})
        where = [f"PATH entry {e['dir']}" for e in ts.get("on_path") or []]
        if ts.get("enabled"):
            where.append(f"X_SCLS={' '.join(ts['enabled'])} (scl enable)")
        where += [f"compiler {p}" for p in ts.get("compilers") or []]
        detail = f"Found: {'; '.join(where)}.\n\n{DEVTOOLSET_EXPLAINED}"
        return [me.finding(status="warn", title=f"{', '.join(names)} on PATH: it builds, it does not fix "
                           "run-time GLIBCXX", detail=detail, evidence=facts.evidence("toolchain", kinds=("table",)))]
    detail = "No devtoolset or gcc-toolset directory is on PATH and none is enabled through scl."
    if ts.get("installed"):
        detail += f" Installed but not enabled: {', '.join(ts['installed'])}."
    return [me.finding(status="ok", title="No devtoolset / gcc-toolset on PATH", detail=detail)]


# -- predicates ------------------------------------------------------------------------------------

@predicate("no_cxx_compiler", doc="neither $CXX nor c++ on PATH gives a C++ compiler for JIT-built ops",
           probes=("toolchain",))
def no_cxx_compiler(facts: Facts) -> bool:
    t = facts.of("toolchain")
    return t is not None and bool(t) and not t["jit"].get("path")


@predicate("sysconfig_compiler_missing", doc="Python's sysconfig CC or CXX names a compiler not on PATH",
           probes=("toolchain",))
def sysconfig_compiler_missing(facts: Facts) -> bool:
    return any(f.status == "warn" for f in check_sysconfig(facts))
