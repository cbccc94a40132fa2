"""Host limits a multi-GPU run meets: /dev/shm (NCCL's shared-memory transport, DataLoader workers), the
locked-memory limit (``ulimit -l``: RDMA registration, pinned buffers) and open files (``ulimit -n``).

The limits that matter are the training's, not zdoctor's: they are read by ``/bin/sh -c 'ulimit ...'``
started with the training environment (a launcher, a container or a systemd unit may set other ones).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zdoctor.readers.containerdetect import detect
from zdoctor.readers.mounts import mount_at, parse_mount_table

MIB = 1024 * 1024
#: DeepSpeed's ds_report warns below this /dev/shm size.
SHM_WARN = 512 * MIB
#: Docker's default --shm-size.
DOCKER_SHM = 64 * MIB
NOFILE_LOW = 4096
#: What the open-files remedies raise the limit to, at most.
NOFILE_TARGET = 65536
ULIMIT_SCRIPT = "ulimit -S -l; ulimit -H -l; ulimit -S -n; ulimit -H -n"


def parse_mounts(text: str, mountpoint: str = "/dev/shm") -> dict[str, Any] | None:
    """The mount that is active at ``mountpoint`` in mount-table text (``/proc/mounts`` or mountinfo), or None."""
    m = mount_at(mountpoint, parse_mount_table(text or ""))
    return {"source": m.source, "fstype": m.fstype, "options": ",".join(m.options)} if m else None


def shm_info(path: str = "/dev/shm", mounts_text: str | None = None) -> dict[str, Any]:
    """Size and free space of ``path`` (statvfs) and its mount line."""
    out: dict[str, Any] = {"path": path, "exists": os.path.isdir(path), "total": None, "free": None,
                           "fstype": None, "options": None, "error": None}
    if not out["exists"]:
        out["error"] = f"{path} does not exist"
        return out
    try:
        st = os.statvfs(path)
        out["total"] = st.f_blocks * st.f_frsize
        out["free"] = st.f_bavail * st.f_frsize
    except OSError as exc:
        out["error"] = f"{path}: {exc.strerror or exc}"
    if mounts_text is None:
        try:
            with open("/proc/mounts", encoding="utf-8", errors="replace") as fh:
                mounts_text = fh.read()
        except OSError:
            mounts_text = ""
    m = parse_mounts(mounts_text, path)
    if m:
        out["fstype"], out["options"] = m["fstype"], m["options"]
    return out


def container_info(env: Mapping[str, str], root: str = "/") -> dict[str, Any]:
    """Whether this looks like a container, and which kind, with the clues found (:mod:`zdoctor.readers.containerdetect`
    reads the signs)."""
    found = detect(env, root)
    return {"in_container": found["in_container"], "kind": found["kind"], "clues": found["clues"]}


def parse_limit(text: str) -> int | None | str:
    """One ``ulimit`` output line: an int, ``"unlimited"``, or None when unreadable."""
    t = (text or "").strip()
    if t == "unlimited":
        return "unlimited"
    return int(t) if t.isdigit() else None


def parse_ulimits(stdout: str) -> dict[str, Any]:
    """The four lines of :data:`ULIMIT_SCRIPT`: memlock soft/hard (KiB), nofile soft/hard."""
    lines = (stdout or "").strip().splitlines()
    vals = [parse_limit(x) for x in lines[:4]] + [None] * (4 - len(lines[:4]))
    return {"memlock_soft_kb": vals[0], "memlock_hard_kb": vals[1], "nofile_soft": vals[2], "nofile_hard": vals[3]}


def own_limits() -> dict[str, Any]:
    """zdoctor's own limits (resource.getrlimit), for comparison with the training's."""
    import resource

    def conv(v: int, scale: int) -> int | str:
        return "unlimited" if v == resource.RLIM_INFINITY else v // scale

    ml = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    nf = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"memlock_soft_kb": conv(ml[0], 1024), "memlock_hard_kb": conv(ml[1], 1024),
            "nofile_soft": conv(nf[0], 1), "nofile_hard": conv(nf[1], 1)}


def human(n: int | float | None) -> str:
    """Bytes as ``64 MiB`` / ``1.5 GiB``."""
    if n is None:
        return "unknown"
    for unit, size in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def parse_ulimit_a(text: str) -> dict[str, Any]:
    """Recorded ``ulimit -a`` (bash) output -> the same keys as :func:`parse_ulimits` (soft limits only;
    the hard ones are None)."""
    out: dict[str, Any] = {"memlock_soft_kb": None, "memlock_hard_kb": None, "nofile_soft": None, "nofile_hard": None}
    for line in (text or "").splitlines():
        value = line.rsplit(None, 1)[-1] if line.strip() else ""
        if "(kbytes, -l)" in line:
            out["memlock_soft_kb"] = parse_limit(value)
        elif "(-n)" in line:
            out["nofile_soft"] = parse_limit(value)
    return out


def raised_nofile(soft: Any, hard: Any) -> int | None:
    """The soft open-files limit the shell may raise itself to (its hard limit, at most
    :data:`NOFILE_TARGET`), or None when the soft limit is not low or there is no room below the hard one."""
    if not isinstance(soft, int) or soft >= NOFILE_LOW:
        return None
    top = NOFILE_TARGET if hard == "unlimited" else hard if isinstance(hard, int) else None
    return min(top, NOFILE_TARGET) if top is not None and top > soft else None
