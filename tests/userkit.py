"""A real unprivileged account for a test, and a training environment it owns (removed afterwards)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: A system interpreter every account may run (the test runner's own may live under root's home).
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class Account:
    name: str
    uid: int
    gid: int


@contextmanager
def unprivileged_user(tag: str) -> Iterator[Account]:
    """A new account ``zdh8<tag><pid>`` in a group of its own and no other group; deleted on exit."""
    name = f"zdh8{tag}{os.getpid() % 100000}"[:31]
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", name], capture_output=True)
    subprocess.run(["useradd", "-M", "-U", "-d", "/nonexistent", "-s", "/bin/sh", name], check=True,
                   capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        yield Account(name, pw.pw_uid, pw.pw_gid)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


@contextmanager
def owned_environment(account: Account) -> Iterator[Path]:
    """A venv (no pip) under a world-readable temp folder, owned by ``account`` through and through."""
    top = Path(tempfile.mkdtemp(prefix="zdoctor-h8-env-"))
    os.chmod(top, 0o755)
    try:
        env = top / "env"
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True)
        for directory, dirs, files in os.walk(env):
            for n in [*dirs, *files]:
                os.chown(os.path.join(directory, n), account.uid, account.gid, follow_symlinks=False)
        os.chown(env, account.uid, account.gid)
        yield env
    finally:
        shutil.rmtree(top, ignore_errors=True)


def site_packages(env: Path) -> Path:
    (found,) = env.glob("lib/python3*/site-packages")
    return found


#: A ``.pth`` line that records who ran the environment's interpreter: ``uid euid gid groups``.
WITNESS_PTH = ("import os; open(os.path.join({dir!r}, 'ran-%d' % os.getpid()), 'w').write("
               "'%d %d %d %s' % (os.getuid(), os.geteuid(), os.getgid(), sorted(os.getgroups())))\n")


def plant_witness(env: Path, account: Account) -> Path:
    """A ``.pth`` file in the environment's site-packages that writes who runs it into a folder it owns."""
    seen = env / "witness"
    seen.mkdir()
    os.chown(seen, account.uid, account.gid)
    os.chmod(seen, 0o777)
    pth = site_packages(env) / "zz_witness.pth"
    pth.write_text(WITNESS_PTH.format(dir=str(seen)))
    os.chown(pth, account.uid, account.gid)
    return seen


def witnessed(seen: Path) -> list[tuple[int, int, int, str]]:
    """Every (uid, euid, gid, groups) the witness recorded."""
    out = []
    for f in sorted(seen.iterdir()):
        uid, euid, gid, groups = f.read_text().split(" ", 3)
        out.append((int(uid), int(euid), int(gid), groups))
    return out
