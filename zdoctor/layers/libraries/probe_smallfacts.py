"""Three small probes: ``shm_access`` (can the training user create files in /dev/shm: permissions, not
size), ``other_caches`` (DeepSpeed's Triton autotune cache and Triton's kernel cache: where, on what
filesystem, which lock files are held), and ``stdcxx_links`` (a libstdc++.so.6.0.N in a library
directory without the libstdc++.so.6 link the loader looks for, or with the link on an older file)."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from zdoctor.core.factstypes import OtherCachesFacts, ShmAccessFacts, StdcxxLinksFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe
from zdoctor.proc import asuser, scratch
from zdoctor.proc.target import target_of
from zdoctor.proc.trainuser import training_user
from zdoctor.readers.mounts import is_network_fs, mount_of

MAX_LOCKS = 200
_VERSIONED = re.compile(r"^libstdc\+\+\.so\.6\.0\.(\d+)$")


# -- /dev/shm ------------------------------------------------------------------------------------------

def shm_access(path: str = "/dev/shm", user: dict[str, str] | None = None) -> dict[str, Any]:
    """Mode, owner and a real create/unlink test of ``path`` as the training user ``user`` (from
    ``training_user``): in this process when that is the user zdoctor runs as, else in a child switched to
    that user (root only; otherwise ``write_test`` is None and ``skipped`` says why)."""
    me = os.geteuid()
    name = (user or {}).get("name")
    who = asuser.identity(name) if name else None
    out: dict[str, Any] = {"path": path, "exists": os.path.isdir(path), "mode": None, "uid": None, "sticky": None,
                           "write_test": None, "error": None, "skipped": None, "euid": me,
                           "user": name, "user_uid": who["uid"] if who else None,
                           "user_rule": (user or {}).get("rule"), "tested_as": None}
    if not out["exists"]:
        out["error"] = "not a directory"
        return out
    st = os.stat(path)
    out.update(mode=oct(stat.S_IMODE(st.st_mode)), uid=st.st_uid, sticky=bool(st.st_mode & stat.S_ISVTX))
    if name and who is None:
        out["skipped"] = f"the training user {name!r} is not a user on this machine"
        return out
    if who is not None and who["uid"] != me:
        res = asuser.can_create(path, str(who["name"]))
        if res["ok"] is None:
            out["skipped"] = f"not tested as {who['name']}: {res['error']}"
            return out
        out.update(write_test=res["ok"], error=res["error"], tested_as=who["name"])
        return out
    out["tested_as"] = name or str(me)
    try:
        # in this run's folder there (made by the same right to create in it), swept should the run be killed
        fd, tmp = tempfile.mkstemp(prefix="shm-", dir=scratch.run_folder(path))
        os.close(fd)
        os.unlink(tmp)
        out["write_test"] = True
    except OSError as exc:
        out["write_test"] = False
        out["error"] = f"{exc.strerror or exc}"
    return out


@probe("shm_access", title="Can the training user create files in /dev/shm", timeout=10, facts=ShmAccessFacts)
def shm_access_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    job = target_of(host)
    options = dict(job.options)
    user = training_user(dict(job.env), user=str(options["user"]) if options.get("user") else None,
                         python=job.python, python_explicit=job.python_explicit)
    f = shm_access(user=user)
    result = f["skipped"] or ("ok" if f["write_test"] else f["error"])
    return f, [Evidence.note("/dev/shm access", f"mode {f['mode']}, owner uid {f['uid']}, training user "
                                                f"{f['user']} ({f['user_rule']}), create test as "
                                                f"{f['tested_as'] or 'nobody'}: {result}")]


# -- other JIT caches ----------------------------------------------------------------------------------

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


# -- libstdc++.so.6 links --------------------------------------------------------------------------------

def stdcxx_dirs(env: dict[str, str], pyenv: dict[str, Any] | None) -> list[tuple[str, str]]:
    out = [(d, f"LD_LIBRARY_PATH entry {i + 1}")
           for i, d in enumerate((env.get("LD_LIBRARY_PATH") or "").split(":")) if d]
    if env.get("CONDA_PREFIX"):
        out.append((os.path.join(env["CONDA_PREFIX"], "lib"), "conda environment"))
    py = (pyenv or {}).get("python") or {}
    for key in ("prefix", "base_prefix"):
        if py.get(key):
            out.append((os.path.join(py[key], "lib"), f"interpreter {key.replace('_', ' ')}"))
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/lib64"):
        out.append((d, "system dir"))
    seen, uniq = set(), []
    for d, why in out:
        if d not in seen:
            seen.add(d)
            uniq.append((d, why))
    return uniq


def stdcxx_links(dirs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Per directory holding a versioned libstdc++.so.6.0.N: the newest such file and where the
    libstdc++.so.6 link points (None when there is none)."""
    out = []
    for d, why in dirs:
        try:
            names = [e.name for e in list(os.scandir(d))[:8192] if e.name.startswith("libstdc++.so.6")]
        except OSError:
            continue
        versioned = sorted(((int(m.group(1)), n) for n in names if (m := _VERSIONED.match(n))), reverse=True)
        if not versioned:
            continue
        link = os.path.join(d, "libstdc++.so.6")
        target = os.path.realpath(link) if os.path.exists(link) else None
        m = _VERSIONED.match(os.path.basename(target)) if target else None
        out.append({"dir": d, "why": why, "newest": versioned[0][1], "newest_n": versioned[0][0],
                    "link_target": target, "link_n": int(m.group(1)) if m else None,
                    "link_present": os.path.lexists(link)})
    return out


@probe("stdcxx_links", title="libstdc++.so.6 links beside versioned files", timeout=20, needs=("pyenv",),
       facts=StdcxxLinksFacts)
def stdcxx_links_probe(host: Any) -> tuple[dict[str, Any], list[Evidence]]:
    env = dict(getattr(host, "env", None) or os.environ)
    res = host.result("pyenv")
    dirs = stdcxx_links(stdcxx_dirs(env, res.facts if res.status == "ok" else {}))
    rows = [[x["dir"], x["why"], x["newest"], x["link_target"] or ("dangling" if x["link_present"] else "missing")]
            for x in dirs]
    return {"dirs": dirs}, [Evidence.of_table("libstdc++.so.6 links", ["directory", "why searched",
                                                                       "newest versioned file", "libstdc++.so.6 ->"],
                                              rows)]
