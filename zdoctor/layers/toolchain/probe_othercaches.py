"""``other_caches``: DeepSpeed's Triton autotune cache and Triton's kernel cache: where, on what filesystem,
which lock files are held."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from zdoctor.core.factstypes import OtherCachesFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.readers.mounts import is_network_fs, mount_of

MAX_LOCKS = 200


def held_locks(proc_locks: str = "/proc/locks") -> dict[int, list[int]]:
    """inode -> pids holding a lock on it, from /proc/locks."""
    out: dict[int, list[int]] = {}
    try:
        with open(proc_locks, encoding="ascii", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and parts[1] in ("FLOCK", "POSIX", "OFDLCK"):
                    try:
                        ino = int(parts[5].split(":")[2])
                        out.setdefault(ino, []).append(int(parts[4]))
                    except (ValueError, IndexError):
                        continue
    except OSError:
        pass
    return out


def cache_dirs(env: dict[str, str]) -> list[dict[str, str]]:
    """DeepSpeed's Triton autotune cache and Triton's kernel cache, as each finds its directory."""
    home = env.get("HOME") or str(Path.home())
    tt_home = env.get("TRITON_HOME") or home
    autotune = env.get("TRITON_CACHE_DIR") or os.path.join(tt_home, ".triton", "autotune")
    kernels = env.get("TRITON_CACHE_DIR") or os.path.join(tt_home, ".triton", "cache")
    out = [{"name": "DeepSpeed Triton autotune cache", "path": autotune,
            "source": "TRITON_CACHE_DIR" if env.get("TRITON_CACHE_DIR") else "TRITON_HOME or ~/.triton/autotune"}]
    if kernels != autotune:
        out.append({"name": "Triton kernel cache", "path": kernels, "source": "~/.triton/cache (TRITON_HOME)"})
    return out


def other_caches(env: dict[str, str], proc_locks: str = "/proc/locks",
                 mounts: str = "/proc/self/mounts") -> list[dict[str, Any]]:
    locks = held_locks(proc_locks)
    out = []
    for c in cache_dirs(env):
        path = c["path"]
        probe_path = path
        while probe_path and not os.path.exists(probe_path):
            probe_path = os.path.dirname(probe_path)
        mount = mount_of(probe_path or "/", mounts) if probe_path else None
        lock_files: list[dict[str, Any]] = []
        if os.path.isdir(path):
            try:
                for entry in list(os.scandir(path))[:4096]:
                    if entry.name.endswith(".lock") and len(lock_files) < MAX_LOCKS:
                        ino = entry.inode()
                        lock_files.append({"path": entry.path, "holders": locks.get(ino, [])})
            except OSError:
                pass
        out.append({**c, "exists": os.path.isdir(path), "mount": mount,
                    "network": is_network_fs((mount or {}).get("fstype")), "locks": lock_files})
    return out


@probe("other_caches", title="Triton caches: filesystem and held locks", timeout=20, facts=OtherCachesFacts)
def other_caches_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    env = dict(getattr(host, "env", None) or os.environ)
    caches = other_caches(env)
    rows = [[c["name"], c["path"], (c["mount"] or {}).get("fstype") or "?", str(len(c["locks"])),
             str(sum(1 for x in c["locks"] if x["holders"]))] for c in caches]
    return {"caches": caches}, [Evidence.of_table("other JIT caches", ["cache", "path", "filesystem", "lock files",
                                                                        "held"], rows)]
