"""The one way zdoctor runs a program: argv (no shell), explicit env, timeout, capped output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import children
from .model import OUTPUT_CAP, Evidence, cap_text

DEFAULT_TIMEOUT = 20.0


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the whole process group the child leads (the child and everything it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    cwd: str | None = None,
    stdin: bytes | None = None,
    cap: int = OUTPUT_CAP,
    label: str | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Evidence:
    """Run ``argv`` and return its :class:`Evidence`; never raises for a failing program.

    The child runs in a new session (so its process group can be killed as one on timeout) with
    exactly ``env`` (default: zdoctor's own environment). A missing or non-executable program is
    reported in ``error`` with ``exit_code`` None; a timeout sets ``error`` and keeps the output
    produced so far. ``on_start`` is called with the child's pid once it runs.
    """
    argv = [str(a) for a in argv]
    ev = Evidence(label=label or " ".join(argv[:3]), kind="command", argv=argv, started=time.time())
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=children.pdeathsig_hook(),
        )
    except FileNotFoundError:
        ev.error = f"{argv[0]}: executable not found"
        ev.duration_s = time.monotonic() - t0
        return ev
    except PermissionError:
        ev.error = f"{argv[0]}: permission denied"
        ev.duration_s = time.monotonic() - t0
        return ev
    except OSError as exc:
        ev.error = f"{argv[0]}: cannot execute ({exc.strerror or exc})"
        ev.duration_s = time.monotonic() - t0
        return ev
    children.register(proc.pid)
    if on_start is not None:
        on_start(proc.pid)
    try:
        out, err = proc.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a grandchild left its session and holds the pipes
            out, err = b"", b""
            for pipe in (proc.stdout, proc.stderr):
                if pipe:
                    pipe.close()
            proc.wait()
        ev.error = f"timed out after {timeout:g}s; process group killed"
    finally:
        # A child that exited may have left grandchildren holding the pipes: never leave them behind.
        if proc.returncode is None:
            _kill_group(proc)
            proc.wait()
        children.forget(proc.pid)
    ev.duration_s = time.monotonic() - t0
    ev.exit_code = proc.returncode if ev.error is None else None
    ev.stdout, t1 = cap_text(out.decode("utf-8", "replace"), cap)
    ev.stderr, t2 = cap_text(err.decode("utf-8", "replace"), cap)
    ev.truncated = t1 or t2
    return ev


def run_streaming(
    argv: Sequence[str],
    on_line: Callable[[str], None],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    cap: int = OUTPUT_CAP,
    label: str | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Evidence:
    """Like :func:`run`, but ``on_line`` sees each line of standard output as it arrives.

    ``on_line`` runs on a reader thread; an exception in it is not raised here (the line is still kept).
    """
    import threading

    argv = [str(a) for a in argv]
    ev = Evidence(label=label or " ".join(argv[:3]), kind="command", argv=argv, started=time.time())
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(env) if env is not None else None, start_new_session=True,
                                preexec_fn=children.pdeathsig_hook())
    except OSError as exc:
        ev.error = (f"{argv[0]}: executable not found" if isinstance(exc, FileNotFoundError)
                    else f"{argv[0]}: cannot execute ({exc.strerror or exc})")
        ev.duration_s = time.monotonic() - t0
        return ev
    children.register(proc.pid)
    if on_start is not None:
        on_start(proc.pid)
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    sizes = {"out": 0, "err": 0}

    def pump(name: str, pipe: Any) -> None:
        for raw in iter(pipe.readline, b""):
            if sizes[name] < cap * 4:  # bytes; the text is capped to ``cap`` characters below
                chunks[name].append(raw)
                sizes[name] += len(raw)
            if name == "out":
                with contextlib.suppress(Exception):
                    on_line(raw.decode("utf-8", "replace").rstrip("\r\n"))

    readers = [threading.Thread(target=pump, args=(n, pipe), daemon=True)
               for n, pipe in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        ev.error = f"timed out after {timeout:g}s; process group killed"
    for r in readers:
        r.join(5)
    if any(r.is_alive() for r in readers):  # a grandchild left its session and holds the pipes
        _kill_group(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                with contextlib.suppress(OSError):
                    pipe.close()
    children.forget(proc.pid)
    ev.duration_s = time.monotonic() - t0
    ev.exit_code = proc.returncode if ev.error is None else None
    ev.stdout, t1 = cap_text(b"".join(chunks["out"]).decode("utf-8", "replace"), cap)
    ev.stderr, t2 = cap_text(b"".join(chunks["err"]).decode("utf-8", "replace"), cap)
    ev.truncated = t1 or t2
    return ev


def which_all(name: str, path: str | None) -> list[str]:
    """Every executable called ``name`` on ``path``, in search order (like ``which -a``)."""
    found: list[str] = []
    for d in (path or "").split(os.pathsep):
        if not d:
            continue
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK) and cand not in found:
            found.append(cand)
    return found
