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

from zdoctor.core.factstypes import JitprereqFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.proc import scratch
from zdoctor.proc.runner import run
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.mounts import existing_ancestor, mount_of

#: What sshd gives a non-interactive session when /etc/environment sets no PATH (OpenSSH's default).
SSHD_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
COMPILE_TIMEOUT = 60.0
#: The compile test's sources: a one-line C++ file and one that includes Python.h.
SOURCES = {"one_line.cpp": "int main() { return 0; }\n",
           "with_python_h.cpp": "#include <Python.h>\nint main() { return Py_IsInitialized(); }\n"}
#: What the C library says for ENOSPC, in the compiler's, the assembler's and the linker's messages.
NO_SPACE = "No space left on device"
#: Folders tried as the compiler's TMPDIR when its own is full (each must exist, be writable and have room).
TMP_CANDIDATES = ("/var/tmp", "/dev/shm")
#: The room a folder needs to be offered as TMPDIR for a JIT build (the largest op's objects fit with margin).
ROOM_BYTES = 1 << 30
#: The compiler driver could not start one of its own passes (GCC's "cannot execute 'cc1plus': execvp: No
#: such file or directory"): the pass it names.
BACK_END_MISSING = re.compile(r"cannot execute [\u2018'](?P<prog>cc1plus|cc1|collect2|as|ld)[\u2019']")
#: At most this many folders are tried.
TRIALS = 2
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
    from zdoctor.trials.remedies import split_path_list, without_entries

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


def compile_test(cxx: str | None, env: dict[str, str], include: str | None,
                 tmp_candidates: tuple[str, ...] = TMP_CANDIDATES) -> tuple[dict[str, Any], list[Evidence]]:
    """Compile ``int main(){}`` and a file that includes Python.h with the JIT compiler, as torch would. The
    sources and objects live in a scratch folder of zdoctor's; the compiler's own temporary files go there
    too when ``env`` sets no TMPDIR and GCC's default is on the same file system (so a killed run leaves
    none behind, and a full one fails alike), else where ``env`` sends them, as in the JIT build. A compile
    that stops on "No space left on device" adds ``no_space``: the full folder and a re-run with TMPDIR in
    one with room (:func:`no_space`)."""
    if not cxx:
        return {"compiler": None, "plain": None, "with_python_h": None}, []
    out: dict[str, Any] = {"compiler": cxx}
    evs = []
    tmp, why = scratch_dir(tmp_candidates, SOURCES)
    if tmp is None:
        return {"compiler": cxx, "plain": None, "with_python_h": None, "error": why}, []
    compile_env = with_tmpdir_in(env, tmp)
    try:
        plain = os.path.join(tmp, "one_line.cpp")
        argv = [cxx, "-c", plain, "-o", os.path.join(tmp, "one_line.o")]
        ev = run(argv, env=compile_env, timeout=COMPILE_TIMEOUT, label=f"{cxx} -c one_line.cpp")
        evs.append(ev)
        out["plain"] = {"ok": ev.exit_code == 0, "error": ev.error, "stderr": (ev.stderr or "")[-1500:]}
        failed = [] if out["plain"]["ok"] else [argv]
        if include:
            withpy = os.path.join(tmp, "with_python_h.cpp")
            py_argv = [cxx, f"-I{include}", "-c", withpy, "-o", os.path.join(tmp, "with_python_h.o")]
            ev = run(py_argv, env=compile_env, timeout=COMPILE_TIMEOUT, label=f"{cxx} -I{include} -c with_python_h.cpp")
            evs.append(ev)
            out["with_python_h"] = {"ok": ev.exit_code == 0, "error": ev.error,
                                    "stderr": (ev.stderr or "")[-1500:]}
            failed += [] if out["with_python_h"]["ok"] else [py_argv]
        else:
            out["with_python_h"] = None
        said = "\n".join(str((out.get(k) or {}).get("stderr") or "") for k in ("plain", "with_python_h"))
        missing = BACK_END_MISSING.search(said)
        if failed and missing:
            out["back_end"], back_evs = back_end(cxx, env, missing.group("prog"))
            evs += back_evs
        if failed and NO_SPACE in said:
            out["no_space"], trial_evs = no_space(failed, env, tmp_candidates)
            evs += trial_evs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out, evs


