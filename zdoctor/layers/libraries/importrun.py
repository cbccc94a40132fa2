"""The training interpreter's one run that imports torch, shared by the interpreter probe and the live trace.

Without ``--command`` the live trace (``livetrace``) runs the interpreter's own probe script in its traced
mode (:func:`~zdoctor.layers.libraries.live.default_probe_argv`), and that run prints the interpreter probe's
records (``pyenv``) as well. Torch is then imported once for both: ``pyenv`` reads the records as they arrive
(they end with torch's import and its CUDA check) and returns while the run goes on to deepspeed and the
ops; ``livetrace`` waits for the run's end. Each of them finds the run here, started by whichever asked first.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

from zdoctor.proc import children
from zdoctor.proc.privilege import runs_as_of
from zdoctor.proc.target import target_of
from zdoctor.readers.jitcache import scan_jit_cache
from zdoctor.readers.stuck import sample_tree
from zdoctor.scripts import RECORD_SENTINEL

#: The live trace's time limit where the target sets none.
LIVE_TIMEOUT = 120.0
#: The default import probe normally finishes in seconds; strace joins only a run this slow.
STRACE_AFTER = 15.0
#: The records (torch's config, every mapped library) are kept whole up to this size.
RECORDS_CAP = 1024 * 1024
#: The step lines kept of one run (one per extension, op and import; a run has tens).
STEP_LINES_CAP = 4000
SHARED_KEY = "import-run"
_runs = itertools.count(1)


def target_python(host: Any) -> str | None:
    """The training interpreter without waiting for the pyenv probe: --python, else python3 on PATH
    (resolved as the pyenv probe resolves it)."""
    return target_of(host).resolve_python()[0]


def jit_op_paths(jit: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """(loadable JIT op .so paths, the ops whose .so is corrupt) from the ``jitcache`` facts."""
    good, bad = [], []
    for op in jit.get("ops") or []:
        so = op.get("so_path")
        if not so or op.get("in_use") is False:  # built for another interpreter or CUDA: never loaded here
            continue
        summary = op.get("so_info") or op.get("so") or {}
        if summary.get("error") or summary.get("kind") not in (None, "elf"):
            bad.append(op)
        else:
            good.append(so)
    return good, bad


def live_argv(host: Any, jit_good: list[str]) -> tuple[list[str] | None, str]:
    """The command to trace: ``--command`` through ``sh -c``, else the default import probe."""
    from zdoctor.layers.libraries.live import default_probe_argv

    command = target_of(host).command
    if command:
        return ["/bin/sh", "-c", command], "command"
    exe = target_python(host)
    if not exe:
        return None, "the training interpreter was not found"
    return default_probe_argv(exe, list(target_of(host).ext), jit_good), "default probe"


def trace_argv(host: Any, env: dict[str, str]) -> tuple[list[str] | None, str]:
    """The command the live trace runs, and its kind (see :func:`live_argv`). The JIT cache is scanned
    here rather than read from the jitcache probe, which waits for the interpreter probe: the trace then
    runs alongside it instead of after it."""
    jit_good, _ = jit_op_paths({"ops": [op.to_dict() for op in scan_jit_cache(env)]})
    return live_argv(host, jit_good)


def trace_timeout(host: Any) -> float:
    """The live trace's time limit: the target's, else :data:`LIVE_TIMEOUT` stretched for the node's load
    (:meth:`~zdoctor.proc.target.Target.limit`)."""
    return target_of(host).limit(LIVE_TIMEOUT)


def is_record(line: str) -> bool:
    """Whether ``line`` is one of the interpreter probe's records (not the run's own output)."""
    return line.startswith(RECORD_SENTINEL)


def without_records(text: str) -> str:
    """The run's output with the interpreter probe's records taken out (they are that probe's evidence)."""
    return "\n".join(line for line in (text or "").split("\n") if not is_record(line))


class ImportRun:
    """The default probe, traced once (:func:`~zdoctor.layers.libraries.live.trace_command`) on a thread of
    its own, its output read while it runs."""

    def __init__(self, argv: list[str], env: dict[str, str], *, timeout: float, run_as: Any) -> None:
        self.argv = argv
        self.timeout = timeout
        self.started = time.time()
        self._t0 = time.monotonic()
        self._cond = threading.Condition()
        self._partial = b""
        self._records: list[str] = []
        self._records_size = 0
        self._steps: list[str] = []
        self.done = False  # the records' last ("done") has come
        self.ended = False  # the run is over, its trace read
        self.trace: Any = None  # the LiveTrace, once ended
        self.failure: BaseException | None = None  # what stopped the trace itself, if anything did
        self.keeper: int | None = None  # the pid the run's command is below, once it runs
        self._thread = threading.Thread(target=self._run, args=(env, run_as), name=f"import-run-{next(_runs)}",
                                        daemon=True)
        self._thread.start()

    def _run(self, env: dict[str, str], run_as: Any) -> None:
        from zdoctor.layers.libraries.live import trace_command

        try:
            trace = trace_command(self.argv, env, timeout=self.timeout, run_as=run_as,
                                  strace_after=min(STRACE_AFTER, self.timeout / 2), on_stdout=self._feed,
                                  on_start=self._started)
        except BaseException as exc:  # noqa: BLE001 - handed to the probes that wait, which report it
            trace, self.failure = None, exc
        with self._cond:
            self._feed_line(self._partial)
            self._partial = b""
            self.trace = trace
            self.ended = True
            self._cond.notify_all()

    def _started(self, pid: int) -> None:
        self.keeper = pid

    def sample(self) -> list[dict[str, str]]:
        """Where the run's processes are now (:func:`~zdoctor.readers.stuck.sample_tree`): none when it is over
        or has not started."""
        return [] if self.keeper is None or self.ended else sample_tree(self.keeper)

    def _feed(self, chunk: bytes) -> None:
        with self._cond:
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            if len(self._partial) > RECORDS_CAP:  # an endless line is nobody's record
                self._partial = b""
            for raw in lines:
                self._feed_line(raw)
            self._cond.notify_all()

    def _feed_line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if is_record(line):
            if self._records_size + len(line) <= RECORDS_CAP:
                self._records.append(line)
                self._records_size += len(line) + 1
            if len(line) < 200 and _stage(line) == "done":
                self.done = True
        elif line.startswith("{") and len(self._steps) < STEP_LINES_CAP:
            self._steps.append(line)

    def wait_records(self, timeout: float) -> bool:
        """Wait until the records are complete or the run is over, at most ``timeout`` seconds from the
        run's start; whether either happened."""
        deadline = self._t0 + timeout
        with self._cond:
            while not (self.done or self.ended):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return True

    def wait_end(self, timeout: float | None = None) -> bool:
        """Wait for the run's end (its trace read); whether it came within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self.ended:
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def records(self) -> str:
        """The interpreter probe's records received so far, a line each."""
        with self._cond:
            return "\n".join(self._records)

    def steps(self) -> str:
        """The run's step lines, a line each, read as they came (never cut by the output's cap)."""
        with self._cond:
            return "\n".join(self._steps)

    def seconds(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self._t0

    def stop(self, timeout: float = 10.0) -> bool:
        """End the run now (whoever started it is failing before any probe read it) and wait for its thread:
        nothing it started runs on. Whether the thread ended within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            children.end_started_by(self._thread.name, grace=0.2)  # again: its command may start only now
            self._thread.join(0.05)
        return not self._thread.is_alive()


def _stage(line: str) -> str | None:
    try:
        rec = json.loads(line[len(RECORD_SENTINEL):])
    except ValueError:
        return None
    return rec.get("stage") if isinstance(rec, dict) else None


def import_run(host: Any) -> ImportRun | None:
    """This host's shared run of the default probe, started on the first call; None when the live trace
    runs the user's ``--command`` instead, or when there is no interpreter to run."""

    def start() -> ImportRun | None:
        env = dict(target_of(host).env)
        argv, why = trace_argv(host, env)
        if argv is None or why != "default probe":
            return None
        return ImportRun(argv, env, timeout=trace_timeout(host), run_as=runs_as_of(host))

    if target_of(host).command:
        return None
    return host.shared(SHARED_KEY, start)


def shared_with_trace(host: Any) -> ImportRun | None:
    """The run the interpreter probe reads instead of importing torch again: the shared run when it exists
    already, or when the live trace is asked for in the same round and has not run; else None."""
    if target_of(host).command or not hasattr(host, "shared"):
        return None
    existing = host.shared(SHARED_KEY)
    if existing is not None:
        return existing
    if "livetrace" in getattr(host, "planned", ()) and not host.has_result("livetrace"):
        return import_run(host)
    return None
