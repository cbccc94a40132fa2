"""Symbol version names (``GLIBCXX_3.4.30``): parsing, numeric ordering, and set-membership checks.

Pass/fail is always set membership (ld.so compares names exactly); numeric order is only used for
messages such as "provides up to GLIBCXX_3.4.28, needs GLIBCXX_3.4.30".
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: The newest libstdc++ symbol version each GCC release provides (libstdc++ manual, "ABI Policy").
#: An object built by that GCC may need version nodes up to this one, never newer.
GCC_GLIBCXX: tuple[tuple[tuple[int, ...], str, str], ...] = (
    ((4, 8, 0), "GLIBCXX_3.4.18", "CXXABI_1.3.7"),
    ((4, 8, 3), "GLIBCXX_3.4.19", "CXXABI_1.3.7"),
    ((4, 9, 0), "GLIBCXX_3.4.20", "CXXABI_1.3.8"),
    ((5, 1), "GLIBCXX_3.4.21", "CXXABI_1.3.9"),
    ((6, 1), "GLIBCXX_3.4.22", "CXXABI_1.3.10"),
    ((7, 1), "GLIBCXX_3.4.23", "CXXABI_1.3.11"),
    ((7, 2), "GLIBCXX_3.4.24", "CXXABI_1.3.11"),
    ((8, 1), "GLIBCXX_3.4.25", "CXXABI_1.3.11"),
    ((9, 1), "GLIBCXX_3.4.26", "CXXABI_1.3.12"),
    ((9, 2), "GLIBCXX_3.4.27", "CXXABI_1.3.12"),
    ((9, 3), "GLIBCXX_3.4.28", "CXXABI_1.3.12"),
    ((10, 1), "GLIBCXX_3.4.28", "CXXABI_1.3.12"),
    ((11, 1), "GLIBCXX_3.4.29", "CXXABI_1.3.13"),
    ((12, 1), "GLIBCXX_3.4.30", "CXXABI_1.3.13"),
    ((13, 1), "GLIBCXX_3.4.31", "CXXABI_1.3.14"),
    ((13, 2), "GLIBCXX_3.4.32", "CXXABI_1.3.14"),
    ((14, 1), "GLIBCXX_3.4.33", "CXXABI_1.3.15"),
    ((15, 1), "GLIBCXX_3.4.34", "CXXABI_1.3.16"),
)

_VERSION = re.compile(r"^(?P<family>.+?)_(?P<num>\d+(?:\.\d+)*)$")


def parse_version(name: str) -> tuple[str, tuple[int, ...]] | None:
    """``"GLIBCXX_3.4.9"`` -> ``("GLIBCXX", (3, 4, 9))``; None for names without a number."""
    m = _VERSION.match(name or "")
    if not m:
        return None
    return m.group("family"), tuple(int(p) for p in m.group("num").split("."))


def family_of(name: str) -> str:
    """The family of a version name (``GLIBCXX``, ``CXXABI``, ``GLIBC``, ...), or the name itself."""
    parsed = parse_version(name)
    return parsed[0] if parsed else name


def sort_key(name: str) -> tuple[str, tuple[int, ...], str]:
    """Sort key that orders ``GLIBCXX_3.4.9`` before ``GLIBCXX_3.4.29``."""
    parsed = parse_version(name)
    return (parsed[0], parsed[1], name) if parsed else (name, (), name)


def newest(names: Iterable[str], family: str) -> str | None:
    """The numerically newest name of ``family`` among ``names`` (None when there is none)."""
    best: tuple[tuple[int, ...], str] | None = None
    for n in names:
        parsed = parse_version(n)
        if parsed and parsed[0] == family and (best is None or parsed[1] > best[0]):
            best = (parsed[1], n)
    return best[1] if best else None


def missing(needed: Iterable[tuple[str, bool]], provided: Iterable[str] | None) -> list[str]:
    """Version names in ``needed`` ((name, weak) pairs) that ``provided`` lacks, in need order.

    A provider without version definitions (``provided`` None) passes everything, as in ld.so;
    weak needs are tolerated when missing.
    """
    if provided is None:
        return []
    have = set(provided)
    out: list[str] = []
    for name, weak in needed:
        if not weak and name not in have and name not in out:
            out.append(name)
    return out


def gcc_release_for(name: str) -> str | None:
    """The first GCC release whose libstdc++ defines ``name`` (``GLIBCXX_3.4.30`` -> ``"12.1"``)."""
    parsed = parse_version(name)
    if not parsed or parsed[0] not in ("GLIBCXX", "CXXABI"):
        return None
    family, number = parsed
    for release, glibcxx, cxxabi in GCC_GLIBCXX:
        newest_here = parse_version(glibcxx if family == "GLIBCXX" else cxxabi)
        if newest_here and newest_here[1] >= number:
            return ".".join(str(p) for p in release)
    return None


def gcc_release_providing(names: Iterable[str]) -> str | None:
    """The oldest GCC release whose libstdc++ provides every GLIBCXX/CXXABI name in ``names``."""
    best: tuple[int, ...] = ()
    for n in names:
        rel = gcc_release_for(n)
        if rel is None:
            parsed = parse_version(n)
            if parsed and parsed[0] in ("GLIBCXX", "CXXABI"):
                return None  # newer than any release we know
            continue
        t = tuple(int(p) for p in rel.split("."))
        best = max(best, t)
    return ".".join(str(p) for p in best) if best else None


def gcc_series(newest_glibcxx: str | None) -> str | None:
    """The GCC releases whose libstdc++ tops out at ``newest_glibcxx``: ``GLIBCXX_3.4.28`` -> ``"9.3 to 10.x"``.

    A copy whose newest node is that one shipped with one of these releases (GCC 12.x defines up to
    GLIBCXX_3.4.30; 13.1 adds 3.4.31).
    """
    if not newest_glibcxx:
        return None
    rows = [(rel, g) for rel, g, _ in GCC_GLIBCXX]
    first = next((i for i, (_, g) in enumerate(rows) if g == newest_glibcxx), None)
    if first is None:
        return None
    last = first
    while last + 1 < len(rows) and rows[last + 1][1] == newest_glibcxx:
        last += 1

    def fmt(rel: tuple[int, ...]) -> str:
        return ".".join(str(p) for p in rel)

    lo, hi = rows[first][0], rows[last][0]
    nxt = rows[last + 1][0] if last + 1 < len(rows) else None
    open_ended = nxt is None or nxt[0] != hi[0]  # the series runs to the end of that major release
    if lo[0] == hi[0]:
        if not open_ended:
            return fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}"
        return f"{lo[0]}.x" if lo[1:] in ((), (1,), (1, 0)) else f"{fmt(lo)} to {lo[0]}.x"
    return f"{fmt(lo)} to {hi[0]}.x" if open_ended else f"{fmt(lo)} to {fmt(hi)}"
