"""Rebuilding an op with a compiler the loaded libstdc++ serves: the remedy when no copy on the node is new
enough for what the op was built against.

A GCC's objects need libstdc++ version nodes up to the newest its own libstdc++ provides
(:func:`~zdoctor.readers.gccver.glibcxx_for_gcc`); a Red Hat devtoolset / gcc-toolset g++ links the newer
C++ parts statically, so what it builds needs no more than the system libstdc++ has.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.core.model import Remedy
from zdoctor.core.shellquote import shell_quote
from zdoctor.readers.gccver import glibcxx_for_gcc, toolset_of
from zdoctor.readers.versions import sort_key

#: Why the rebuild is not tried by zdoctor itself.
NOT_TRIED_REBUILD = ("rebuilding the op needs its sources and its build (DeepSpeed's JIT build runs when the "
                     "training first loads it), which zdoctor does not start")


def serving_compilers(compilers: Iterable[Mapping[str, Any]], provides_up_to: str | None) -> list[dict[str, Any]]:
    """The g++ compilers (toolchain probe's ``compilers``) whose objects the loaded libstdc++ serves: a
    gcc-toolset one, or a GCC whose libstdc++ is no newer than ``provides_up_to`` (the loaded copy's newest
    GLIBCXX); each once, in PATH order."""
    if not provides_up_to:
        return []
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for c in compilers:
        if c.get("name") not in ("g++", "c++") or c.get("family") != "gcc" or not c.get("path"):
            continue
        real = str(c.get("realpath") or c["path"])
        own = glibcxx_for_gcc(c.get("version"))
        served = bool(toolset_of(c["path"]) or toolset_of(real)) or (
            own is not None and sort_key(own) <= sort_key(provides_up_to))
        if served and real not in seen:
            seen.add(real)
            out.append(dict(c))
    return out


def rebuild_remedy(op: str, jit_dir: str | None, compiler: Mapping[str, Any], provides_up_to: str) -> Remedy:
    """Rebuild ``op`` with ``compiler``: its JIT cache folder removed (``jit_dir``, when it is a JIT-built op)
    and CXX set so torch's JIT build (and setuptools) use that compiler."""
    cxx = str(compiler["path"])
    toolset = toolset_of(cxx)
    why = (f"{toolset}'s g++ links the C++ parts newer than the system's libstdc++ statically into what it builds"
           if toolset else f"GCC {compiler.get('version')}'s objects need libstdc++ versions up to "
           f"{glibcxx_for_gcc(compiler.get('version'))}, and the loaded copy provides up to {provides_up_to}")
    commands = [f"rm -rf -- {shell_quote(jit_dir)}"] if jit_dir else []
    commands.append(f"export CXX={shell_quote(cxx)}")
    return Remedy(
        title=f"Rebuild {os.path.basename(op)} with {cxx} (GCC {compiler.get('version')}), which this node's "
              "libstdc++ serves",
        commands=commands, undo=["unset CXX"],
        explanation=(f"{why}. "
                     + ("Removing the op's JIT folder makes the next launch build it again with $CXX. "
                        if jit_dir else "Then rebuild it as it was built (its pip install or setup.py build). ")
                     + "Nothing else on the node changes."),
        note=f"not tried, because {NOT_TRIED_REBUILD}")


def jit_dir_of(op: str, targets: Iterable[Mapping[str, Any]]) -> str | None:
    """The JIT cache folder of ``op`` when the static audit read it as a JIT-built op, else None."""
    real = os.path.realpath(op)
    for t in targets:
        target = t.get("target") or {}
        if target.get("kind") == "jit-op" and os.path.realpath(str(target.get("path") or "")) == real:
            return os.path.dirname(str(target["path"]))
    return None
