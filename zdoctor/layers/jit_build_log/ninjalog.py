"""A JIT op's ``.ninja_log`` against the ninja the next launch runs: does that ninja rebuild the op, and why.

torch's JIT build runs ``ninja -v`` from the launching shell's PATH (torch/utils/cpp_extension.py
``_run_ninja_build``) in the op dir. ninja reads ``.ninja_log`` there: its first line names the format
(``# ninja log v5``); each line after it is ``start_ms end_ms mtime output command_hash``, the last line for
an output winning. Which format a ninja writes and accepts, and how it hashes commands, changed across
releases (read from src/build_log.cc of each tag):

======== ====== ============================= ============== =========================================
ninja    writes accepts                       hash           on a log it refuses
======== ====== ============================= ============== =========================================
1.10     v5     v4 and newer                  MurmurHash64A  "build log version invalid, perhaps due to
1.11                                                          being too old; starting over"
1.12     v6     v6 only                       MurmurHash64A  "build log version is too old; starting over"
                                                             / "... too new; starting over"
1.13     v7     v7 only                       rapidhash      the same two messages
======== ====== ============================= ============== =========================================

A refused log is deleted and every output is rebuilt ("command line not found in log"); an accepted log
whose hash for an output is not this ninja's hash of the command rebuilds that output ("command line
changed"). So two shells that resolve ninjas of different series rebuild every op at every switch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from zdoctor.layers.jit_build_log.ninjahash import which_hash

_HEADER = re.compile(r"^# ninja log v(\d+)\s*$")
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
MAX_LOG_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class LogRule:
    """What one ninja release series does with .ninja_log."""

    first: tuple[int, int]  # the first release of the series
    last: tuple[int, int]  # the last release it is known for (same major.minor or an older one)
    writes: int
    oldest: int
    newest: int | None  # None: any newer format is read
    hash: str  # murmur | rapidhash
    too_old: str
    too_new: str | None
    source: str


LOG_RULES: tuple[LogRule, ...] = (
    LogRule((1, 10), (1, 11), 5, 4, None, "murmur",
            "build log version invalid, perhaps due to being too old; starting over", None,
            "ninja src/build_log.cc at v1.10.0 and v1.11.1: kOldestSupportedVersion 4, kCurrentVersion 5"),
    LogRule((1, 12), (1, 12), 6, 6, 6, "murmur", "build log version is too old; starting over",
            "build log version is too new; starting over",
            "ninja src/build_log.cc at v1.12.0 and v1.12.1: kOldestSupportedVersion 6, kCurrentVersion 6"),
    LogRule((1, 13), (1, 13), 7, 7, 7, "rapidhash", "build log version is too old; starting over",
            "build log version is too new; starting over",
            "ninja src/build_log.cc at v1.13.0 and v1.13.2: kOldestSupportedVersion 7, kCurrentVersion 7, rapidhash"),
)
HASH_NAMES = {"murmur": "MurmurHash64A", "rapidhash": "rapidhash"}


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"1.13.2.git.kitware.jobserver-pipe-1"`` -> ``(1, 13, 2)``."""
    m = _VERSION.match((text or "").strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def rule_for(version: tuple[int, ...] | None) -> LogRule | None:
    """The log rule of a ninja release; None for one outside the known series."""
    if version is None:
        return None
    mm = (version[0], version[1])
    return next((r for r in LOG_RULES if r.first <= mm <= r.last), None)


def read_log(text: str) -> dict[str, Any]:
    """``{version (int | None), entries: {output: {start_ms, end_ms, mtime, hash}}, lines, bad_lines}``."""
    lines = text.splitlines()
    m = _HEADER.match(lines[0]) if lines else None
    entries: dict[str, dict[str, Any]] = {}
    bad = 0
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) != 5:
            bad += 1
            continue
        try:
            start, end = int(parts[0]), int(parts[1])
        except ValueError:
            bad += 1
            continue
        entries[parts[3]] = {"start_ms": start, "end_ms": end, "mtime": parts[2], "hash": parts[4]}
    return {"version": int(m.group(1)) if m else None, "entries": entries, "lines": max(0, len(lines) - 1),
            "bad_lines": bad}


def last_build_ms(entries: dict[str, dict[str, Any]]) -> int | None:
    """How long the op's last build took, from ninja's start to its last command's end (the log's times are
    milliseconds since that ninja run began); None without entries."""
    ends = [e["end_ms"] for e in entries.values() if isinstance(e.get("end_ms"), int)]
    return max(ends) if ends else None


def predict(log: dict[str, Any] | None, commands: dict[str, str], ninja_version: tuple[int, ...] | None
            ) -> dict[str, Any]:
    """Whether the ninja of ``ninja_version`` rebuilds the op whose log is ``log`` and whose build.ninja
    runs ``commands`` ({output: command}): ``{rebuild: True | False | None, why, message, outputs}``
    (``outputs``: those it rebuilds; ``message``: what ninja prints about the log, if anything)."""
    rule = rule_for(ninja_version)
    ver = ".".join(map(str, ninja_version)) if ninja_version else "?"
    if rule is None:
        return {"rebuild": None, "why": f"what ninja {ver} does with a .ninja_log is not known to this zdoctor "
                                        "(known: 1.10 - 1.13)", "message": None, "outputs": []}
    outs = sorted(commands)
    if log is None or log.get("version") is None:
        return {"rebuild": True, "outputs": outs, "message": None,
                "why": "the op dir has no readable .ninja_log: ninja rebuilds every output ('command line not "
                       "found in log')"}
    lv = log["version"]
    if lv < rule.oldest or (rule.newest is not None and lv > rule.newest):
        msg = rule.too_old if lv < rule.oldest else rule.too_new
        return {"rebuild": True, "outputs": outs, "message": f"ninja: warning: {msg}",
                "why": f"the log is v{lv} and ninja {ver} reads only "
                       + (f"v{rule.oldest}" if rule.newest == rule.oldest else f"v{rule.oldest} and newer")
                       + f": it prints 'ninja: warning: {msg}', deletes the log and rebuilds every output"}
    entries = log.get("entries") or {}
    changed, missing, foreign = [], [], []
    for out in outs:
        e = entries.get(out)
        if e is None:
            missing.append(out)
            continue
        got = which_hash(e["hash"], commands[out])
        if got is None:
            changed.append(out)
        elif got != rule.hash:
            foreign.append(out)
    if foreign:
        other = "rapidhash (ninja 1.13)" if rule.hash == "murmur" else "MurmurHash64A (ninja 1.12 or older)"
        return {"rebuild": True, "outputs": sorted(foreign + changed + missing), "message": None,
                "why": f"ninja {ver} accepts the v{lv} log, but its hashes for {', '.join(foreign[:3])} are "
                       f"{other}'s and ninja {ver} hashes with {HASH_NAMES[rule.hash]}: it reads them as 'command "
                       "line changed' and rebuilds"}
    if changed or missing:
        parts = []
        if changed:
            parts.append(f"the log's command hash for {', '.join(changed[:3])} is not that of build.ninja's command "
                         "('command line changed')")
        if missing:
            parts.append(f"the log has no line for {', '.join(missing[:3])} ('command line not found in log')")
        return {"rebuild": True, "outputs": sorted(changed + missing), "message": None, "why": "; ".join(parts)}
    return {"rebuild": False, "outputs": [], "message": None,
            "why": f"ninja {ver} reads the v{lv} log and every output's hash is its own hash of build.ninja's "
                   "command"}
