"""Checks ``gpu.shm-access``, ``jit.other-caches`` and ``libs.stdcxx-link`` (see probes/smallfacts.py)."""

from __future__ import annotations

import os
import shlex

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check


@check("gpu.shm-access", title="/dev/shm writable by the training user", probes=("shm_access",))
def check_shm_access(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("shm_access")
    if f is None:
        return [me.not_checked(facts.why_not("shm_access"))]
    ev = facts.evidence("shm_access")
    path = f.get("path") or "/dev/shm"
    who = f"{f['tested_as']} (uid {f.get('user_uid')})" if f.get("tested_as") and f.get("user_uid") is not None \
        else f"uid {f['euid']}"
    if f.get("skipped") or f.get("write_test") is None:
        return [me.not_checked(f.get("skipped") or f.get("error") or "no create test ran", ev)]
    if f.get("write_test"):
        return [me.finding(status="ok",
                           title=f"{path} is writable by {who} (mode {f['mode']})", evidence=ev)]
    return [me.finding(
        status="fail",
        title=f"{who} cannot create files in {path} (mode {f['mode']}, owner uid {f['uid']}): "
              f"{f.get('error')}",
        detail="NCCL's shared-memory transport, torch's DataLoader workers (shared tensors) and DeepSpeed's "
               "shm communication create files here; their size is not the problem, the permission is. /dev/shm "
               "is normally a tmpfs with mode 1777 (everyone may create, only owners may delete).",
        evidence=ev,
        remedies=[Remedy(title=f"Give {path} its usual mode 1777", commands=[f"chmod 1777 {shlex.quote(path)}"],
                         requires_root=True, undo=[f"chmod {f['mode'][2:] if f.get('mode') else '755'} "
                                                   f"{shlex.quote(path)}"],
                         explanation="Lost at reboot if the mount sets another mode: then fix the mode= option of "
                                     "its tmpfs line in /etc/fstab (or the container's --shm-size / --ipc=host)."),
                  Remedy(title="Workaround: keep NCCL off shared memory (slower intra-node transfers)",
                         commands=["export NCCL_SHM_DISABLE=1"], undo=["unset NCCL_SHM_DISABLE"])])]


@check("jit.other-caches", title="Triton caches: network filesystem and held locks", probes=("other_caches",))
def check_other_caches(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("other_caches")
    if f is None:
        return [me.not_checked(facts.why_not("other_caches"))]
    ev = facts.evidence("other_caches")
    out = []
    for c in f.get("caches") or []:
        held = [x for x in c.get("locks") or [] if x.get("holders")]
        fs = (c.get("mount") or {}).get("fstype") or "?"
        if c.get("network"):
            lines = [f"{c['name']}: {c['path']} ({c['source']}) is on {fs} at {(c.get('mount') or {}).get('point')}.",
                     "DeepSpeed takes a FileLock on <key>.pickle.lock there while writing autotune results; file "
                     "locks on a network filesystem are slow and can hang (DeepSpeed itself warns: 'if you "
                     "experience slowdowns or hanging when DeepSpeed exits, ... set the TRITON_CACHE_DIR "
                     "environment variable to a non-NFS path')."]
            if held:
                lines.append(f"{count_of(len(held), 'lock file')} held now: " + ", ".join(
                    f"{x['path']} (pid {', '.join(map(str, x['holders']))})" for x in held[:5]))
            out.append(me.finding(status="warn",
                                  title=f"{c['name']} is on {fs} ({c['path']}): its locks can hang ranks",
                                  detail="\n".join(lines), evidence=ev,
                                  remedies=[Remedy(title="Point TRITON_CACHE_DIR at a local disk, per user",
                                                   commands=['export TRITON_CACHE_DIR="/tmp/triton-cache-$(id -u)"'],
                                                   undo=["unset TRITON_CACHE_DIR"])]))
        elif held:
            out.append(me.finding(status="ok",
                                  title=f"{c['name']}: {count_of(len(held), 'lock')} held by running processes",
                                  detail=", ".join(f"{x['path']} (pid {', '.join(map(str, x['holders']))})"
                                                   for x in held[:5]), evidence=ev))
    if not out and f.get("caches") and not any(c.get("exists") for c in f["caches"]):
        out.append(me.finding(status="ok", title="Triton caches would go to local filesystems "
                              "(none created yet)",
                              detail="; ".join(f"{c['name']}: {c['path']} (the file system of its nearest existing "
                                               f"parent: {(c.get('mount') or {}).get('fstype') or '?'})"
                                               for c in f["caches"]), evidence=ev))
    if not out:
        out.append(me.finding(status="ok", title="Triton caches are on local filesystems",
                              detail="; ".join(f"{c['name']}: {c['path']} "
                                               f"({(c.get('mount') or {}).get('fstype') or 'not created yet'})"
                                               for c in f.get("caches") or []), evidence=ev))
    return out


@check("libs.stdcxx-link", title="libstdc++.so.6 links beside versioned files", probes=("stdcxx_links",))
def check_stdcxx_links(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = facts.of("stdcxx_links")
    if f is None:
        return [me.not_checked(facts.why_not("stdcxx_links"))]
    ev = facts.evidence("stdcxx_links")
    out = []
    for d in f.get("dirs") or []:
        newest = d["newest"]
        if not d["link_present"] or d["link_target"] is None:
            what = "no libstdc++.so.6 link" if not d["link_present"] else "a dangling libstdc++.so.6 link"
            out.append(me.finding(status="warn",
                                  title=f"{d['dir']} has {newest} but {what}: the loader skips this directory",
                                  detail=f"The loader looks for the soname libstdc++.so.6, never for {newest}: in "
                                         f"{d['dir']} ({d['why']}) it finds nothing and takes the next copy on the "
                                         "search path, which may be older. The link is missing (a directory copied "
                                         "without its symlinks, or an interrupted install).", evidence=ev))
        elif d["link_n"] is not None and d["link_n"] < d["newest_n"]:
            out.append(me.finding(status="warn",
                                  title=f"{d['dir']}: libstdc++.so.6 points at {os.path.basename(d['link_target'])}, "
                                        f"an older file than {newest} beside it",
                                  detail=f"The loader uses what the link points at ({d['link_target']}); the newer "
                                         f"{newest} in the same directory ({d['why']}) is never loaded.", evidence=ev))
    if not out:
        out.append(me.finding(status="ok",
                              title="libstdc++.so.6 links point at the newest file in "
                                    f"{count_of(len(f.get('dirs') or []), 'directory', 'directories')}", evidence=ev))
    return out
