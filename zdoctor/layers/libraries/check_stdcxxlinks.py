"""Check ``libs.stdcxx-link``: the libstdc++.so.6 links beside versioned files (see probe_stdcxxlinks.py)."""

from __future__ import annotations

import os

from zdoctor.core.model import Finding
from zdoctor.core.plural import count_of
from zdoctor.core.registry import CheckSpec, Facts, check


@check("libs.stdcxx-link", title="libstdc++.so.6 links beside versioned files", probes=("stdcxx_links",))
def check_stdcxx_links(facts: Facts, me: CheckSpec) -> list[Finding]:
    f = me.require(facts.of("stdcxx_links"), facts.why_not("stdcxx_links"))
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
