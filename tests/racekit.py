"""Races between root and an unprivileged user, built for real: a user created for the test (removed
after), a compiled racer run as that user, a loop device over a file with a known pattern."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RACERS = HERE / "racers"
#: Users the race tests create start with this (unique per run, removed after).
USER_PREFIX = "zdrace-h7-"


@dataclass
class User:
    name: str
    uid: int
    gid: int


def can_race() -> str | None:
    """Why the race tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (creates a user and races it)"
    for tool in ("useradd", "userdel", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return None


@contextlib.contextmanager
def unprivileged_user() -> Iterator[User]:
    """A fresh unprivileged user (no home directory), deleted afterwards."""
    name = f"{USER_PREFIX}{os.getpid() % 100000}-{os.urandom(2).hex()}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        yield User(name, pw.pw_uid, pw.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@contextlib.contextmanager
def user_dir(user: User, mode: int = 0o755) -> Iterator[Path]:
    """A directory the user owns, under a root-owned world-searchable parent."""
    parent = Path(tempfile.mkdtemp(prefix="zdrace-"))
    try:
        os.chmod(parent, 0o755)
        d = parent / "user"
        d.mkdir()
        os.chown(d, user.uid, user.gid)
        os.chmod(d, mode)
        yield d
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def build_racer(name: str, out_dir: Path) -> Path:
    """Compile ``racers/NAME.c`` into ``out_dir`` (which the racing user must be able to read)."""
    exe = out_dir / name
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(RACERS / f"{name}.c")], check=True, capture_output=True)
    os.chmod(exe, 0o755)
    return exe


def _drop_to(user: User):  # noqa: ANN202 - a preexec hook
    def hook() -> None:  # pragma: no cover - runs in the child
        os.setgroups([])
        os.setgid(user.gid)
        os.setuid(user.uid)
    return hook


@contextlib.contextmanager
def racing(user: User, argv: list[str]) -> Iterator[subprocess.Popen]:
    """Run ``argv`` as ``user`` in the background while the block runs; killed after."""
    proc = subprocess.Popen(argv, preexec_fn=_drop_to(user), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        time.sleep(0.2)  # the watch is in place
        if proc.poll() is not None:
            raise RuntimeError(f"racer exited early: {proc.stderr.read().decode() if proc.stderr else ''}")
        yield proc
    finally:
        proc.kill()
        proc.wait()


PATTERN = b"ZDOCTOR-LOOP-PATTERN-" * 200


@contextlib.contextmanager
def loop_device(folder: Path, size: int = 16 << 20) -> Iterator[tuple[str, Path]]:
    """A loop device over a root-owned file filled with :data:`PATTERN`: (device, backing file)."""
    backing = folder / "disk.img"
    with open(backing, "wb") as fh:
        chunk = (PATTERN * (1 + (1 << 20) // len(PATTERN)))[: 1 << 20]
        for _ in range(size >> 20):
            fh.write(chunk)
    os.chmod(backing, 0o600)
    dev = subprocess.run(["losetup", "-f", "--show", str(backing)], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        yield dev, backing
    finally:
        subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)


def intact(device: str, size: int) -> bool:
    """Whether every byte of the loop device still holds :data:`PATTERN`."""
    chunk = (PATTERN * (1 + (1 << 20) // len(PATTERN)))[: 1 << 20]
    fd = os.open(device, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for off in range(0, size, 1 << 20):
            if os.pread(fd, 1 << 20, off) != chunk:
                return False
    finally:
        os.close(fd)
    return True
