"""``stdcxx_links``: a libstdc++.so.6.0.N in a library directory without the libstdc++.so.6 link the loader
looks for, or with the link on an older file."""

from __future__ import annotations

import os
import re
from typing import Any

from zdoctor.core.factstypes import StdcxxLinksFacts
from zdoctor.core.model import Evidence
from zdoctor.core.registry import probe

_VERSIONED = re.compile(r"^libstdc\+\+\.so\.6\.0\.(\d+)$")


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
