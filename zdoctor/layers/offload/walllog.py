"""Read the ``wall_clock_breakdown`` timings out of a training log and say which phase dominates.

With ``"wall_clock_breakdown": true`` DeepSpeed prints (runtime/engine.py, utils/timer.py; no file is
written) on rank 0, per micro step and per optimizer step::

    [Rank 0] time (ms) | fwd_microstep: 7.21 | bwd_microstep: 17.36 | ... | step_microstep: 4.18
    [Rank 0] time (ms) | fwd: 7.21 | bwd: 17.36 | bwd_inner: 13.12 | bwd_allreduce: 4.19 | step: 4.18
    [Rank 0] time (ms) | optimizer_step: 1.98

ZeRO-3 adds ``optimizer_swap_in_state`` / ``optimizer_swap_out_state`` with NVMe offload (timed inside
``optimizer_step``); ``init_optimizer_state`` is printed once. Before DeepSpeed 0.18 the same lines went
through the logger and carry its prefix ``[date] [INFO] [logging.py:N:log_dist] ``; timer names come in
any order (DeepSpeed logs a set). ``fwd``/``bwd``/``step`` are read in preference to the ``_microstep``
timers; ``bwd_inner``/``bwd_allreduce`` are parts of ``bwd``, the swaps parts of ``optimizer_step``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.proc.userfile import open_user_file

#: Logs larger than this are read from the end (the timings of the latest steps are what matter); the cap
#: keeps a log of any size under the memory budget (bytes, text and lines of it held at once).
MAX_BYTES = 32 * 1024 * 1024
#: Phase means leave out the first sample when there are at least this many (warm-up, JIT, allocation).
WARMUP_MIN_SAMPLES = 3
#: The swaps count as dominating the optimizer step from this share of it on.
SWAP_DOMINATES = 0.5

_TIMER = re.compile(r"(?:\[Rank (?P<rank>\d+)\] )?time \(ms\) \| (?P<body>.*)$")
_PAIR = re.compile(r"([A-Za-z_][\w.]*): (-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
_PREFIX = re.compile(r"\[[^\]]*\] \[[A-Z]+\] \[logging\.py:\d+:log_dist\] ")
_FLAG = re.compile(r"--zero[-_]offload\b")

#: Timer names per phase, current names first. Older releases print ``forward``/``forward_microstep``,
#: ``backward``/``backward_microstep`` (runtime/engine.py FORWARD_MICRO_TIMER = 'forward_microstep'); a log
#: from them read with the current names alone would show only ``step``, i.e. "the step takes 100%".
PHASES = (("forward", "fwd", "fwd_microstep", "forward", "forward_microstep"),
          ("backward", "bwd", "bwd_microstep", "backward", "backward_microstep"),
          ("step", "step", "step_microstep"))
#: Parts of the backward timer: (current name, older name).
BACKWARD_PARTS = (("bwd_inner", "backward_inner"), ("bwd_allreduce", "backward_allreduce"))
SWAP_TIMERS = ("optimizer_swap_in_state", "optimizer_swap_out_state")


@dataclass
class TimerStats:
    samples: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        s = self.samples
        steady = s[1:] if len(s) >= WARMUP_MIN_SAMPLES else s
        return {"count": len(s), "total_ms": round(sum(s), 3), "mean_ms": round(sum(s) / len(s), 3) if s else None,
                "min_ms": min(s) if s else None, "max_ms": max(s) if s else None, "first_ms": s[0] if s else None,
                "steady_mean_ms": round(sum(steady) / len(steady), 3) if steady else None,
                "steady_total_ms": round(sum(steady), 3)}


def parse_lines(lines: Iterable[str], first_lineno: int = 1) -> dict[str, Any]:
    """Timer statistics from log lines (see :func:`breakdown` for the facts)."""
    per_rank: dict[int, dict[str, TimerStats]] = {}
    timer_lines = prefixed = plain = 0
    flags: list[list[Any]] = []
    lineno = first_lineno - 1
    for lineno, line in enumerate(lines, first_lineno):
        if "--zero" in line and _FLAG.search(line) and len(flags) < 5:
            flags.append([lineno, line.strip()[:300]])
        m = _TIMER.search(line)
        if not m:
            continue
        pairs = _PAIR.findall(m.group("body"))
        if not pairs:
            continue
        timer_lines += 1
        if _PREFIX.search(line[:m.start()]):
            prefixed += 1
        else:
            plain += 1
        rank = int(m.group("rank")) if m.group("rank") else 0
        timers = per_rank.setdefault(rank, {})
        for name, value in pairs:
            timers.setdefault(name, TimerStats()).samples.append(float(value))
    lines_read = lineno - first_lineno + 1
    return breakdown(per_rank, lines_read, timer_lines, prefixed, plain, flags)


def _phase(timers: dict[str, dict[str, Any]], names: tuple[str, ...]) -> dict[str, Any] | None:
    for name in names:
        if name in timers:
            return {"timer": name, **timers[name]}
    return None


def breakdown(per_rank: dict[int, dict[str, TimerStats]], lines_read: int, timer_lines: int, prefixed: int,
              plain: int, flags: list[list[Any]]) -> dict[str, Any]:
    """The facts: timers of the lowest rank, phases, shares, the dominant phase and the swap share."""
    ranks = sorted(per_rank)
    fmt = "none" if not timer_lines else "prefixed (before 0.18)" if prefixed and not plain else \
        "plain (0.18 and later)" if plain and not prefixed else "mixed"
    out: dict[str, Any] = {"lines_read": lines_read, "timer_lines": timer_lines, "ranks": ranks, "format": fmt,
                           "rank": ranks[0] if ranks else None, "timers": {}, "phases": {}, "shares": {},
                           "dominant": None, "iteration_ms": None, "swap": None, "backward_parts": None,
                           "step_bound": False, "disk_bound": False, "zero_offload_flag": flags}
    if not ranks:
        return out
    timers = {n: s.summary() for n, s in sorted(per_rank[ranks[0]].items())}
    out["timers"] = timers
    phases = {}
    for phase, *names in PHASES:
        p = _phase(timers, tuple(names))
        if p:
            phases[phase] = p
    out["phases"] = phases
    out["timer_names"] = ("older (forward/backward)" if any(p["timer"].startswith(("forward", "backward"))
                                                           for p in phases.values()) else "current")
    out["phases_missing"] = [ph for ph, *_ in PHASES if ph not in phases]
    total = sum(p["steady_mean_ms"] or 0 for p in phases.values())
    if phases and total > 0:
        out["iteration_ms"] = round(total, 3)
        out["shares"] = {k: round((p["steady_mean_ms"] or 0) / total, 4) for k, p in phases.items()}
        if not out["phases_missing"]:  # a share of an incomplete set of phases is no share
            out["dominant"] = max(out["shares"], key=lambda k: out["shares"][k])
    bwd = phases.get("backward")
    if bwd:
        suffix = "_microstep" if bwd["timer"].endswith("_microstep") else ""
        parts = {}
        for k, older in BACKWARD_PARTS:
            for name in (f"{k}{suffix}", f"{older}{suffix}"):
                if name in timers:
                    parts[k] = timers[name]["steady_mean_ms"]
                    break
        if parts and bwd["steady_mean_ms"]:
            out["backward_parts"] = {k: {"mean_ms": v, "share": round(v / bwd["steady_mean_ms"], 4)}
                                     for k, v in parts.items()}
    swaps = {k: timers[k] for k in SWAP_TIMERS if k in timers}
    opt = timers.get("optimizer_step")
    if swaps:
        swap_ms = sum(s["steady_mean_ms"] or 0 for s in swaps.values())
        base = (opt or {}).get("steady_mean_ms") or ((phases.get("step") or {}).get("steady_mean_ms"))
        out["swap"] = {"timers": {k: v["steady_mean_ms"] for k, v in swaps.items()}, "mean_ms": round(swap_ms, 3),
                       "of": "optimizer_step" if opt else "step",
                       "share_of_step": round(swap_ms / base, 4) if base else None}
    out["step_bound"] = out["dominant"] == "step"
    share = (out["swap"] or {}).get("share_of_step")
    out["disk_bound"] = bool(out["step_bound"] and share is not None and share >= SWAP_DOMINATES)
    return out


def read_log_lines(path: str, cap: int = MAX_BYTES) -> tuple[list[str], dict[str, Any]]:
    """The lines of a log (the last ``cap`` bytes of a larger one) and what was read."""

    fh, st = open_user_file(path, "training log")  # a regular file only: a FIFO would block for ever
    try:
        with fh:
            head = fh.read(64 * 1024)
            nul = head.find(b"\x00")
            if nul >= 0:
                raise InputError(f"{path}: not a text log (NUL byte at offset {nul})")
            size = st.st_size if st.st_size > 0 else None
            skipped = 0
            if size is not None and size > cap:
                fh.seek(size - cap)
                fh.readline(cap)  # the first, partial line
                skipped = fh.tell()
                data = fh.read(cap)
            else:
                fh.seek(0)
                data = fh.read(cap + 1)
                if len(data) > cap:  # a growing file: keep the tail
                    data = data[-cap:]
                    skipped = -1
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    text = data.decode("utf-8", errors="replace")
    return text.splitlines(), {"path": path, "size": st.st_size, "skipped_bytes": skipped, "read_bytes": len(data)}


def parse_log(path: str, cap: int = MAX_BYTES) -> dict[str, Any]:
    """Facts of :func:`breakdown` for the log at ``path``, plus what was read."""
    lines, meta = read_log_lines(path, cap)
    out = parse_lines(lines)
    out.update(meta)
    out["head_skipped"] = meta["skipped_bytes"] != 0
    return out
