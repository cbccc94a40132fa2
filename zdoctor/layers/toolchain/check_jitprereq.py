"""Check ``toolchain.jit-prereq``: ninja on the PATH the ranks see, Python.h for the training interpreter,
and a JIT compiler that compiles a one-line C++ file. Each missing piece is a finding with its exact fix."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from typing import Any

from zdoctor.core.causes import BROKEN_COMPILER, FULL_DISK
from zdoctor.core.factstypes import JitprereqFacts
from zdoctor.core.model import Finding, Remedy
from zdoctor.core.packages import cxx_back_end_package, managers, python_headers_package
from zdoctor.core.registry import CheckSpec, Facts, check, predicate
from zdoctor.layers.toolchain.check_toolchain import install_remedies
from zdoctor.readers.hostlimits import human
from zdoctor.symptoms.match import ids_for
from zdoctor.trials.remedies import export_line, restore_line

SYSTEM_PREFIXES = ("/usr", "/usr/local")
_MISSING_HEADER = re.compile(r"fatal error: ([\w./+-]+\.h(?:pp)?): No such file or directory")


def _ninja(me: CheckSpec, f: JitprereqFacts, python: str | None, multinode: bool) -> Finding:
    n = f["ninja"]
    py = shlex.quote(python or "python3")
    if not n["on_path"]:
        where = n.get("beside_interpreter")
        rem = ([Remedy(title="Put the environment's bin directory (which has ninja) on PATH",
                       commands=[f'export PATH={shlex.quote(os.path.dirname(where))}:"$PATH"'])] if where else
               [Remedy(title="Install ninja into the training environment",
                       commands=[f"{py} -m pip install ninja",
                                 f'export PATH={shlex.quote(os.path.dirname(python))}:"$PATH"' if python else ""])])
        for r in rem:
            r.commands = [c for c in r.commands if c]
        return Finding(id=me.id("ninja"), status="fail",
                       title="ninja is not on the training PATH: JIT builds fail with 'Ninja is required to load "
                             "C++ extensions'",
                       detail="torch.utils.cpp_extension runs `ninja --version` from PATH before building any op "
                              "(cpu_adam, async_io ...). "
                              + (f"A ninja sits beside the interpreter ({where}) but that directory is not on "
                                 "PATH (the environment is not activated)." if where else
                                 "No ninja was found beside the interpreter either."), remedies=rem)
    runs = n.get("runs")
    if runs is not None and not runs.get("ok"):
        return _ninja_does_not_run(me, n["on_path"], runs, python)
    if not n["on_noninteractive_path"]:
        d = os.path.dirname(n["on_path"])
        return Finding(id=me.id("ninja"), status="warn" if not multinode else "fail",
                       title=f"ninja is only in {d}: ranks started by pdsh/ssh will not find it",
                       detail=f"A command run by pdsh or ssh gets PATH={n['noninteractive_path']} "
                              f"({n['noninteractive_source']}) plus what the user's shell startup files add, not "
                              "this shell's PATH; DeepSpeed's multi-node runner forwards only NCCL*, PYTHON*, UCX*, "
                              "MV2*, MLFLOW* variables and the lines of .deepspeed_env. Each remote rank's first JIT "
                              "build then stops with 'Ninja is required to load C++ extensions'.",
                       remedies=[Remedy(title="Forward this PATH to every rank through ~/.deepspeed_env "
                                              "(DeepSpeed exports each NAME=VALUE line on the remote nodes)",
                                        commands=['printf \'PATH=%s\\n\' "$PATH" >> ~/.deepspeed_env'],
                                        undo=["sed -i '/^PATH=/d' ~/.deepspeed_env"])])
    if runs is None:
        return Finding(id=me.id("ninja"), status="skip",
                       title=f"ninja at {n['on_path']}, also on a pdsh/ssh shell's PATH; whether it starts was not "
                             "recorded")
    return Finding(id=me.id("ninja"), status="ok",
                   title=f"ninja at {n['on_path']} runs (`ninja --version`: {runs.get('version')}), and is also on "
                         "a pdsh/ssh shell's PATH")


def _ninja_does_not_run(me: CheckSpec, ninja: str, runs: dict[str, Any], python: str | None) -> Finding:
    """ninja is on PATH but ``ninja --version`` fails under the training environment: torch stops there."""
    err = (runs.get("error") or f"exit status {runs.get('exit_code')}").strip()
    first = err.splitlines()[-1] if err else ""
    lines = [f"torch.utils.cpp_extension runs `ninja --version` before building any op; under the training "
             f"environment {ninja} fails:", *err.splitlines()[-6:]]
    rems: list[Remedy] = []
    trial = runs.get("without_entries")
    if runs.get("missing_version"):
        lines.append(f"The loader gave ninja {runs.get('provider')}, which lacks {runs['missing_version']}: "
                     "an older libstdc++ than the one ninja was built against comes first.")
    if trial:
        entries = ", ".join(trial["entries"])
        rems.append(Remedy(
            title=f"Drop {entries} from LD_LIBRARY_PATH",
            commands=[export_line("LD_LIBRARY_PATH", trial.get("ld_library_path"))],
            undo=[restore_line("LD_LIBRARY_PATH", trial.get("old"))], tried=True, tool_started=bool(trial.get("ok")),
            note=(f"`ninja --version` without it printed {trial.get('version')}; the failing command itself "
                  "was not re-run" if trial.get("ok") else
                  f"`ninja --version` without it still fails: {(trial.get('error') or '').strip()[-200:]}"),
            explanation="ld.so searches LD_LIBRARY_PATH first; without that entry ninja gets a libstdc++ new "
                        "enough for it. The job's own libraries keep every other entry."))
    py = shlex.quote(python or "python3")
    rems.append(Remedy(title="Or install ninja from PyPI into the training environment and put it first on PATH",
                       commands=[f"{py} -m pip install ninja",
                                 *([f'export PATH={shlex.quote(os.path.dirname(python))}:"$PATH"'] if python else [])],
                       note="not tried, because it installs into the training environment"))
    return Finding(id=me.id("ninja"), status="fail",
                   title=f"ninja at {ninja} cannot start under the training environment: {first}",
                   detail="\n".join(lines), remedies=rems)


def _headers(me: CheckSpec, f: JitprereqFacts, facts: Facts) -> Finding | None:
    h = f["python_headers"]
    if h.get("python_h") is None:
        return me.not_checked(h.get("error") or "the training interpreter did not answer", sub="python-h",
                              part="Python.h")
    if h["python_h"]:
        return Finding(id=me.id("python-h"), status="ok",
                       title=f"Python.h present for Python {h.get('version')} ({h['include']})")
    ver = h.get("version") or "3"
    rem = header_remedies(h, facts)
    return Finding(id=me.id("python-h"), status="fail",
                   title=f"Python.h is missing for the training interpreter (Python {ver}): every JIT op build fails",
                   detail=f"torch compiles each op with -I{h.get('include')}, where Python.h must be; the build "
                          "stops with 'fatal error: Python.h: No such file or directory'. The interpreter's "
                          "development headers are not installed.", remedies=rem)


def header_remedies(h: Mapping[str, Any], facts: Facts) -> list[Remedy]:
    """Complete the Python installation the headers come from: a venv's base interpreter, installed by the
    node's package manager, conda or pyenv."""
    ver = h.get("version") or "3"
    prefix = os.path.normpath(h.get("prefix") or "") if h.get("prefix") else ""
    base = os.path.normpath(h.get("base_prefix") or prefix) if (h.get("base_prefix") or prefix) else ""
    of = f" (the base interpreter of the venv {prefix})" if base and prefix and base != prefix else ""
    if base in SYSTEM_PREFIXES:
        distro = (facts.of("toolchain") or {}).get("distro") or {}
        default = os.path.basename(h.get("base_executable") or "") == "python3"
        return [Remedy(title=f"Install the headers of Python {ver}{of} ({pm.label})",
                       commands=pm.install(python_headers_package(ver, pm.family, default)), requires_root=True)
                for pm in managers(distro)]
    if h.get("base_is_conda"):
        return [Remedy(title=f"Reinstall Python {ver} in the conda environment {base}{of}: its headers come with it",
                       commands=[f"conda install -y -p {shlex.quote(base)} --force-reinstall python={ver}"])]
    parent = os.path.dirname(base)
    if os.path.basename(parent) == "versions" and os.path.basename(os.path.dirname(parent)) in (".pyenv", "pyenv"):
        release = os.path.basename(base)
        return [Remedy(title=f"Rebuild pyenv's Python {release}{of} with its headers",
                       commands=[f"pyenv install --force {shlex.quote(release)}"])]
    return [Remedy(title=f"Reinstall the interpreter at {base or 'its prefix'}{of} with its development headers",
                   commands=[])]