def back_end(cxx: str, env: dict[str, str], prog: str) -> tuple[dict[str, Any], list[Evidence]]:
    """Where the driver ``cxx`` looks for its pass ``prog`` and whether it is there, as GCC answers itself:
    ``-print-prog-name`` (the full path when found, the bare name when not), ``-dumpversion``, ``-dumpmachine``
    and the ``programs:`` directories of ``-print-search-dirs``. ``expected`` is the version's own directory
    among them (``.../gcc/x86_64-linux-gnu/12/``), where the distribution's package puts it."""
    evs = [run([cxx, f"-print-prog-name={prog}"], env=env, timeout=NINJA_TIMEOUT,
               label=f"{cxx} -print-prog-name={prog}"),
           run([cxx, "-dumpversion"], env=env, timeout=NINJA_TIMEOUT, label=f"{cxx} -dumpversion"),
           run([cxx, "-dumpmachine"], env=env, timeout=NINJA_TIMEOUT, label=f"{cxx} -dumpmachine"),
           run([cxx, "-print-search-dirs"], env=env, timeout=NINJA_TIMEOUT, label=f"{cxx} -print-search-dirs")]
    said = [(ev.stdout or "").strip() if ev.exit_code == 0 else "" for ev in evs]
    named, version, machine, dirs_text = said
    found = named if os.path.isabs(named) and os.access(named, os.X_OK) else None
    programs = next((line.split("=", 1)[-1] for line in dirs_text.splitlines() if line.startswith("programs:")), "")
    searched = [d for d in programs.split(":") if d][:12]
    tail = f"/gcc/{machine}/{version}/" if machine and version else None
    expected = next((os.path.normpath(d) for d in searched if tail and d.endswith(tail)), None)
    driver = shutil.which(cxx, path=env.get("PATH")) if not os.path.isabs(cxx) else cxx
    return {"program": prog, "found": found, "version": version or None, "machine": machine or None,
            "searched": searched, "expected": os.path.join(expected, prog) if expected else None,
            "driver": os.path.realpath(driver) if driver else None}, evs


def scratch_dir(candidates: tuple[str, ...], files: dict[str, str]) -> tuple[str | None, str]:
    """A private folder holding ``files`` (name: text) for the compile test: in this run's folder
    (:mod:`zdoctor.proc.scratch`), else in the first candidate that takes them all (a full /tmp must not stop the
    test that finds it full)."""
    errors = []
    for where in (None, *candidates):
        tmp = None
        try:
            tmp = scratch.private_dir("cc-", where)
            for name, text in files.items():
                with open(os.path.join(tmp, name), "w") as fh:
                    fh.write(text)
            return tmp, ""
        except OSError as e:
            errors.append(f"{where or tempfile.gettempdir()}: {e.strerror or e}")
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    return None, "no folder for the compile test: " + "; ".join(errors)


def with_tmpdir_in(env: dict[str, str], folder: str) -> dict[str, str]:
    """``env`` with TMPDIR at ``folder`` when ``env`` names no temporary directory of its own and GCC's
    default one is on the same file system (the compiler then writes where it would have, as far as room
    goes); ``env`` as it is otherwise (a TMPDIR the user set is the one the JIT build uses)."""
    where, chosen_by = compiler_tmpdir(env)
    if chosen_by.startswith("$"):
        return env
    try:
        same = os.stat(where).st_dev == os.stat(folder).st_dev
    except OSError:
        same = False
    return {**env, "TMPDIR": folder} if same else env


def compiler_tmpdir(env: dict[str, str]) -> tuple[str, str]:
    """(directory, what chose it): where GCC writes its temporary files under ``env`` (libiberty's
    choose_tmpdir: $TMPDIR, $TMP, $TEMP, then /var/tmp, /usr/tmp, /tmp, the first that is a directory it may
    read, write and enter)."""
    for var in ("TMPDIR", "TMP", "TEMP"):
        d = env.get(var)
        if d and os.path.isdir(d) and os.access(d, os.R_OK | os.W_OK | os.X_OK):
            return d, f"${var}"
    for d in ("/var/tmp", "/usr/tmp", "/tmp"):
        if os.path.isdir(d) and os.access(d, os.R_OK | os.W_OK | os.X_OK):
            return d, "GCC's default (no usable $TMPDIR, $TMP or $TEMP)"
    return ".", "the current directory (no usable temporary directory)"


