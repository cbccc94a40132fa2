"""Hostile inputs built for real: a crafted ELF version section, a resource-measured zdoctor run."""

from __future__ import annotations

import os
import resource
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


def _limit_memory() -> None:  # pragma: no cover - runs in the child
    # A safety net for the machine running the tests: the unbounded code this guards against grew past
    # 3 GB; let it fail with MemoryError at 4 GiB of address space instead.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    os.setsid()


def run_measured(args: Sequence[str], *, env: dict[str, str] | None = None, wall_limit: float = 60,
                 stdin: int | None = subprocess.DEVNULL, cwd: str | None = None,
                 python: Sequence[str] | None = None) -> Measured:
    """Run ``python -m zdoctor ARGS`` and measure its peak RSS (``wait4``) and wall time; past
    ``wall_limit`` seconds its whole process group is killed (``killed``)."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("NO_COLOR", "1")
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"zdoctor-measured-{os.getpid()}-{time.monotonic_ns()}"
    t0 = time.monotonic()
    with open(f"{out_path}.out", "w+b") as out, open(f"{out_path}.err", "w+b") as err:
        proc = subprocess.Popen([*(python or [sys.executable]), "-m", "zdoctor", *args], stdout=out, stderr=err,
                                stdin=stdin, env=full_env, cwd=cwd or tempfile.gettempdir(), preexec_fn=_limit_memory)
        killed = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > wall_limit:
                killed = True
                os.killpg(proc.pid, 9)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        result = Measured(proc.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
                          max(usage.ru_maxrss, 0) / 1024, wall, killed)
    for suffix in (".out", ".err"):
        with_suffix = Path(f"{out_path}{suffix}")
        with_suffix.unlink()
    return result