def _compiles(me: CheckSpec, f: JitprereqFacts, facts: Facts) -> Finding | None:
    c = f["compile"]
    if not c.get("compiler"):
        return None  # toolchain.jit-compiler reports a missing compiler
    if c.get("no_space"):
        return _no_space(me, c, facts)
    if c.get("plain") is None:
        return me.not_checked(c.get("error") or "the compile test did not run", sub="compile",
                              part=f"whether {c['compiler']} compiles")
    plain = c.get("plain") or {}
    withpy = c.get("with_python_h")
    if plain.get("ok") and withpy is not None and not withpy.get("ok"):
        return _python_h_fails(me, c["compiler"], withpy, f, facts)
    if plain.get("ok"):
        return Finding(id=me.id("compile"), status="ok",
                       title=f"{c['compiler']} compiles a one-line C++ file"
                             + (" and one that includes Python.h" if (withpy or {}).get("ok") else
                                "; a file including Python.h was not tried (no Python.h)"))
    err = (plain.get("stderr") or plain.get("error") or "").strip().splitlines()[-3:]
    distro = (facts.of("toolchain") or {}).get("distro") or {}
    if (c.get("back_end") or {}).get("version") and not c["back_end"].get("found"):
        return _back_end_missing(me, c["compiler"], c["back_end"], err, distro)
    return Finding(id=me.id("compile"), status="fail",
                   title=f"{c['compiler']} cannot compile a one-line C++ file",
                   detail="The compiler torch would use for JIT builds fails on `int main() { return 0; }`: "
                          + (" | ".join(err) or "no output") + ". A compiler driver without its back end (cc1plus), "
                          "without the C++ standard headers, or a broken wrapper is not a compiler.",
                   remedies=install_remedies(distro), cause=BROKEN_COMPILER)


