"""Who listens on a TCP port of this node, and a port nobody does: the rendezvous port a launch binds
(MASTER_PORT, ``--master_port``).

The kernel's socket tables (``/proc/net/tcp``, ``/proc/net/tcp6``) give each listening socket's inode; the
process holding it is the one with a ``socket:[INODE]`` descriptor under ``/proc/PID/fd``.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import psutil

from zdoctor.readers.fdholders import fd_holders

#: The rendezvous port of torch.distributed, torchrun and DeepSpeed's launcher when none is given.
DEFAULT_MASTER_PORT = 29500
_LISTEN = "0A"
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
#: Processes whose descriptors are read at most (a node runs far fewer; this bounds a pathological one).
MAX_PROCESSES = 65536
#: Ports tried at most when looking for a free one.
FREE_TRIES = 200


def _hex_address(text: str) -> str:
    """``0100007F`` (IPv4) or 32 hex digits (IPv6) from the kernel's table -> the address as printed."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def parse_table(text: str) -> list[dict[str, Any]]:
    """The listening sockets of one ``/proc/net/tcp*`` table: ``[{address, port, inode, uid}]``."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or parts[3] != _LISTEN:
            continue
        addr, _, port = parts[1].partition(":")
        try:
            out.append({"address": _hex_address(addr), "port": int(port, 16), "inode": int(parts[9]),
                        "uid": int(parts[7])})
        except ValueError:
            continue
    return out


def listening_sockets(tables: tuple[str, ...] = TABLES) -> list[dict[str, Any]]:
    """Every listening TCP socket of this network namespace."""
    found: list[dict[str, Any]] = []
    for path in tables:
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                found += parse_table(fh.read())
        except OSError:
            continue
    return found


def _socket_owners(inodes: set[int]) -> dict[int, list[int]]:
    """inode -> the pids holding a descriptor of it (those whose /proc/PID/fd this process may read)."""
    owners, _why = fd_holders([f"socket:[{i}]" for i in inodes], max_pids=MAX_PROCESSES)
    return {int(target[len("socket:["):-1]): pids for target, pids in owners.items()}


def describe_process(pid: int) -> dict[str, Any]:
    """``{pid, user, command, started, ppid}`` of a process (what can be read of it)."""
    rec: dict[str, Any] = {"pid": pid, "user": None, "command": None, "started": None, "ppid": None}
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            rec["command"] = " ".join(" ".join(p.cmdline()).split())[:300] or p.name()
            rec["user"] = p.username()
            rec["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.create_time()))
            rec["ppid"] = p.ppid()
    except (psutil.Error, KeyError, OSError):
        pass
    return rec


def port_listeners(port: int, tables: tuple[str, ...] = TABLES) -> list[dict[str, Any]]:
    """The sockets listening on ``port`` here, each with the processes holding it:
    ``[{address, port, uid, processes: [describe_process(...)]}]``."""
    socks = [s for s in listening_sockets(tables) if s["port"] == port]
    owners = _socket_owners({s["inode"] for s in socks}) if socks else {}
    return [{"address": s["address"], "port": s["port"], "uid": s["uid"],
             "processes": [describe_process(p) for p in sorted(owners.get(s["inode"], []))]} for s in socks]


def free_port(after: int, tables: tuple[str, ...] = TABLES) -> int | None:
    """The first port above ``after`` that nothing listens on here and that binds on every address now."""
    taken = {s["port"] for s in listening_sockets(tables)}
    for port in range(after + 1, min(after + 1 + FREE_TRIES, 65536)):
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    return None
