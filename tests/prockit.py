"""Detached test processes: started as a training job would be from another shell (no descendant of the
test, so zdoctor, which leaves out its own tree, sees them), and always killed afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

# Fork twice so the process is no descendant of the test, like a training job started from another shell.
LAUNCHER = r"""
import json, os, sys
argv0, cwd, code, extra = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    gpid = os.fork()
    if gpid:
        os.write(w, str(gpid).encode())
        os._exit(0)
    os.close(r)
    os.close(w)
    if cwd:
        os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.execv(sys.executable, [argv0, "-c", code, *extra])
os.close(w)
print(os.read(r, 32).decode())
os.wait()
"""


# What torch.utils.file_baton.FileBaton does: create the lock exclusively and keep the descriptor open
# for the whole build; waiters poll os.path.exists every 0.1 s.
BUILDER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)
open(sys.argv[2], "w").close()
time.sleep(600)
"""
WAITER = """
import os, sys, time
open(sys.argv[2], "w").close()
while os.path.exists(sys.argv[1]):
    time.sleep(0.1)
open(sys.argv[3], "w").close()
"""


def wait_for(pred: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def spawn() -> Iterator[Callable[..., int]]:
    """Start a detached ``python -c CODE`` (no descendant of the test); killed afterwards."""
    pids: list[int] = []

    def start(code: str, *, env: dict[str, str] | None = None, extra: list[str] | None = None,
              cwd: Path | None = None, argv0: str = sys.executable) -> int:
        out = subprocess.run([sys.executable, "-c", LAUNCHER, argv0, str(cwd or ""), code, json.dumps(extra or [])],
                             capture_output=True, text=True, env=env, timeout=30, check=True)
        pids.append(int(out.stdout.strip()))
        return pids[-1]

    yield start
    for pid in pids:
        try:
            kids = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for p in [pid, *(k.pid for k in kids)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    for pid in pids:
        wait_for(lambda p=pid: dead(p), 10)