def _back_end_missing(me: CheckSpec, cxx: str, be: Mapping[str, Any], err: list[str], distro: Mapping[str, Any]
                      ) -> Finding:
    """The driver runs but one of its own passes is not where it looks (a gcc without g++ compiling C++, a
    removed or half-installed g++): where that pass belongs, and the package of this distribution that holds it."""
    prog, version = be["program"], str(be.get("version") or "")
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else None
    where = be.get("expected") or (f"one of {', '.join(be['searched'][:3])}" if be.get("searched")
                                   else "its program folders")
    rems = []
    for pm in managers(distro):
        pkg = cxx_back_end_package(major if prog == "cc1plus" else None, pm.family, be.get("driver") or "")
        rems.append(Remedy(title=f"Install {pkg}, which holds {prog} ({pm.label})",
                           commands=pm.install(shlex.quote(pkg)), requires_root=True, undo=pm.remove(shlex.quote(pkg)),
                           note="not tried: it installs a package on the node",
                           explanation=f"{prog} is the pass of GCC {version or '(this version)'} that "
                                       f"{'compiles C++' if prog == 'cc1plus' else 'the driver runs'}; the driver "
                                       f"{be.get('driver') or cxx} is installed without it. After the install, "
                                       f"`{cxx} -print-prog-name={prog}` prints its full path."))
    return Finding(id=me.id("compile"), status="fail",
                   title=f"{cxx} cannot start its {prog}: it is not installed where GCC {version} looks for it",
                   detail="The compiler torch would use for JIT builds fails on `int main() { return 0; }`: "
                          + (" | ".join(err) or "no output").rstrip(".") + f". `{cxx} -print-prog-name={prog}` answers "
                          f"'{prog}' alone (not found); GCC {version} ({be.get('machine') or '?'}) looks for it in "
                          f"{where}. The driver is there, its back end is not: the package that holds {prog} for "
                          "this GCC is missing or was removed.",
                   remedies=rems, cause=BROKEN_COMPILER)


def _space_text(sp: dict[str, Any]) -> str:
    """``12 KiB free of 2 MiB, 0 of 512 inodes free, on tmpfs /mnt/x (source tmpfs)``, or why unknown."""
    m = sp.get("mount") or {}
    on = f"on {m.get('fstype')} {m.get('point')} (source {m.get('source')})" if m else "mount unknown"
    if sp.get("error"):
        return f"free space unknown ({sp['error']}), {on}"
    return (f"{human(sp.get('avail_bytes'))} free of {human(sp.get('total_bytes'))}, {sp.get('avail_inodes')} of "
            f"{sp.get('total_inodes')} inodes free, {on}")