def fullness(path: str) -> dict[str, Any]:
    """How full the file system holding ``path`` is: free (to users) and total bytes and inodes, and the
    mount it is (point, type, source); ``error`` when statvfs fails."""
    probed = existing_ancestor(path)
    out: dict[str, Any] = {"path": path, "probed": probed, "mount": mount_of(probed)}
    try:
        st = os.statvfs(probed)
    except OSError as e:
        return {**out, "error": e.strerror or str(e)}
    return {**out, "avail_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize,
            "avail_inodes": st.f_favail, "total_inodes": st.f_files, "dev": os.stat(probed).st_dev}


def roomy_dirs(full_dev: int | None, candidates: tuple[str, ...], need: int = ROOM_BYTES) -> list[str]:
    """Existing folders this process may write into, on another file system than the full one, with at
    least ``need`` bytes free."""
    out = []
    for d in candidates:
        f = fullness(d) if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK) else {}
        if f.get("dev") not in (None, full_dev) and (f.get("avail_bytes") or 0) >= need and f.get("avail_inodes"):
            out.append(d)
    return out


def no_space(failed: list[list[str]], env: dict[str, str], candidates: tuple[str, ...]
             ) -> tuple[dict[str, Any], list[Evidence]]:
    """A compile stopped on ENOSPC: the compiler's temporary directory and how full it is, the op's build
    directory under the JIT cache, and the failing compiles re-run with TMPDIR set to a folder with room
    (``ok`` only when every one of them then compiles; the first such folder ends the trials; at most
    :data:`TRIALS`)."""
    from zdoctor.readers.jitcache import cache_base

    tmpdir, chosen_by = compiler_tmpdir(env)
    full = fullness(tmpdir)
    base, base_source = cache_base(env)
    home = env.get("HOME")
    own = tuple(x for x in (base, os.path.join(home, ".cache") if home else None) if x)
    trials: list[dict[str, Any]] = []
    evs = []
    for d in roomy_dirs(full.get("dev"), (*candidates, *own))[:TRIALS]:
        inside = _shared_place_folder(d)
        try:
            runs = [run(argv, env={**env, "TMPDIR": inside or d}, timeout=COMPILE_TIMEOUT,
                        label=f"TMPDIR={inside or d} {argv[0]} -c ...") for argv in failed]
        finally:
            if inside:
                shutil.rmtree(inside, ignore_errors=True)
        evs += runs
        bad = [ev for ev in runs if ev.exit_code != 0]
        trials.append({"tmpdir": d, "ok": not bad,
                       "stderr": "".join((ev.stderr or ev.error or "") for ev in bad)[-600:]})
        if not bad:
            break
    return {"tmpdir": tmpdir, "chosen_by": chosen_by, "tmpdir_set": env.get("TMPDIR"), "space": full,
            "build_base": base, "build_base_source": base_source, "build_space": fullness(base),
            "trials": trials}, evs


def _shared_place_folder(place: str) -> str | None:
    """A folder of this run in ``place`` when it is a shared temporary place (the temporary directory, /var/tmp,
    /dev/shm), for the compiler's own files there (swept should the run be killed); None elsewhere (a folder
    of the user's own, where zdoctor makes nothing) or when ``place`` takes no folder."""
    shared = {os.path.realpath(p) for p in (tempfile.gettempdir(), *scratch.FALLBACK_PLACES)}
    if os.path.realpath(place) not in shared:
        return None
    try:
        return scratch.private_dir("cc-", place)
    except OSError:
        return None


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
       needs=("pyenv", "toolchain"), facts=JitprereqFacts)
def jitprereq_probe(host) -> tuple[dict[str, Any], list[Evidence]]:
    env = dict(getattr(host, "env", None) or os.environ)
    py = host.result("pyenv")
    pyf = py.facts if py.status == "ok" else {}
    python = (pyf.get("python") or {}).get("executable") or None
    tc = host.result("toolchain")
    jit = ((tc.facts if tc.status == "ok" else {}) or {}).get("jit") or {}
    return collect_jitprereq(env, python, jit.get("path"))
