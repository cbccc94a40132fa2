"""Every file zdoctor reads on its own goes through the one non-blocking, regular-file-only reader: a FIFO
where a library or build.ninja should be is a one-line problem at once, never a probe blocked for its
budget. The strace log is capped while it is written (it never lands on disk)."""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO

from zdoctor.layers.libraries import live


def _in_child(code: str, timeout: float = 20) -> str:
    """Run ``code`` in a fresh interpreter (a read that blocks would hang this test run instead)."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def fifo_lib(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    lib.mkdir()
    os.mkfifo(lib / "libstdc++.so.6")
    return lib / "libstdc++.so.6"


def test_a_fifo_named_like_a_library_is_unreadable_at_once(fifo_lib: Path):
    out = _in_child(
        "from zdoctor.readers.elf import read_elf\n"
        "from zdoctor.readers import loader, ldcache; from zdoctor.layers.libraries import symbols\n"
        f"p = {str(fifo_lib)!r}\n"
        "i = read_elf(p); print(i.kind, '|', i.error)\n"
        "print(loader._elf_ident(p))\n"
        "try:\n    ldcache.read_ld_so_cache(p)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    lines = out.splitlines()
    assert lines[0].startswith("not-regular |")
    assert lines[1] == "None"
    assert "FIFO" in lines[2]


def test_a_fifo_build_ninja_is_an_error_of_that_op_not_a_hang(tmp_path: Path):
    op = tmp_path / "cpu_adam"
    op.mkdir()
    os.mkfifo(op / "build.ninja")
    out = _in_child("from zdoctor.layers.python_env.jitorigin import origin\n"
                    f"print(origin({str(op)!r}, None)['error'])\n")
    assert out == "build.ninja: is a FIFO (named pipe), not a regular file"


def test_ld_debug_logs_are_read_without_following_links(tmp_path: Path):
    from zdoctor.layers.libraries.lddebug import parse_ld_debug_dir

    secret = tmp_path / "secret"
    secret.write_text("     12345:\tfile=libshadow.so [0];  needed by /x [0]\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ld.777").symlink_to(secret)
    os.mkfifo(logs / "ld.778")
    assert parse_ld_debug_dir(str(logs), "ld") == {}


@pytest.mark.skipif(live.which_all("strace", os.environ.get("PATH")) == [], reason="needs strace")
def test_the_strace_log_is_capped_while_it_is_written():
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            total = 0
            for d in glob.glob(f"/tmp/{live.TRACE_PREFIX}{os.getpid()}-*"):
                for root, _dirs, files in os.walk(d):
                    for f in files:
                        with contextlib.suppress(OSError):
                            total += os.lstat(os.path.join(root, f)).st_size
            peak[0] = max(peak[0], total)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    busy = ("import os, time\nt = time.time()\nwhile time.time() - t < 4:\n"
            "    os.close(os.open('/etc/hostname', os.O_RDONLY))\n")
    try:
        lt = live.trace_command([sys.executable, "-c", busy], dict(os.environ), timeout=60)
    finally:
        done.set()
        watcher.join(2)
    if not lt.strace_used:
        pytest.skip(f"strace cannot trace here: {lt.notes}")
    assert lt.exit_code == 0
    assert peak[0] < 512 * 1024, f"{peak[0]} bytes of trace logs on disk"
    assert any(e.path == "/etc/hostname" for evs in lt.last_files.values() for e in evs), lt.last_files
