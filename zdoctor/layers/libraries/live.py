"""Confirm the prediction live: run the real command under ``LD_DEBUG`` (and ``strace`` when it works).

The command runs once, with the target environment plus ``LD_DEBUG=libs,files,versions`` and
``LD_DEBUG_OUTPUT`` pointing into a private temporary directory, so the user-visible stderr stays
clean and every process of the command gets its own trace file. zdoctor's own environment is never
changed. With strace, ``LD_*`` variables go to the traced command through ``strace -E`` so strace itself
runs without them (an ``LD_LIBRARY_PATH`` that breaks the command must not break the tracer).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.core.errors import UsageError
from zdoctor.core.model import Evidence
from zdoctor.layers.libraries.lddebug import (
    PidTrace,
    VersionError,
    all_version_errors,
    parse_ld_debug_dir,
    summarize,
    which_loaded,
)
from zdoctor.layers.libraries.strace import (
    FileEvent,
    last_files,
    lines_that_matter,
    parse_strace,
    refused_creates,
    unfinished,
)
from zdoctor.layers.ranks.rankjob import collect_ranks
from zdoctor.proc import children, codeowner
from zdoctor.proc.leftovers import named_entries, process_gone
from zdoctor.proc.runas import RunAs
from zdoctor.proc.runner import run, which_all
from zdoctor.proc.systools import system_tool
from zdoctor.proc.userfile import open_regular_text
from zdoctor.readers.stuck import StuckSampler, building, describe
from zdoctor.scripts import script_path
from zdoctor.trials.jitguard import run_guarded

LD_DEBUG_CATEGORIES = "libs,files,versions"
STRACE_TRACE = "trace=openat,open,execve,stat,lstat,newfstatat,statx,access,faccessat,faccessat2"
#: What a run traced from its start records where strace can filter in the kernel (``--seccomp-bpf``): the
#: loader's and the program's opens and every exec. Only these calls then stop the command; the stat family
#: (most of a Python import's calls) ran a torch import three times slower. A run that is still going after
#: its first seconds is sampled in /proc (state, wchan) as every hung run is.
STRACE_TRACE_FROM_START = "trace=openat,open,execve"
STRACE_STRLEN = "512"
#: Most of the strace log that is read back (its tail: what the processes did last).
MAX_STRACE_BYTES = 20 * 1024 * 1024
SYSTEM_PRELOAD = "/etc/ld.so.preload"
#: The default probe: the training interpreter's own probe, in its traced mode.
PROBE_SCRIPT = "probe_script.py"

#: ``/x/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /y/ext.so)`` as Python's
#: ImportError or ld.so's startup message shows it.
STDERR_VERSION_ERROR = re.compile(
    r"(?P<provider>[^\s:][^:\n]*): (?P<weak>weak )?version `(?P<version>[^'\n]+)' not found "
    r"\(required by (?P<required_by>[^\n]+)\)"
)


@dataclass
class LiveTrace:
    """What the real loader did while running ``argv``."""

    argv: list[str]
    exit_code: int | None
    timed_out: bool
    evidence: Evidence
    traces: dict[int, PidTrace] = field(default_factory=dict)
    libstdcxx: list[tuple[int, str, str, str | None]] = field(default_factory=list)
    version_errors: list[VersionError] = field(default_factory=list)
    stderr_version_errors: list[VersionError] = field(default_factory=list)
    last_files: dict[int, list[FileEvent]] = field(default_factory=dict)
    #: Calls a process was still inside when the trace stopped (strace only): where a hang sits.
    pending_calls: list[FileEvent] = field(default_factory=list)
    #: strace's own lines that matter (strace only): the open of each libstdc++ copy, the call a hang waits in.
    strace_lines: list[str] = field(default_factory=list)
    #: Each process of a run that hit its time limit, as sampled just before: state and wchan.
    stuck_states: list[str] = field(default_factory=list)
    #: The build tools still at work when a run hit its time limit ({pid, comm, file, running_s}): a JIT
    #: build that was still compiling, not a hang.
    compiling: list[dict[str, str]] = field(default_factory=list)
    #: Files the run tried to create exclusively and found there (strace only): the locks it found taken.
    refused_locks: list[str] = field(default_factory=list)
    #: The ranks of a run that hit its time limit, read a little before it
    #: (:mod:`zdoctor.layers.ranks.rankjob`), or None.
    ranks: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    strace_available: bool = False
    strace_used: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON view: the traces are summarized (what was loaded from where, errors), not copied whole."""
        return {
            "argv": list(self.argv),
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "evidence": self.evidence.to_dict(),
            "traces": summarize(self.traces),
            "libstdcxx": [list(row) for row in self.libstdcxx],
            "version_errors": [asdict(e) for e in self.version_errors],
            "stderr_version_errors": [asdict(e) for e in self.stderr_version_errors],
            "last_files": {str(pid): [e.to_dict() for e in evs] for pid, evs in self.last_files.items()},
            "pending_calls": [e.to_dict() for e in self.pending_calls],
            "strace_lines": list(self.strace_lines),
            "stuck_states": list(self.stuck_states),
            "compiling": [dict(c) for c in self.compiling],
            "refused_locks": list(self.refused_locks),
            "ranks": self.ranks,
            "notes": list(self.notes),
            "strace_available": self.strace_available,
            "strace_used": self.strace_used,
        }


