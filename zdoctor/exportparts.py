"""The pieces the Markdown and HTML exports share: a session's host, command line and times as text, the
fleet's tables, why an edge was taken, and what was done with a remedy. Below both renderers, so neither
imports the other."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from typing import Any

from .events import SessionView as Report
from .events import WalkView
from .model import STATUS_RANK, cap_text
from .plural import count_of, plural
from .present import (
    MARKS,
    summary_parts,
    written_text,
)
from .walkwords import edge_sentence, in_words


def fleet_tables(fleet: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], list[int]]]:
    """The recorded fleet report as two tables (title, columns, rows, highlighted rows): the node x check
    matrix by check family, and every fact that should be equal with its majority and the nodes that differ."""
    from .fleet.result import families, worst

    nodes = [n for n in fleet.get("nodes") or [] if isinstance(n, dict)]
    fams = families([_s(c) for c in fleet.get("checks") or []])
    rows, hot = [], []
    for i, n in enumerate(nodes):
        launch = n.get("launch") if isinstance(n.get("launch"), dict) else {}
        cells = n.get("cells") if isinstance(n.get("cells"), dict) else {}
        row = [f"{MARKS.get(_s(n.get('status')), '?')} {_s(n.get('host'))}", _s(launch.get("status"))]
        for checks in fams.values():
            got = [_s(cells[c]) for c in checks if _s(cells.get(c)) in STATUS_RANK]
            row.append(MARKS[worst(got)] if got and launch.get("status") == "ok" else "")
        rows.append(row)
        if n.get("status") in ("fail", "crash"):
            hot.append(i)
    skew_rows, skew_hot = [], []
    for i, r in enumerate(x for x in fleet.get("skew") or [] if isinstance(x, dict)):
        values = r.get("values") if isinstance(r.get("values"), dict) else {}
        judged = r.get("judged") is not False  # a per-node fact (an address) lists every node's value
        differing = [_s(h) for h in ((r.get("differing") or []) if judged else list(values or {}))]
        skew_rows.append([_s(r.get("title")), _s(r.get("majority")),
                          "; ".join(f"{h}: {_s(values.get(h))}" for h in differing)
                          or f"same on all {len(values)}"])
        if differing and judged:
            skew_hot.append(i)
    return [("Nodes x checks", ["node", "launch", *fams], rows, hot),
            ("Facts that should be equal on every node", ["fact", "majority", "differs on"], skew_rows, skew_hot)]


def _fleet_line(fleet: dict[str, Any]) -> str:
    s = fleet.get("summary") if isinstance(fleet.get("summary"), dict) else {}
    return (f"{_counted(s.get('nodes'), 'node')} from {_s(fleet.get('source'))} via {_s(fleet.get('launcher'))}: "
            f"{_s(s.get('reached'))} reached, {_s(s.get('failing'))} failing, "
            f"{_counted(s.get('differing_facts'), 'fact')} {_counted_verb(s.get('differing_facts'))}")


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _counted(value: Any, word: str) -> str:
    """A count of a recorded summary with its noun; what is not a count is shown as it was recorded."""
    return count_of(value, word) if isinstance(value, int) else f"{_s(value)} {plural(word)}"


def _counted_verb(value: Any) -> str:
    return "differs" if value == 1 else "differ"


def _when(ts: Any) -> str:
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        try:
            return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
        except (OverflowError, OSError, ValueError):
            pass
    return "unknown time"


def _argv_text(argv: Any) -> str:
    if isinstance(argv, (list, tuple)):
        return shlex.join(_s(a) for a in argv)
    return _s(argv)


def _command_line(argv: Any) -> str:
    """The command that started the session, as a user would type it."""
    text = _argv_text(argv)
    if isinstance(argv, (list, tuple)) and argv and os.path.basename(_s(argv[0])).startswith("zdoctor"):
        return text
    return f"zdoctor {text}".rstrip()


def _host_line(host: dict[str, Any]) -> str:
    name = _s(host.get("hostname")) or "unknown host"
    details = [_s(host.get("os")), f"kernel {host['kernel']}" if host.get("kernel") else "",
               _s(host.get("arch"))]
    details = [d for d in details if d]
    line = f"{name} ({', '.join(details)})" if details else name
    if host.get("kind") and host.get("kind") != "live":
        line += f" [{host['kind']}]"
    return line


def _summary_parts(counts: dict[str, Any]) -> list[tuple[str, str]]:
    parts = summary_parts(counts)
    total = counts.get("total", 0)
    parts.append((f"{total} finding{'' if total == 1 else 's'}", ""))
    return parts


TORN_NOTE = "The last event was cut off mid-write (the session was interrupted); it is left out."
UNFINISHED_NOTE = "The walk did not reach its end in this session."
STOPPED_AT_DIAGNOSIS_NOTE = "The walk stopped at this diagnosis; it was not closed in this session."


def open_walk_note(run: WalkView) -> str:
    """What an unclosed walk's record says about where it stopped, in one sentence that agrees with its
    diagnosis line: stopped at the diagnosis, left it for another step, or never reached one."""
    if run.end is not None:
        return ""
    last = run.nodes[-1] if run.nodes else None
    if run.diagnosis_node and last == run.diagnosis_node:
        return STOPPED_AT_DIAGNOSIS_NOTE
    if run.diagnosis_node and last:
        return f"The walk went on from this diagnosis to step {last} and did not reach its end in this session."
    return UNFINISHED_NOTE
OPEN_NOTE = "still open (exported during the session)"
UNENDED_NOTE = "not recorded (interrupted, or still running)"


def _ended(rep: Report) -> str:
    """When and how the session ended; a session exported while it runs is still open."""
    if rep.end is not None:
        code = rep.end.get("exit_code")
        return _when(rep.end.get("ts")) + (f", exit code {code}" if code is not None else "")
    return OPEN_NOTE if rep.live else UNENDED_NOTE


def _other_body(ev: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in ev.items() if k not in ("seq", "ts", "type")}, ensure_ascii=False,
                      default=str)
    return cap_text(body, 500)[0]


_MECHANICAL_REASON = re.compile(r"(fallback|question default|predicate \S+ is (true|false))")


def _edge_text(ev: dict[str, Any]) -> str:
    """Why the walk took an edge, as a sentence: a condition's description, never its internal name.

    The walk records its own short forms (``fallback``, ``predicate X is true``); they are put into words
    here, and a condition that could not be checked keeps its error.
    """
    reason = _s(ev.get("reason"))
    first, *rest = reason.split("; ")
    if ev.get("override"):
        return "chosen by the user"
    if isinstance(ev.get("condition"), dict):
        from .conditions import parse_condition

        cond, _problems = parse_condition(ev["condition"])
        if cond is not None:
            said = cond.describe()
            return f"it is not the case that {said}" if ev.get("negate") else said
    if reason and not _MECHANICAL_REASON.fullmatch(first):
        return in_words(reason)
    text = edge_sentence(ev.get("predicate"), ev.get("negate"), False, first)
    broken = [in_words(part) for part in rest if " failed (" in part]
    return text + (f" ({'; '.join(broken)})" if broken else "")



def _outcome(ev: dict[str, Any]) -> tuple[str, str]:
    """(mark, word) for a remedy event: applied, failed, declined (with how), practised, copied, or written
    to a file to source."""
    kind = ev.get("type")
    if kind == "remedy_declined":
        how = _s(ev.get("how") or "")
        return MARKS["skip"], "declined" + (f": {how}" if how and how != "declined" else "")
    if kind == "remedy_practised":
        return MARKS["skip"], "practised: nothing was run"
    if kind == "remedy_copied":
        return MARKS["skip"], "copied to the clipboard: nothing was run by zdoctor"
    if kind == "remedy_written":
        return MARKS["ok"], written_text(_s(ev.get("env_file")) or "a file")
    return (MARKS["ok"], "applied") if ev.get("ok") is True else (MARKS["fail"], "failed")


