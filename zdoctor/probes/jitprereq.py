"""Probe ``jitprereq``: what torch's JIT build of a DeepSpeed op needs besides a compiler name: ``ninja``
on the PATH the ranks see, ``Python.h`` for the training interpreter, and a compiler that really compiles
a one-line C++ file (and one that includes Python.h)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any

from ..model import Evidence
from ..registry import probe
from ..runner import run
from ..userfile import open_regular_text

#: What sshd gives a non-interactive session when /etc/environment sets no PATH (OpenSSH's default).
SSHD_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
COMPILE_TIMEOUT = 60.0
NINJA_TIMEOUT = 20.0
PATHS_CODE = "import sysconfig, json, sys; print(json.dumps({'paths': sysconfig.get_paths(), 'version': " \
             "'%d.%d' % sys.version_info[:2], 'prefix': sys.prefix, 'base_prefix': sys.base_prefix, " \
             "'base_executable': getattr(sys, '_base_executable', sys.executable)}))"


def noninteractive_path(etc_environment: str = "/etc/environment") -> tuple[str, str]:
    """(PATH, source) that a command started by pdsh/ssh gets before any startup file of the user runs."""
    try:
        with open_regular_text(etc_environment, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.strip().partition("=")
                if key.strip() == "PATH" and value:
                    return value.strip().strip('"'), etc_environment
    except OSError:
        pass
    return SSHD_DEFAULT_PATH, "sshd's default (no PATH in /etc/environment)"


def find_ninja(env: dict[str, str], python: str | None, etc_environment: str = "/etc/environment"
               ) -> dict[str, Any]:
    path = env.get("PATH", "")
    on_path = shutil.which("ninja", path=path)
    beside = None
    if python:
        cand = os.path.join(os.path.dirname(python), "ninja")
        beside = cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None
    ni_path, ni_source = noninteractive_path(etc_environment)
    remote = shutil.which("ninja", path=ni_path)
    return {"on_path": on_path, "beside_interpreter": beside, "noninteractive_path": ni_path,
            "noninteractive_source": ni_source, "on_noninteractive_path": remote,
            "runs": ninja_runs(on_path, env) if on_path else None}


_NOT_FOUND = re.compile(r"(?P<provider>/\S+): version `(?P<version>[^']+)' not found")


def _version_of(ninja: str, env: dict[str, str]) -> dict[str, Any]:
    ev = run([ninja, "--version"], env=env, timeout=NINJA_TIMEOUT, label=f"{ninja} --version")
    return {"ok": ev.exit_code == 0 and not ev.error, "exit_code": ev.exit_code,
            "version": (ev.stdout or "").strip()[:40] or None,
            "error": ((ev.stderr or "").strip() or ev.error or "")[-800:] or None}


def ninja_runs(ninja: str, env: dict[str, str]) -> dict[str, Any]:
    """``ninja --version`` under the training environment, as torch runs it before every JIT build. When the
    loader stops it on a library an LD_LIBRARY_PATH entry supplies, the run is tried again without that
    entry (the change the remedy would make, tried before it is offered)."""
    from ..forensics.remedies import split_path_list, without_entries

    out = _version_of(ninja, env)
    m = _NOT_FOUND.search(out.get("error") or "") if not out["ok"] else None
    if m:
        out["provider"], out["missing_version"] = m.group("provider"), m.group("version")
        entries = [e for e in split_path_list(env.get("LD_LIBRARY_PATH"))
                   if e and os.path.normpath(e) == os.path.dirname(os.path.normpath(m.group("provider")))]
        if entries:
            trial_env = dict(env)
            trial_env["LD_LIBRARY_PATH"] = without_entries(env.get("LD_LIBRARY_PATH"), entries)
            if not trial_env["LD_LIBRARY_PATH"]:
                del trial_env["LD_LIBRARY_PATH"]
            out["without_entries"] = {"entries": entries, "ld_library_path": trial_env.get("LD_LIBRARY_PATH"),
                                      "old": env.get("LD_LIBRARY_PATH"), **_version_of(ninja, trial_env)}
    return out


def python_include(python: str | None, env: dict[str, str]) -> tuple[dict[str, Any], Evidence | None]:
    if not python:
        return {"include": None, "python_h": None, "error": "no training interpreter"}, None
    ev = run([python, "-c", PATHS_CODE], env=env, timeout=30, label="sysconfig.get_paths() of the training Python")
    try:
        d = json.loads((ev.stdout or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"include": None, "python_h": None, "error": ev.error or (ev.stderr or "").strip()[-300:]
                or "no answer"}, ev
    inc = (d.get("paths") or {}).get("include")
    base = d.get("base_prefix") or d.get("prefix")
    # a venv's headers are its base interpreter's: that installation is the one to complete
    return {"include": inc, "python_h": bool(inc and os.path.isfile(os.path.join(inc, "Python.h"))),
            "version": d.get("version"), "prefix": d.get("prefix"), "base_prefix": base,
            "base_executable": d.get("base_executable"),
            "base_is_conda": bool(base and os.path.isdir(os.path.join(base, "conda-meta"))), "error": None}, ev


def compile_test(cxx: str | None, env: dict[str, str], include: str | None) -> tuple[dict[str, Any], list[Evidence]]:
    """Compile ``int main(){}`` and a file that includes Python.h with the JIT compiler, as torch would."""
    if not cxx:
        return {"compiler": None, "plain": None, "with_python_h": None}, []
    out: dict[str, Any] = {"compiler": cxx}
    evs = []
    with tempfile.TemporaryDirectory(prefix="zdoctor-cc-") as tmp:
        plain = os.path.join(tmp, "one_line.cpp")
        with open(plain, "w") as fh:
            fh.write("int main() { return 0; }\n")
        ev = run([cxx, "-c", plain, "-o", os.path.join(tmp, "one_line.o")], env=env, timeout=COMPILE_TIMEOUT,
                 label=f"{cxx} -c one_line.cpp")
        evs.append(ev)
        out["plain"] = {"ok": ev.exit_code == 0, "error": ev.error, "stderr": (ev.stderr or "")[-1500:]}
        if include:
            withpy = os.path.join(tmp, "with_python_h.cpp")
            with open(withpy, "w") as fh:
                fh.write("#include <Python.h>\nint main() { return Py_IsInitialized(); }\n")
            ev = run([cxx, f"-I{include}", "-c", withpy, "-o", os.path.join(tmp, "with_python_h.o")], env=env,
                     timeout=COMPILE_TIMEOUT, label=f"{cxx} -I{include} -c with_python_h.cpp")
            evs.append(ev)
            out["with_python_h"] = {"ok": ev.exit_code == 0, "error": ev.error,
                                    "stderr": (ev.stderr or "")[-1500:]}
        else:
            out["with_python_h"] = None
    return out, evs


def collect_jitprereq(env: dict[str, str], python: str | None, cxx: str | None,
                      etc_environment: str = "/etc/environment") -> tuple[dict[str, Any], list[Evidence]]:
    ninja = find_ninja(env, python, etc_environment)
    inc, inc_ev = python_include(python, env)
    cc, cc_ev = compile_test(cxx, env, inc.get("include") if inc.get("python_h") else None)
    facts = {"python": python, "ninja": ninja, "python_headers": inc, "compile": cc}
    runs = ninja.get("runs") or {}
    rows = [["ninja on the training PATH", (ninja["on_path"] or "not found")
             + ("" if not ninja["on_path"] else f" (runs: {runs.get('version')})" if runs.get("ok")
                else " (does NOT run under the training environment)")],
            ["ninja beside the interpreter", ninja["beside_interpreter"] or "no"],
            [f"ninja on a pdsh/ssh shell's PATH ({ninja['noninteractive_source']})",
             ninja["on_noninteractive_path"] or "not found"],
            ["Python.h", (os.path.join(inc["include"], "Python.h") if inc.get("include") else "?")
             + (" (present)" if inc.get("python_h") else " (missing)")],
            [f"{cxx or 'no compiler'}: one-line C++ file", _word((cc.get("plain") or {}).get("ok"))],
            [f"{cxx or 'no compiler'}: a file including Python.h", _word((cc.get("with_python_h") or {}).get("ok"))]]
    return facts, [Evidence.of_table("JIT build prerequisites", ["what", "found"], rows),
                   *([inc_ev] if inc_ev else []), *cc_ev]


def _word(ok: bool | None) -> str:
    return "compiles" if ok else "not tried" if ok is None else "FAILS"


@probe("jitprereq", title="JIT build prerequisites: ninja, Python.h, a compiler that compiles", timeout=180,
       needs=("pyenv", "toolchain"))
def jitprereq_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    env = dict(getattr(host, "env", None) or os.environ)
    py = host.result("pyenv")
    pyf = py.facts if py.status == "ok" else {}
    python = (pyf.get("python") or {}).get("executable") or None
    tc = host.result("toolchain")
    jit = ((tc.facts if tc.status == "ok" else {}) or {}).get("jit") or {}
    return collect_jitprereq(env, python, jit.get("path"))