def parse_stderr_version_errors(text: str) -> list[VersionError]:
    """Version errors as the user sees them (ImportError text, or ld.so's message at program start)."""
    out: list[VersionError] = []
    for m in STDERR_VERSION_ERROR.finditer(text or ""):
        err = VersionError(provider=m["provider"].strip(), version=m["version"],
                           required_by=m["required_by"].strip(), fatal=not m["weak"], message=m.group(0),
                           weak=bool(m["weak"]))
        if err not in out:
            out.append(err)
    return out


def _preload_entries(value: str | None) -> list[str]:
    return [p for p in re.split(r"[\s:]+", value or "") if p]


def _system_preload() -> list[str]:
    try:
        with open_regular_text(SYSTEM_PRELOAD, encoding="utf-8", errors="replace") as fh:
            text = fh.read(64 * 1024)
    except OSError:
        return []
    return [w for line in text.splitlines() for w in line.split("#", 1)[0].split() if w]


def _resolves(prog: str, path: str, cwd: str | None) -> bool:
    """Whether ``prog`` names an executable the way exec would find it (relative paths from ``cwd``)."""
    if "/" in prog:
        full = os.path.join(cwd or os.getcwd(), prog)
        return os.path.isfile(full) and os.access(full, os.X_OK)
    return bool(which_all(prog, path))


def _strace_problem(strace: str, seccomp: bool = False) -> str | None:
    """None when ``strace`` can trace here (with ``seccomp``: filtering in the kernel, strace 5.3 and
    newer on a kernel with seccomp); else why not (ptrace is often refused in containers)."""
    flags = ["-f", "--seccomp-bpf", "-e", STRACE_TRACE_FROM_START] if seccomp else []
    ev = run([strace, *flags, "-o", os.devnull, "--", strace, "-V"], env={"PATH": os.defpath}, timeout=15,
             label="strace self-test" + (" (--seccomp-bpf)" if seccomp else ""))
    if ev.exit_code == 0:
        return None
    why = (ev.stderr.strip().splitlines() or [ev.error or f"exit status {ev.exit_code}"])[-1]
    return why


def strace_from_start(strace: str, log: str, kernel_filter: bool = True) -> tuple[list[str] | None, str | None]:
    """The strace prefix for a run traced from its start, or None and why strace cannot trace here. Where
    the kernel can filter (``--seccomp-bpf``) and ``kernel_filter`` allows it, only
    :data:`STRACE_TRACE_FROM_START` is traced.

    The filter sets no_new_privs on the command: a set-user-ID program it runs gains nothing. Traced by root,
    a command dropped to the training user would lose what its ``sudo`` gives it untraced, so such a run
    is traced without the filter."""
    if kernel_filter and _strace_problem(strace, seccomp=True) is None:
        return [strace, "-f", "--seccomp-bpf", "-tt", "-e", STRACE_TRACE_FROM_START, "-o", log, "-s",
                STRACE_STRLEN, "--"], None
    problem = _strace_problem(strace)
    if problem is not None:
        return None, problem
    return [strace, "-f", "-tt", "-e", STRACE_TRACE, "-o", log, "-s", STRACE_STRLEN, "--"], None


