"""One rank of a hung job, read from ``/proc`` alone: its rank variables, state, wait channel, the system call
it is blocked in, each thread's wait, the kernel stack (as root), the TCP peers it talks to, and the CPU time
it uses over a short sample (a blocked rank uses none; a rank busy-polling a GPU uses a whole core).

Every reader takes the ``/proc`` root as a parameter so a test can point it at a recorded tree; what cannot be
read is left out or said, never raised."""

from __future__ import annotations

import os
import time
from typing import Any

from zdoctor.readers.stuck import STATES

#: The rank variables kept from /proc/PID/environ (torchrun, DeepSpeed's launcher, mpirun and srun set some).
RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
             "MASTER_PORT", "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
             "PMI_RANK", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID")
#: The variables that decide whether a hung collective ever times out or reports the mismatch.
TIMEOUT_KEYS = ("TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING",
                "TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                "TORCH_NCCL_DUMP_ON_TIMEOUT", "NCCL_DEBUG")
#: Where the global and local rank come from, first found first.
GLOBAL_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
LOCAL_RANK = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
MAX_THREADS = 256
MAX_PEERS = 16
MAX_ENV_BYTES = 1 << 20

#: System call numbers a blocked rank is seen in, per machine (asm/unistd_64.h, asm-generic/unistd.h).
SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 16: "ioctl", 17: "pread64", 23: "select", 35: "nanosleep",
               42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
               61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid",
               270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4", 299: "recvmmsg",
               441: "epoll_pwait2"},
    "aarch64": {22: "epoll_pwait", 29: "ioctl", 63: "read", 64: "write", 67: "pread64", 72: "pselect6",
                73: "ppoll", 95: "waitid", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep", 202: "accept",
                203: "connect", 206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 242: "accept4",
                243: "recvmmsg", 260: "wait4", 441: "epoll_pwait2"},
}
#: What a blocked system call means for a rank.
SYSCALL_MEANS = {
    "futex": "waits on a lock or condition variable (another thread of the rank must wake it)",
    "epoll_wait": "waits for data on its sockets", "epoll_pwait": "waits for data on its sockets",
    "epoll_pwait2": "waits for data on its sockets", "poll": "waits for data on its descriptors",
    "ppoll": "waits for data on its descriptors", "select": "waits for data on its descriptors",
    "pselect6": "waits for data on its descriptors", "read": "waits to read", "recvfrom": "waits for network data",
    "recvmsg": "waits for network data", "recvmmsg": "waits for network data", "accept": "waits for a connection",
    "accept4": "waits for a connection", "connect": "waits to connect", "nanosleep": "sleeps",
    "clock_nanosleep": "sleeps", "wait4": "waits for a child process", "waitid": "waits for a child process",
    "ioctl": "waits in a device call (a GPU driver call, say)",
}


