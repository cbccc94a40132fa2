"""A real OpenSSH server on loopback for fleet tests: one sshd, one port, several 127.0.0.x addresses.

Each address is a "node": ``Match LocalAddress`` blocks give each one its own session environment
(``SetEnv``), which is how a test makes one node differ. Keys are generated per run; nothing outside the
test's directory is touched except sshd's privilege-separation directory, /run/sshd.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"


def require(*programs: str) -> None:
    """Skip when a launcher is missing here, unless ZDOCTOR_REQUIRE_LAUNCHERS is set (CI installs them)."""
    missing = [p for p in programs if not (shutil.which(p) or os.path.exists(p))]
    if os.geteuid() != 0:
        missing.append("root (sshd runs as root)")
    if missing:
        msg = f"needs {', '.join(missing)} (Debian packages openssh-server and pdsh)"
        if os.environ.get("ZDOCTOR_REQUIRE_LAUNCHERS"):
            pytest.fail(msg)
        pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_bin(dest: Path, name: str = "zdoctor-node", body: str | None = None, window: bool = True) -> Path:
    """A directory holding an executable ``name`` that runs this checkout's zdoctor (or ``body``); ``window``:
    it reads the kernel log of this test session only (see below)."""
    dest.mkdir(parents=True, exist_ok=True)
    exe = dest / name
    # The kernel log's window of this test session reaches the node's zdoctor too (ssh passes no
    # environment): what the machine's kernel logged before the session is not this node's news.
    since = os.environ.get("ZDOCTOR_KERNEL_LOG_SINCE") if window else None
    head = f"export ZDOCTOR_KERNEL_LOG_SINCE={shlex.quote(since)}\n" if since else ""
    exe.write_text("#!/bin/sh\n" + head + (body or f'exec {sys.executable} -m zdoctor "$@"\n'))
    exe.chmod(0o755)
    return dest


@dataclass
class Sshd:
    """A running sshd and the client config that reaches it."""

    proc: subprocess.Popen[bytes]
    port: int
    root: Path
    ssh_config: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")


def start_sshd(root: Path, nodes: Mapping[str, Mapping[str, str]], netns: str | None = None) -> Sshd:
    """Start sshd listening on every address in ``nodes``; each gets ``SetEnv`` with its mapping. ``netns``:
    run it inside that network namespace (its addresses are reachable only from there)."""
    root.mkdir(parents=True, exist_ok=True)
    for key in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / key)], check=True)
    (root / "authorized_keys").write_text((root / "userkey.pub").read_text())
    port = free_port()
    lines = [f"Port {port}", *(f"ListenAddress {a}" for a in nodes), f"HostKey {root / 'hostkey'}",
             f"PidFile {root / 'sshd.pid'}", f"AuthorizedKeysFile {root / 'authorized_keys'}", "StrictModes no",
             "UsePAM no", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
             "KbdInteractiveAuthentication no", "MaxStartups 100:30:200", "MaxSessions 100", "LogLevel VERBOSE",
             "Subsystem sftp internal-sftp"]  # scp (fleet --push) speaks SFTP, as with a distribution's sshd
    for addr, env in nodes.items():
        if env:
            lines += [f"Match LocalAddress {addr}", "  SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())]
    (root / "sshd_config").write_text("\n".join(lines) + "\n")
    (root / "ssh_config").write_text("\n".join([
        "Host *", f"  Port {port}", f"  IdentityFile {root / 'userkey'}", "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {root / 'known_hosts'}", "  StrictHostKeyChecking accept-new", "  BatchMode yes",
        "  LogLevel ERROR"]) + "\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    with open(root / "sshd.log", "wb") as log:
        prefix = ["ip", "netns", "exec", netns] if netns else []
        proc = subprocess.Popen([*prefix, SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stdout=log, stderr=log)
    sshd = Sshd(proc, port, root, root / "ssh_config")
    deadline = time.monotonic() + 15
    first = next(iter(nodes))
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {sshd.log()}")
        if netns:  # not reachable from this namespace: sshd says when it listens
            if sshd.log().count("Server listening on") >= len(nodes):
                return sshd
            time.sleep(0.05)
            continue
        with socket.socket() as s:
            if s.connect_ex((first, port)) == 0:
                return sshd
        time.sleep(0.05)
    sshd.stop()
    raise RuntimeError(f"sshd did not listen on {first}:{port}: {sshd.log()}")