class _StraceTail:
    """strace writes its log into a FIFO that this reads as it comes, keeping only the last ``limit`` bytes:
    a busy command makes strace write about 100 MiB a minute, which now costs neither disk nor memory."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit
        self.buf = bytearray()
        self.total = 0
        self.done = threading.Event()
        os.mkfifo(path, 0o600)
        # Opened before strace starts (its open for writing then returns at once); non-blocking, so an
        # end of input before strace opened it is told from the end by ``done``.
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        """Read until strace is done; the descriptor is closed here, by its only reader, never under it
        (closed from another thread, its number could be reused by another command's pipe while this reads)."""
        try:
            self._read_all()
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def _read_all(self) -> None:
        import select

        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            try:
                chunk = os.read(self.fd, 1 << 16) if ready else b""
            except BlockingIOError:
                chunk = b""
            except OSError:
                break
            if chunk:
                self.total += len(chunk)
                self.buf += chunk
                if len(self.buf) > 2 * self.limit:  # trim in batches
                    del self.buf[: len(self.buf) - self.limit]
            elif self.done.is_set():
                break
            elif ready:  # no writer (yet, or any more): wait a little
                time.sleep(0.05)

    def text(self) -> tuple[str, bool]:
        """What strace wrote (its last ``limit`` bytes, from a line start when cut); call after strace ended."""
        self.done.set()
        self.thread.join(10)
        data = bytes(self.buf[-self.limit:])
        cut = self.total > len(data)
        if cut:
            data = data[data.find(b"\n") + 1:]
        return data.decode("utf-8", "surrogateescape"), cut


def _cannot_trace(problem: str) -> str:
    return f"strace cannot trace here ({problem}): ran without it; hang analysis limited to LD_DEBUG"


class _SelfTest:
    """strace's self-test (:func:`_strace_problem`), run in a thread of its own from the start."""

    def __init__(self, strace: str) -> None:
        self._box: list[str | None] = []
        self._thread = threading.Thread(target=lambda: self._box.append(_strace_problem(strace)), daemon=True)
        self._thread.start()

    def problem(self) -> str | None:
        """Why strace cannot trace here, None when it can (waits for the self-test's end)."""
        children.join(self._thread)
        return self._box[0] if self._box else "its self-test did not finish"


class _LateAttach:
    """Attach strace to a running process tree after a delay, and detach when asked."""

    def __init__(self, strace: str, log: str, delay: float, self_test: _SelfTest) -> None:
        self.strace, self.log, self.delay, self.self_test = strace, log, delay, self_test
        self.proc: subprocess.Popen[bytes] | None = None
        self.timer: threading.Timer | None = None
        self.attached = False
        self.lock = threading.Lock()

    def start(self, pid: int) -> None:
        self.timer = threading.Timer(self.delay, self._attach, args=(pid,))
        self.timer.daemon = True
        self.timer.start()

    def _attach(self, pid: int) -> None:
        import psutil

        if self.self_test.problem() is not None:
            return
        try:
            root = psutil.Process(pid)
            pids = [pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.Error:
            return
        argv = [self.strace, "-f", "-tt", "-e", STRACE_TRACE, "-o", self.log, "-s", STRACE_STRLEN]
        for p in pids:
            argv += ["-p", str(p)]
        with self.lock:
            try:
                # Its own group, ended with zdoctor; no parent-death signal: the timer thread that
                # starts it exits at once, and the kernel would take that for the parent's death.
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)
                children.register(self.proc.pid)
                self.attached = True
            except OSError:
                self.proc = None

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()  # strace detaches from its tracees on SIGTERM
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self.proc is not None:
                children.forget(self.proc.pid)


TRACE_PREFIX = "zdoctor-trace-"
_TRACE_DIR = re.compile(re.escape(TRACE_PREFIX) + r"(\d+)-[A-Za-z0-9_]+$")


def sweep_stale_trace_dirs(root: str | None = None) -> list[str]:
    """Remove the trace folders (``zdoctor-trace-PID-xxxx``) that a zdoctor killed mid-run left behind:
    only this user's real directories, and only when the process PID in the name is gone. Returns them."""
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    for name, m in named_entries(root, _TRACE_DIR):
        pid = int(m.group(1))
        if pid == os.getpid():
            continue
        full = os.path.join(root, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or not process_gone(pid):
            continue  # not this user's folder, or its zdoctor still runs
        shutil.rmtree(full, ignore_errors=True)
        removed.append(full)
    return removed


def trace_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float = 120,
    cwd: str | None = None,
    use_strace: bool = True,
    strace_after: float | None = None,
    run_as: RunAs | None = None,
    on_stdout: Callable[[bytes], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> LiveTrace:
    """Run ``argv`` once under ``LD_DEBUG`` (and strace when usable) and report what the loader did.

    ``env`` is the complete environment of the command (it is copied, never changed). On timeout the
    whole process group is killed; ``last_files`` then shows what each process opened last.
    With ``strace_after``, the command starts without strace (strace slows a big import by a third)
    and strace attaches to it, and its children, only once it has run that many seconds: a run that
    finishes normally costs nothing extra, and one that hangs still names what it was touching.
    With ``run_as`` the command runs as that account (strace, when it runs the command, stays root and
    starts it with ``-u``); its LD_DEBUG logs go to a folder of its own that zdoctor only reads.
    ``on_stdout`` sees the command's output as it comes, and ``on_start`` the keeper's pid once the command
    runs (:func:`zdoctor.proc.runner.run`).
    """
    argv = [str(a) for a in argv]
    if not argv or not argv[0]:
        raise UsageError("no command to trace")
    if run_as is None:  # the runner's rule, known ahead: the LD_DEBUG folder is shared with that account
        run_as = codeowner.runs_as(argv, env, cwd)
    notes: list[str] = []
    path = env.get("PATH", os.defpath)
    sweep_stale_trace_dirs()
    tmp = tempfile.mkdtemp(prefix=f"{TRACE_PREFIX}{os.getpid()}-")
    strace_tail: _StraceTail | None = None
    try:
        ld_dir = tmp
        if run_as is not None:
            os.chmod(tmp, 0o711)  # the account may enter, not list or write
            ld_dir = os.path.join(tmp, "ld-logs")
            os.mkdir(ld_dir, 0o700)
            os.chown(ld_dir, run_as.uid, run_as.gid)
            env = run_as.child_env(env)
        ld_prefix = os.path.join(ld_dir, "ld")
        ld_vars = {"LD_DEBUG": LD_DEBUG_CATEGORIES, "LD_DEBUG_OUTPUT": ld_prefix}
        strace_found = which_all("strace", path) if use_strace else []
        if use_strace and run_as is not None:  # strace stays root: never the one on the user's PATH
            strace_found = [t for t in [system_tool("strace")] if t]
        strace_ok = False
        if use_strace and not strace_found:
            notes.append("strace not installed: hang analysis limited to LD_DEBUG")
        strace_log = os.path.join(tmp, "strace")
        prefix: list[str] | None = None
        self_test: _SelfTest | None = None  # strace joining later is tested beside the run, not before it
        if strace_found:
            problem = None
            if strace_after:
                self_test = _SelfTest(strace_found[0])
            else:
                prefix, problem = strace_from_start(strace_found[0], strace_log, kernel_filter=run_as is None)
            if problem is not None:
                notes.append(_cannot_trace(problem))
            elif not _resolves(argv[0], path, cwd):
                notes.append(f"{argv[0]}: not found on PATH; ran without strace")
            else:
                strace_ok = True
        strace_tail = _StraceTail(strace_log, MAX_STRACE_BYTES) if strace_ok else None
        attacher = (_LateAttach(strace_found[0], strace_log, strace_after, self_test)
                    if strace_ok and strace_after and self_test is not None else None)
        run_env = {**dict(env), **ld_vars}
        tracer: list[str] = []
        if strace_ok and attacher is None:
            # strace runs the command's keeper (with no LD_ variable: the keeper hands them to the command),
            # so the command's own exit ends the run even when it left a daemon strace would wait for. strace
            # and the keeper stay root; the keeper drops the command to the training user before its exec.
            tracer = list(prefix or [])
        as_user = run_as
        label = f"live trace: {shlex.join(argv)}"[:200]
        if run_as is not None and tracer:
            label += " [strace as root]"
        started: list[int] = []
        # Just before the time limit, where each process of a hung run waits (state and wchan), and a little
        # earlier the ranks of the job it runs (their stacks take longer to read); the keeper is not the job.
        sampler = StuckSampler(max(0.2, timeout - min(2.0, timeout * 0.1)),
                               inspect=lambda keeper: collect_ranks(keeper, exclude=(keeper,)),
                               inspect_delay=max(0.2, timeout - min(6.0, timeout * 0.25)))

        then = on_start  # the caller's, called after the trace's own

        def started_now(pid: int) -> None:
            started.append(pid)
            sampler.start(pid)
            if attacher is not None:
                attacher.start(pid)
            if then is not None:
                then(pid)

        ev = run_guarded(list(argv), run_env, timeout=timeout, cwd=cwd, label=label, on_start=started_now,
                         prefix=tracer, run_as=as_user, on_stdout=on_stdout)
        sampler.stop()
        why_not = self_test.problem() if self_test is not None else None
        if why_not is not None:
            notes.append(_cannot_trace(why_not))
        if attacher is not None:
            attacher.stop()
            if attacher.attached:
                notes.append(f"still running after {strace_after:g}s: strace attached to follow it")
            strace_ok = attacher.attached
        timed_out = bool(ev.error and ev.error.startswith("timed out"))
        traces = parse_ld_debug_dir(ld_dir, "ld")
        if not traces and ev.error is None:
            notes.append("LD_DEBUG produced no output (a set-user-ID or statically linked program ignores it)")
        if any(t.truncated for t in traces.values()):
            notes.append("some LD_DEBUG logs were too large and were cut")
        recent: dict[int, list[FileEvent]] = {}
        stuck: list[FileEvent] = []
        refused: list[str] = []
        said: list[str] = []
        if strace_ok:
            text, cut = strace_tail.text() if strace_tail is not None else ("", False)
            if cut:
                notes.append("strace log too large: only its end was read")
            events = parse_strace(text)
            # Not our own logs, and not the keeper (the first process traced, or the one attached to).
            keeper = started[0] if attacher is not None and started else (events[0].pid if events else None)
            events = [e for e in events if e.pid != keeper and not e.path.startswith(tmp + os.sep)]
            recent, stuck, refused = last_files(events), unfinished(events), refused_creates(events)
            said = [line for line in lines_that_matter(text, ("libstdc++.so",), stuck) if tmp not in line]
        if timed_out:
            notes.append(f"timed out after {timeout:g}s; process group killed")
        return LiveTrace(
            argv=argv,
            exit_code=ev.exit_code,
            timed_out=timed_out,
            evidence=ev,
            traces=traces,
            libstdcxx=which_loaded(traces, preload=_preload_entries(env.get("LD_PRELOAD")),
                                   system_preload=_system_preload()),
            version_errors=all_version_errors(traces),
            stderr_version_errors=parse_stderr_version_errors(ev.stderr),
            last_files=recent,
            pending_calls=stuck,
            strace_lines=said,
            stuck_states=[describe(s) for s in sampler.states] if timed_out else [],
            compiling=building(sampler.states) if timed_out else [],
            refused_locks=refused,
            ranks=sampler.inspected if timed_out and isinstance(sampler.inspected, dict) else None,
            notes=notes,
            strace_available=bool(strace_found),
            strace_used=strace_ok,
        )
    finally:
        if strace_tail is not None:
            strace_tail.text()  # stops its reader
        shutil.rmtree(tmp, ignore_errors=True)


def default_probe_argv(python: str, ext_paths: Sequence[str], op_paths: Sequence[str] = ()) -> list[str]:
    """``python -B probe_script.py --trace ext:PATH... op:PATH...``: the paths travel as arguments.

    ``ext_paths`` load first (extensions the training imports before torch), then torch (the interpreter's
    records follow it: :mod:`zdoctor.scripts.probe_script`), deepspeed, every op prebuilt into the
    deepspeed package (``DS_BUILD_OPS=1``: ``deepspeed/ops/**/*.so``), then each JIT-built op in
    ``op_paths`` (skipped when its cache tag names another Python).
    """
    return [python, "-B", str(script_path(PROBE_SCRIPT)), "--trace", *[f"ext:{p}" for p in ext_paths],
            *[f"op:{p}" for p in op_paths]]


def parse_probe_output(stdout: str) -> list[dict[str, Any]]:
    """The probe's step results in order; a step that began but never reported (the process crashed,
    hung or was killed inside it) comes back as ``ok: False`` with ``finished: False``."""
    results: list[dict[str, Any]] = []
    open_step: dict[str, Any] | None = None
    for line in (stdout or "").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict) or not isinstance(d.get("step"), str):
            continue
        if d.get("begin"):
            open_step = d
            continue
        if open_step is not None and open_step["step"] == d["step"]:
            open_step = None
        results.append(d)
    if open_step is not None:
        rec = {k: v for k, v in open_step.items() if k != "begin"}
        rec.update(ok=False, error="no result: the process died, hung or was killed during this step",
                   finished=False)
        results.append(rec)
    return results
