"""A private kernel log for the tests: records in /dev/kmsg's own format (``prio,seq,usec,flags;text``) in a
file of the test's, read by ``collect(kmsg=...)``, or bind-mounted over /dev/kmsg inside a private mount
namespace (``unshare -m``) so a real zdoctor process reads it as the kernel log.

Nothing is written into the machine's kernel log: on a GPU node, health checkers watching it (DCGM health
watches, Slurm health-check scripts, node-problem-detector) would drain the node for a fake Xid. Only a
machine that opted in (:data:`WRITE_KMSG_ENV`, which CI sets) lets a test write a real record there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: The opt-in: set to 1 where a test may write records into the machine's real /dev/kmsg.
WRITE_KMSG_ENV = "ZDOCTOR_TEST_WRITE_KMSG"
#: syslog's kernel and user facilities (the kernel gives every record written to /dev/kmsg LOG_USER at least).
KERN, USER = 0, 1
#: The level the records are written at: err.
ERR = 3
REPO = Path(__file__).resolve().parent.parent


def may_write_kmsg() -> bool:
    """Whether this machine opted in to tests writing into its real kernel log."""
    return os.environ.get(WRITE_KMSG_ENV) == "1"


def usec_now() -> int:
    """Microseconds since boot now, as the probe turns them back into wall time (/proc/stat's btime)."""
    from zdoctor.layers.kernel_log.kernlog import boot_time

    btime = boot_time()
    assert btime is not None, "/proc/stat has no btime"
    return int((time.time() - btime) * 1e6)


def record(seq: int, text: str, facility: int = KERN, level: int = ERR, usec: int | None = None) -> str:
    """One record as /dev/kmsg gives it (``prio`` is ``facility << 3 | level``), logged now by default."""
    return f"{facility << 3 | level},{seq},{usec if usec is not None else usec_now()},-;{text}\n"


def kmsg_file(path: Path, *texts: str, facility: int = KERN, first_seq: int = 1) -> Path:
    """``texts`` as records of ``facility`` at level err, logged now, in a kmsg-format file at ``path``."""
    path.write_text("".join(record(seq, t, facility) for seq, t in enumerate(texts, first_seq)))
    return path


def add_records(path: Path, *texts: str, facility: int = KERN) -> Path:
    """``texts`` appended to the kmsg-format file at ``path``, numbered on from its last record."""
    old = path.read_text() if path.exists() else ""
    last = max((int(line.split(",")[1]) for line in old.splitlines() if line and not line.startswith(" ")), default=0)
    path.write_text(old + "".join(record(seq, t, facility) for seq, t in enumerate(texts, last + 1)))
    return path


def private_kmsg_argv(dump: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run in a private mount namespace where ``dump`` is bind-mounted over /dev/kmsg (the mount is
    gone with the namespace; the machine's /dev/kmsg is never touched)."""
    script = 'mount --bind "$0" /dev/kmsg && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, str(dump), *argv]


def run_cli_on(dump: Path, args: Sequence[str], *, env: dict[str, str] | None = None,
               timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m zdoctor ARGS`` for real, reading ``dump`` as its /dev/kmsg."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("NO_COLOR", "1")
    return subprocess.run(private_kmsg_argv(dump, [sys.executable, "-m", "zdoctor", *args]), capture_output=True,
                          text=True, env=full_env, cwd=str(REPO), timeout=timeout, stdin=subprocess.DEVNULL)