def _read(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def read_env(pid: int, keys: tuple[str, ...] = RANK_KEYS + TIMEOUT_KEYS, proc: str = "/proc"
             ) -> dict[str, str] | None:
    """The chosen variables of the environment ``pid`` started with; None when it cannot be read (another
    user's process, read by someone other than root)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as fh:
            data = fh.read(MAX_ENV_BYTES)
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        k = key.decode("utf-8", "replace")
        if sep and k in keys:
            out[k] = value.decode("utf-8", "replace")[:200]
    return out


def rank_numbers(env: dict[str, str] | None) -> tuple[str, str]:
    """``(global rank, local rank)`` from the environment, each ``"unknown"`` when it is not there."""
    def first(keys: tuple[str, ...]) -> str:
        for k in keys:
            v = (env or {}).get(k, "")
            if v.isdigit():
                return v
        return "unknown"
    return first(GLOBAL_RANK), first(LOCAL_RANK)


def syscall_name(line: str | None, machine: str | None = None) -> str | None:
    """The blocked system call of ``/proc/PID/syscall``: its name (or ``syscall N``), ``running`` when the task
    runs, None when unreadable or not in a call."""
    words = (line or "").split()
    if not words:
        return None
    if words[0] == "running":
        return "running"
    if not words[0].lstrip("-").isdigit() or words[0].startswith("-"):
        return None
    num = int(words[0])
    return SYSCALLS.get(machine or os.uname().machine, {}).get(num, f"syscall {num}")


def _stat_fields(pid: int, tid: int | None, proc: str) -> tuple[str, str, float | None] | None:
    base = f"{proc}/{pid}" + (f"/task/{tid}" if tid is not None else "")
    stat = _read(f"{base}/stat")
    if not stat or ")" not in stat:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2:].split()
    try:
        ticks = (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        ticks = None
    return comm, rest[0] if rest else "?", ticks


def cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """User plus system CPU seconds ``pid`` has used (None when it is gone)."""
    got = _stat_fields(pid, None, proc)
    return got[2] if got else None


def thread_state(pid: int, tid: int, proc: str = "/proc", machine: str | None = None) -> dict[str, Any] | None:
    """``{tid, comm, state, wchan, syscall}`` of one thread of ``pid``."""
    got = _stat_fields(pid, tid, proc)
    if got is None:
        return None
    comm, state, _cpu = got
    wchan = (_read(f"{proc}/{pid}/task/{tid}/wchan") or "").strip()
    return {"tid": tid, "comm": comm, "state": state, "wchan": "" if wchan == "0" else wchan,
            "syscall": syscall_name(_read(f"{proc}/{pid}/task/{tid}/syscall"), machine)}


def threads(pid: int, proc: str = "/proc", machine: str | None = None) -> list[dict[str, Any]]:
    """Each thread's wait, the main thread first."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc}/{pid}/task") if t.isdigit())
    except OSError:
        return []
    tids = sorted(tids[:MAX_THREADS], key=lambda t: (t != pid, t))
    return [s for s in (thread_state(pid, t, proc, machine) for t in tids) if s is not None]


def kernel_stack(pid: int, proc: str = "/proc") -> list[str] | None:
    """The kernel functions of the main thread's stack, innermost first (``/proc/PID/stack``: root only)."""
    text = _read(f"{proc}/{pid}/stack", 8192)
    if text is None:
        return None
    out = []
    for line in text.splitlines():
        word = line.split("]", 1)[-1].strip().split("+", 1)[0]
        if word:
            out.append(word)
    return out


def _hexaddr(text: str) -> str:
    """``0100007F:7530`` (/proc/net/tcp) -> ``127.0.0.1:30000``; IPv6 as the kernel writes it, in words."""
    host, _, port = text.partition(":")
    try:
        p = int(port, 16)
        if len(host) == 8:
            return f"{'.'.join(str(b) for b in bytes.fromhex(host)[::-1])}:{p}"
        words = [bytes.fromhex(host[i:i + 8])[::-1].hex() for i in range(0, len(host), 8)]
        raw = bytes.fromhex("".join(words))
        if raw[:12] == b"\0" * 10 + b"\xff\xff":
            return f"{'.'.join(str(b) for b in raw[12:])}:{p}"
        return f"[{':'.join(raw[i:i + 2].hex() for i in range(0, 16, 2))}]:{p}"
    except ValueError:
        return text


def tcp_peers(pid: int, proc: str = "/proc") -> list[str]:
    """The remote ends of the rank's connected TCP sockets (``addr:port``), as its network namespace sees
    them; empty when its descriptors cannot be read."""
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return []
    inodes = set()
    for fd in fds[:4096]:
        try:
            target = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    peers: list[str] = []
    for table in ("tcp", "tcp6"):
        text = _read(f"{proc}/{pid}/net/{table}", 1 << 20) or ""
        for line in text.splitlines()[1:]:
            cols = line.split()
            # st 01 is ESTABLISHED; a listening socket has no peer to wait for
            if len(cols) > 9 and cols[9] in inodes and cols[3] == "01":
                peer = _hexaddr(cols[2])
                if peer not in peers:
                    peers.append(peer)
    return sorted(peers)[:MAX_PEERS]


def read_rank(pid: int, proc: str = "/proc", machine: str | None = None) -> dict[str, Any] | None:
    """Everything ``/proc`` says of one rank, or None when ``pid`` is gone."""
    got = _stat_fields(pid, None, proc)
    if got is None:
        return None
    comm, state, cpu = got
    env = read_env(pid, proc=proc)
    rank, local = rank_numbers(env)
    wchan = (_read(f"{proc}/{pid}/wchan") or "").strip()
    ts = threads(pid, proc, machine)
    return {"pid": pid, "comm": comm, "state": state, "state_words": STATES.get(state, state),
            "wchan": "" if wchan == "0" else wchan, "syscall": ts[0]["syscall"] if ts else None,
            "rank": rank, "local_rank": local, "env": env, "env_readable": env is not None,
            "threads": ts, "kernel_stack": kernel_stack(pid, proc), "tcp_peers": tcp_peers(pid, proc),
            "cpu_s": cpu}


def sample_cpu(ranks: list[dict[str, Any]], seconds: float, proc: str = "/proc") -> None:
    """Fill each rank's ``cpu_delta_s``: CPU seconds used over ``seconds`` (None when unknown)."""
    if not ranks:
        return
    time.sleep(seconds)
    for r in ranks:
        now = cpu_seconds(r["pid"], proc)
        r["cpu_delta_s"] = round(max(0.0, now - r["cpu_s"]), 2) if now is not None and r.get("cpu_s") is not None \
            else None
        r["cpu_sample_s"] = seconds
