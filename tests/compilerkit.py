"""Compilers that take their time, built for a test: the real g++ with each of its passes held by a
sleeping tool, optionally in a session of its own, optionally killing the keeper zdoctor runs it under."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: A tool gcc starts each of its passes under (``g++ -wrapper``): it notes that it runs, then sleeps.
SLOW_TOOL = """#!/bin/sh
echo $$ >> {marks}/slow-tool.pids
sleep 1000
exec "$@"
"""


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def slow_compiler(tmp: Path, *, own_session: bool = False, kill_keeper: bool = False) -> Path:
    """A CXX that runs the real g++ with every pass of a compile (``-c``) held by a sleeping tool: with
    ``own_session`` the g++ runs in a session of its own (as a compiler ninja starts in a group of its own);
    with ``kill_keeper`` the wrapper then kills the keeper zdoctor runs it under (its parent) outright."""
    tool = write_exe(tmp / "slow-tool", SLOW_TOOL.format(marks=tmp))
    gxx = f"{'setsid ' if own_session else ''}g++ -wrapper {tool} \"$@\""
    # Only a compile is held: the compiler's own questions (-dumpversion, -print-prog-name) answer at once.
    body = 'case " $* " in *" -c "*) ;; *) exec g++ "$@" ;; esac\n'
    body += f"{gxx} &\nwhile [ ! -s {tmp}/slow-tool.pids ]; do sleep 0.05; done\n"
    body += "kill -9 $PPID\n" if kill_keeper else ""
    return write_exe(tmp / "slow-cxx", f"#!/bin/sh\n{body}wait\n")


def compile_started(marks: Path) -> bool:
    """Whether a pass of :func:`slow_compiler`'s g++ runs (its temporary files are made by then)."""
    path = marks / "slow-tool.pids"
    return path.exists() and bool(path.read_text().strip())


#: The temporary directory of a zdoctor started without TMPDIR, TMP or TEMP (Python's and GCC's first choice).
DEFAULT_TMP = Path("/tmp")


def without_tmpdir(env: dict[str, str]) -> dict[str, str]:
    """``env`` naming no temporary directory: zdoctor's run folder and GCC's files go to :data:`DEFAULT_TMP`."""
    return {k: v for k, v in env.items() if k not in ("TMPDIR", "TMP", "TEMP")}


def check_killed_mid_compile(marks: Path, repo: Path, before_kill: Callable[[int], None] | None = None) -> int:
    """Start ``zdoctor check --playbook toolchain`` (no TMPDIR: its run folder is made in
    :data:`DEFAULT_TMP`) with a :func:`slow_compiler` (made in ``marks``) as CXX, SIGKILL it once its compile
    test runs (``before_kill`` is called with its pid first); its pid."""
    env = {**without_tmpdir(dict(os.environ)), "CXX": str(slow_compiler(marks)), "NO_COLOR": "1"}
    zd = subprocess.Popen([sys.executable, "-m", "zdoctor", "check", "--json", "--no-log", "--playbook", "toolchain"],
                          env=env, cwd=str(repo), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          stdin=subprocess.DEVNULL)
    try:
        while not compile_started(marks):
            if zd.poll() is not None:
                raise RuntimeError("zdoctor ended before its compile test ran")
            time.sleep(0.1)
        if before_kill is not None:
            before_kill(zd.pid)
    finally:
        zd.send_signal(signal.SIGKILL)
        zd.wait()
    return zd.pid


def defunct_children(pid: int) -> list[str]:
    """The ``<defunct>`` (exited, not reaped) children of process ``pid``, as ``PID (name)``."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            data = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[0] == b"Z" and int(fields[1]) == pid:
            found.append(data[:data.rfind(b")") + 1].decode("ascii", "replace"))
    return found


#: A zdoctor run's work in the fallback places, made by zdoctor's own code, until it is killed: the compile
#: test's folder in /var/tmp (the temporary directory takes no folder) with the compiler's cc*.s in it, and
#: the /dev/shm write test's folder; it says "made" once both are there.
LEFT_IN_FALLBACKS = """
import os, sys, tempfile, time
from zdoctor.proc import scratch
from zdoctor.layers.toolchain.probe_jitprereq import scratch_dir
tempfile.tempdir = sys.argv[1]  # gone: the compile test falls back to /var/tmp
cc, why = scratch_dir(("/var/tmp", "/dev/shm"), {"one_line.cpp": "int one_line;\\n"})
assert cc is not None, why
with open(os.path.join(cc, "ccA1b2C3.s"), "w") as fh:
    fh.write("compiler output")
with open(os.path.join(scratch.run_folder("/dev/shm"), "done"), "w") as fh:
    fh.write("made")
print("made", flush=True)
time.sleep(600)
"""
#: The fallback places zdoctor's probes write in besides the temporary directory.
FALLBACK_PLACES = (Path("/var/tmp"), Path("/dev/shm"))


def killed_with_fallback_folders(tmp: Path, repo: Path) -> tuple[int, list[Path]]:
    """A run of zdoctor's own code that made its folders in /var/tmp and /dev/shm, SIGKILLed (and reaped):
    its pid, and the folders it left."""
    from zdoctor.proc.scratch import PREFIX, pid_namespace

    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen([sys.executable, "-c", LEFT_IN_FALLBACKS, str(tmp / "no-temporary-directory")],
                            env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        said = proc.stdout.readline() if proc.stdout else ""
        assert said.strip() == "made", f"the run did not make its folders (exit {proc.poll()})"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
    left = [p for place in FALLBACK_PLACES for p in place.glob(f"{PREFIX}{pid_namespace()}-{proc.pid}-*")]
    return proc.pid, left
