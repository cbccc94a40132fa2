"""The libstdc++ version nodes every object a traced run loaded needs (its own modules included).

ld.so stops an object's version check at its first missing node, so the error message names one
version; the object's ``.gnu.version_r`` names all of them. A copy is "one with every needed version"
only when it defines every node each loaded object asks of ``libstdc++.so.6``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.readers.elf import read_elf
from zdoctor.readers.versions import family_of, sort_key

LIBSTDCXX = "libstdc++.so.6"
#: At most this many objects are read (a torch run loads a few hundred).
MAX_OBJECTS = 3000
#: Objects named per version (the rest are counted in the need, not listed).
MAX_NEEDERS = 3


def run_objects(traces: Mapping[int, Any]) -> list[str]:
    """Every object the traced processes mapped: each library found, and each object whose version needs
    the loader checked (a module ``dlopen``-ed by path, the one that failed included), first pid first."""
    out: list[str] = []
    seen: set[str] = set()

    def add(path: str | None) -> None:
        if path and path not in seen and len(out) < MAX_OBJECTS:
            seen.add(path)
            out.append(path)

    for pid in sorted(traces):
        t = traces[pid]
        for lk in t.lookups:
            add(lk.found)
        for _version, _provider, required_by in t.version_checks:
            add(required_by)
        for e in t.version_errors:
            add(e.required_by)
    return out


def libstdcxx_needs(paths: Iterable[str]) -> dict[str, list[str]]:
    """Each strong ``libstdc++.so.6`` version node the objects at ``paths`` need -> the objects needing it
    (version order). An object that cannot be read adds nothing."""
    needers: dict[str, list[str]] = {}
    for path in paths:
        if not path.startswith("/"):
            continue
        info = read_elf(path)
        if not info.ok:
            continue
        for version, weak in info.needs_from(LIBSTDCXX):
            if weak:
                continue
            objs = needers.setdefault(version, [])
            if path not in objs and len(objs) < MAX_NEEDERS:
                objs.append(path)
    return {v: needers[v] for v in sorted(needers, key=sort_key)}


def is_libstdcxx_version(name: str) -> bool:
    """Whether ``name`` is a node libstdc++ defines (GLIBCXX_*, CXXABI_*): not glibc's, libgcc_s' or another
    library's."""
    return family_of(name) in ("GLIBCXX", "CXXABI")


def needed_versions(libs: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """The libstdc++ versions the training needs, from one place: the static audit's, those of every object
    the traced run loaded, and each the real loader reported missing (glibc's own versions left out)."""
    errors = [str(e.get("version") or "") for e in live.get("version_errors") or []]
    names = {*(libs.get("needs") or []), *(live.get("needs") or {}),
             *(v for v in errors if is_libstdcxx_version(v))}
    return sorted(names, key=sort_key)


def has_every(copy: Mapping[str, Any], needs: Iterable[str]) -> bool:
    """Whether an inventory copy defines every version in ``needs`` (by set membership)."""
    return not copy.get("error") and set(needs) <= set(copy.get("versions") or [])
