"""Check ``jit.other-caches``: the Triton caches on a network filesystem, and their held locks (see
probe_othercaches.py)."""

from __future__ import annotations

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check


@check("jit.other-caches", title="Triton caches: network filesystem and held locks", probes=("other_caches",))
def check_other_caches(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("other_caches"), facts.why_not("other_caches"))
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
