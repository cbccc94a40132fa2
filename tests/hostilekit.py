"""Hostile inputs built for real: a crafted ELF version section, a resource-measured zdoctor run."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

REPO = Path(__file__).resolve().parent.parent
#: The budget every hostile input must stay under.
RSS_BUDGET_MB = 512


def craft_looping_verneed(src: Path, dst: Path) -> Path:
    """Copy the ELF ``src`` to ``dst`` with a ``.gnu.version_r`` that loops: ``sh_info = 0xffffffff`` and
    the first entry claiming ``vn_cnt = 0xffff`` with ``vn_next = 0`` (pointing at itself)."""
    shutil.copyfile(src, dst)
    with open(dst, "rb") as fh:
        elf = ELFFile(fh)
        little = elf.little_endian
        index = next(i for i, s in enumerate(elf.iter_sections()) if s["sh_type"] == "SHT_GNU_verneed")
        sec_off = elf.get_section(index)["sh_offset"]
        hdr_off = elf["e_shoff"] + index * elf["e_shentsize"]
        is64 = elf.elfclass == 64
    end = "<" if little else ">"
    # sh_info sits after name(4) type(4) flags(8|4) addr(8|4) offset(8|4) size(8|4) link(4)
    info_at = hdr_off + (4 + 4 + 8 * 4 + 4 if is64 else 4 + 4 + 4 * 4 + 4)
    with open(dst, "r+b") as fh:
        fh.seek(info_at)
        fh.write(struct.pack(end + "I", 0xFFFFFFFF))
        fh.seek(sec_off + 2)  # vn_version(2) | vn_cnt(2) vn_file(4) vn_aux(4) vn_next(4)
        fh.write(struct.pack(end + "H", 0xFFFF))
        fh.seek(sec_off + 12)
        fh.write(struct.pack(end + "I", 0))
    os.chmod(dst, 0o755)
    return dst


@dataclass
class Measured:
    """A finished zdoctor run: exit code, output, peak RSS of it and its children, wall time."""

    returncode: int | None
    stdout: str
    stderr: str
    peak_rss_mb: float
    wall_s: float
    killed: bool


#: Forks and runs the measured command, and reports how it ended. The measured process is forked from this
#: small interpreter, not from the test worker: a process's peak RSS (``ru_maxrss``) keeps the size of the
#: process it was forked from across ``exec``, and a test worker holds hundreds of MB.
SPAWNER = r"""
import json, os, resource, sys, time
argv, cwd, wall_limit, out, err = json.loads(sys.argv[1])
pid = os.fork()
if pid == 0:
    try:
        os.dup2(os.open(out, os.O_WRONLY), 1)
        os.dup2(os.open(err, os.O_WRONLY), 2)
        # a safety net for the machine running the tests: the unbounded code this guards against grew past
        # 3 GB; let it fail with MemoryError at 4 GiB of address space instead
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        os.setsid()
        os.chdir(cwd)
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
t0 = time.monotonic()
killed = False
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() - t0 > wall_limit:
        killed = True
        os.killpg(pid, 9)
        done, status, usage = os.wait4(pid, 0)
        break
    time.sleep(0.05)
code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
print(json.dumps([code, usage.ru_maxrss, killed]))
"""


def run_measured(args: Sequence[str], *, env: dict[str, str] | None = None, wall_limit: float = 60,
                 stdin: int | None = subprocess.DEVNULL, cwd: str | None = None,
                 python: Sequence[str] | None = None) -> Measured:
    """Run ``python -m zdoctor ARGS`` and measure its peak RSS (its own and its children's, ``wait4``) and
    wall time; past ``wall_limit`` seconds its whole process group is killed (``killed``)."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("NO_COLOR", "1")
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"zdoctor-measured-{os.getpid()}-{time.monotonic_ns()}"
    argv = [*(python or [sys.executable]), "-m", "zdoctor", *args]
    request = json.dumps([argv, cwd or tempfile.gettempdir(), wall_limit, f"{out_path}.out", f"{out_path}.err"])
    for suffix in (".out", ".err"):
        Path(f"{out_path}{suffix}").touch()
    t0 = time.monotonic()
    spawner = subprocess.run([sys.executable, "-I", "-S", "-c", SPAWNER, request], stdin=stdin,
                             capture_output=True, text=True, env=full_env, timeout=wall_limit + 60)
    wall = time.monotonic() - t0
    assert spawner.returncode == 0, f"the measuring spawner failed: {spawner.stderr}"
    code, maxrss_kib, killed = json.loads(spawner.stdout)
    result = Measured(code, Path(f"{out_path}.out").read_bytes().decode("utf-8", "replace"),
                      Path(f"{out_path}.err").read_bytes().decode("utf-8", "replace"),
                      max(maxrss_kib, 0) / 1024, wall, killed)
    for suffix in (".out", ".err"):
        with_suffix = Path(f"{out_path}{suffix}")
        with_suffix.unlink()
    return result