def _no_space(me: CheckSpec, c: Mapping[str, Any], facts: Facts) -> Finding:
    """The compile test stopped on "No space left on device": the compiler ran and the folder it writes its
    temporary files to is full. The finding names that folder, how full it is, the JIT cache's, and the
    compile re-run with TMPDIR in a folder with room."""
    ns = c["no_space"]
    tmp, sp = ns.get("tmpdir"), ns.get("space") or {}
    said = "\n".join(str((c.get(k) or {}).get("stderr") or "").strip() for k in ("plain", "with_python_h"))
    lines = [line for line in said.splitlines() if "No space left on device" in line][:3]
    trials = ns.get("trials") or []
    fixed = next((t for t in trials if t.get("ok")), None)
    old = ns.get("tmpdir_set")  # $TMPDIR as the training environment set it (None: unset)
    rem: list[Remedy] = []
    if fixed:
        rem.append(Remedy(title=f"Build with TMPDIR={fixed['tmpdir']}, a folder with room on this node",
                          commands=[export_line("TMPDIR", fixed["tmpdir"])], undo=[restore_line("TMPDIR", old)],
                          tool_started=True, note=f"the compile test re-run with TMPDIR={fixed['tmpdir']} "
                                                  "compiled; the failing command itself was not re-run",
                          explanation="GCC writes its assembler files to $TMPDIR; torch's JIT build inherits it."))
    for t in trials:
        if not t.get("ok"):
            why = (t.get("stderr") or "").strip()[-200:]
            rem.append(Remedy(title=f"Build with TMPDIR={t['tmpdir']}", commands=[export_line("TMPDIR", t["tmpdir"])],
                              undo=[restore_line("TMPDIR", old)], tried=True,
                              note=f"the compile test re-run with it failed too: {why}"))
    if not trials:
        rem.append(Remedy(title="Build with TMPDIR set to a folder with room (1 GiB or more) the training user may "
                                "write", commands=["export TMPDIR=<a folder with room>"],
                          note="not tried: no folder on this node was found with room, writable, on another file "
                               "system"))
    rem.append(Remedy(title=f"Free space in {tmp} (its largest entries first)",
                      commands=[f"du -xsh {shlex.quote(str(tmp))}/* 2>/dev/null | sort -h | tail -20"],
                      note="not tried: what to delete is the owner's choice",
                      explanation="The command lists; it deletes nothing."))
    base_sp = ns.get("build_space") or {}
    return Finding(id=me.id("compile"), status="fail", cause=FULL_DISK,
                   explains=ids_for(facts, "no-space"),
                   title=f"The compiler's temporary directory {tmp} ({ns.get('chosen_by')}) is full: "
                         f"{human(sp.get('avail_bytes'))} free of {human(sp.get('total_bytes'))}; "
                         f"{c['compiler']} ran and stopped on 'No space left on device'",
                   detail="\n".join(
                       ["The compile test failed: "
                        + (" | ".join(x.strip() for x in lines) or "No space left on device") + ".",
                        f"{tmp}: {_space_text(sp)}.",
                        f"The JIT build directory {ns.get('build_base')} ({ns.get('build_base_source')}): "
                        f"{_space_text(base_sp)}.",
                        "The compiler works: it stopped writing its temporary files, so a JIT build of any op fails "
                        "the same way until the folder has room or TMPDIR points elsewhere."]),
                   remedies=rem)


def _python_h_fails(me: CheckSpec, cxx: str, withpy: Mapping[str, Any], f: Mapping[str, Any], facts: Facts
                    ) -> Finding:
    """The compile of a file including Python.h failed: its own error output is the finding."""
    h = f.get("python_headers") or {}
    err = (withpy.get("stderr") or withpy.get("error") or "").strip()
    first = next((line for line in err.splitlines() if "error" in line), err.splitlines()[0] if err else "")
    header = _MISSING_HEADER.search(err)
    return Finding(id=me.id("compile"), status="fail",
                   explains=ids_for(facts, "missing-header", header=header.group(1)) if header else [],
                   title=f"{cxx} cannot compile a file that includes Python.h: {first.strip() or 'no output'}",
                   detail=f"torch compiles every op with -I{h.get('include')} and #include <Python.h>; that "
                          f"compile failed here (a plain C++ file compiles). The compiler said:\n"
                          + "\n".join(err.splitlines()[-12:]),
                   remedies=header_remedies(h, facts))


@check("toolchain.jit-prereq", title="JIT build prerequisites: ninja, Python.h, a working compiler",
       probes=("jitprereq",), explains=("ninja-missing", "missing-header", "no-space", "compiler-pass-missing"),
       findings=("toolchain.jit-prereq.compile", "toolchain.jit-prereq.ninja", "toolchain.jit-prereq.python-h"))
def check_jitprereq(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("jitprereq"), facts.why_not("jitprereq"))
    nodes = (facts.of("host_limits") or {}).get("nodes") or 1
    ninja = _ninja(me, f, f.get("python"), bool(nodes and nodes > 1))
    if ninja.status == "fail":  # torch's "Ninja is required" is what a missing or unstartable ninja gives
        ninja.explains = ids_for(facts, "ninja-missing")
    headers = _headers(me, f, facts)
    if headers is not None and headers.status == "fail":
        headers.explains = ids_for(facts, "missing-header", header="Python.h")
    out = [ninja, headers, _compiles(me, f, facts)]
    return [x for x in out if x is not None]


@predicate("jit_prereq_missing", doc="ninja, Python.h or a working JIT compiler is missing",
           probes=("jitprereq",))
def jit_prereq_missing(facts: Facts) -> bool:
    return any(x.status in ("fail", "warn") for x in check_jitprereq(facts))
