"""The report document: a session (or a `check` run) folded once into one typed document that every renderer
draws — the terminal report, Markdown, HTML and JSON.

:func:`from_session` builds it from a :class:`~zdoctor.walk.events.SessionView`, :func:`from_check` from what
`check` returns. The document holds words, not markup: every text is the plain sentence a renderer escapes
for its format. Each evidence table has a stable id (``E1``, ``E2`` … in the order the document first shows
it; the same label, columns and rows are one table), so an export shows a table in full once and refers to
it where it is used again. ``data`` is the loss-free record the JSON renderer writes as it is.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zdoctor.core.model import cap_text
from zdoctor.core.plural import count_of, plural
from zdoctor.core.present import (
    MARKS,
    answer_line,
    applied_heading,
    are_steps,
    first_line,
    is_recommended,
    missing_tools,
    option_label,
    options_heading,
    recommendation,
    remedy_flags,
    requires_of,
    summary_parts,
    symptom_place,
    symptom_verdict,
    unexplained_headline,
    written_text,
)
from zdoctor.core.verdicts import STATUS_RANK, split_answers, verification_of
from zdoctor.walk.conditions import parse_condition
from zdoctor.walk.walkwords import edge_sentence, in_words

if TYPE_CHECKING:
    from zdoctor.walk.doctor import CheckReport, PlaybookRun
    from zdoctor.walk.events import SessionView, WalkView

TORN_NOTE = "The last event was cut off mid-write (the session was interrupted); it is left out."
UNFINISHED_NOTE = "The walk did not reach its end in this session."
STOPPED_AT_DIAGNOSIS_NOTE = "The walk stopped at this diagnosis; it was not closed in this session."
OPEN_NOTE = "still open (exported during the session)"
UNENDED_NOTE = "not recorded (interrupted, or still running)"
#: The section anchors of an export (finding, playbook and step anchors never take these).
SECTION_ANCHORS = ("symptoms", "summary", "fleet", "path", "findings", "also-found", "applied", "probes", "other")


# --- the document -------------------------------------------------------------------------------

@dataclass
class EvidenceTable:
    """A table of evidence: ``id`` is stable within the document (``E1`` …) and names one label, columns and
    rows however many findings rest on it."""

    id: str
    label: str
    columns: list[str]
    rows: list[list[str]]
    highlight: list[int] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return self.id.lower()


@dataclass
class Evidence:
    """One piece of evidence a finding rests on; ``table_first`` says this is where its table is shown in
    full (elsewhere a renderer refers to it)."""

    kind: str
    label: str
    command: str = ""
    has_exit: bool = False
    exit_code: Any = None
    duration_s: float | None = None
    paths: list[str] = field(default_factory=list)
    error: str = ""
    truncated: bool = False
    table: EvidenceTable | None = None
    table_first: bool = True
    stdout: str = ""
    stderr: str = ""


@dataclass
class RemedyItem:
    """One remedy of a finding: its option label, its trial state (the first of ``flags``) and its script."""

    label: str
    title: str
    flags: list[str]
    first: str = ""  # what must be fixed before it, in words (empty: nothing)
    explanation: str = ""
    commands: list[str] = field(default_factory=list)
    undo: list[str] = field(default_factory=list)
    recommended: bool = True
    #: Its verification's state (``fixed``, ``tool_starts``, ``not_fixed``, ``not_tried``): what its mark shows.
    verification: str = ""
    requires_root: bool = False
    #: Each tool its commands need that the node lacks, in the words of :func:`~zdoctor.core.present.tool_missing`.
    missing: list[str] = field(default_factory=list)

    @property
    def trial(self) -> str:
        """Whether it was tried, and how it went (``not tried, because …``, ``tried: fixed`` …)."""
        return self.flags[0] if self.flags else ""


@dataclass
class FindingItem:
    """A finding with the symptoms it explains, its evidence and its remedies."""

    id: str
    status: str
    title: str
    detail: str
    anchor: str
    explains: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    remedies: list[RemedyItem] = field(default_factory=list)
    options_heading: str = ""
    recommendation: str = ""


@dataclass
class SymptomItem:
    """One entry of the symptom ledger: what the user saw and what explains it (nothing: UNEXPLAINED)."""

    id: str
    place: str
    text: str
    verdict: str
    explained_by: list[str]
    answer: str = ""
    #: Where its message comes from in the installed code ("" when not located).
    origin: str = ""


@dataclass
class WalkStep:
    """A node the walk entered (``edge`` False) or an edge it took, with the number of its node."""

    number: int
    edge: bool
    node: str = ""
    kind: str = ""
    title: str = ""
    to: str = ""
    origin: str = ""
    why: str = ""
    anchor: str = ""


@dataclass
class WalkRun:
    """One walk through a playbook: its path, its steps where recorded, and how it ended."""

    playbook: str
    title: str
    path: list[str]
    steps: list[WalkStep] = field(default_factory=list)
    diagnosis: str = ""  # the diagnosis node
    diagnosis_title: str = ""
    reason: str = ""  # why it ended there, in words
    open_note: str = ""  # a walk that did not end in this session
    healthy: bool = False
    examined: list[str] = field(default_factory=list)
    not_examined: list[str] = field(default_factory=list)
    failing_on_path: list[dict[str, str]] = field(default_factory=list)
    anchor: str = ""


@dataclass
class AppliedFix:
    """What was done with a remedy: applied, failed, declined, practised, copied or written to a file."""

    mark: str
    status: str  # the status its mark is drawn in
    title: str
    outcome: str
    finding_id: str
    when: str
    ran: bool  # the remedy was run (it has an exit code)
    exit_code: Any = None
    env_file: str = ""  # environment changes written to this file (besides running it)
    changed: list[str] = field(default_factory=list)
    backup: str = ""
    commands: list[str] = field(default_factory=list)
    undo: list[str] = field(default_factory=list)
    output: str = ""


@dataclass
class ProbeRow:
    """A probe's result as the exports list it."""

    probe: str
    status: str
    time: str
    step: str
    error: str


@dataclass
class OtherEvent:
    """An event no section shows, with its fields as a capped line."""

    seq: str
    type: str
    when: str
    body: str


@dataclass
class FleetPart:
    """A fleet's report: one line and its tables (title, columns, rows, highlighted rows)."""

    line: str
    tables: list[tuple[str, list[str], list[list[str]], list[int]]]


@dataclass
class ReportDoc:
    """One report: a session or a `check` run, ready for every renderer."""

    kind: str  # "session" or "check"
    session_id: str  # empty when none was recorded
    host: dict[str, Any]
    #: The header rows: (key, value in parts); a part whose flag is set is code (a command, an exit code).
    meta: list[tuple[str, list[tuple[str, bool]]]]
    torn: bool
    symptoms: list[SymptomItem]
    unexplained: str  # the headline when a symptom is unexplained, else ""
    counts: dict[str, Any]
    answers: list[FindingItem]
    rest: list[FindingItem]
    runs: list[WalkRun] = field(default_factory=list)
    fleet: FleetPart | None = None
    applied: list[AppliedFix] = field(default_factory=list)
    applied_heading: str = ""
    probes: list[ProbeRow] = field(default_factory=list)
    others: list[OtherEvent] = field(default_factory=list)
    tables: list[EvidenceTable] = field(default_factory=list)
    recorded_elsewhere: bool = False
    incomplete: str | None = None
    layers: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def findings(self) -> list[FindingItem]:
        """Every finding, in the one order of every renderer: the answers, then the rest."""
        return self.answers + self.rest

    def referenced(self) -> set[str]:
        """The ids of the tables used more than once (shown once, referred to elsewhere)."""
        seen = [e.table.id for f in self.findings for e in f.evidence if e.table is not None and not e.table_first]
        return set(seen)


# --- shared words -------------------------------------------------------------------------------

def _dict(value: Any) -> dict[str, Any]:
    """``value`` where it is a mapping as recorded, else an empty one."""
    return value if isinstance(value, dict) else {}


def text_of(value: Any) -> str:
    """A recorded value as text (nothing for None)."""
    return "" if value is None else str(value)


def when(ts: Any) -> str:
    """A recorded time in UTC, or ``unknown time``."""
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        try:
            return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
        except (OverflowError, OSError, ValueError):
            pass
    return "unknown time"


def argv_text(argv: Any) -> str:
    if isinstance(argv, (list, tuple)):
        return shlex.join(text_of(a) for a in argv)
    return text_of(argv)


def command_line(argv: Any) -> str:
    """The command that started the session, as a user would type it."""
    text = argv_text(argv)
    if isinstance(argv, (list, tuple)) and argv and os.path.basename(text_of(argv[0])).startswith("zdoctor"):
        return text
    return f"zdoctor {text}".rstrip()


def host_line(host: dict[str, Any]) -> str:
    name = text_of(host.get("hostname")) or "unknown host"
    details = [text_of(host.get("os")), f"kernel {host['kernel']}" if host.get("kernel") else "",
               text_of(host.get("arch"))]
    details = [d for d in details if d]
    line = f"{name} ({', '.join(details)})" if details else name
    if host.get("kind") and host.get("kind") != "live":
        line += f" [{host['kind']}]"
    return line


def total_line(counts: dict[str, Any]) -> str:
    total = counts.get("total", 0)
    return count_of(total, "finding")


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


def ended_text(view: SessionView) -> str:
    """When and how the session ended; a session exported while it runs is still open."""
    if view.end is not None:
        code = view.end.get("exit_code")
        return when(view.end.get("ts")) + (f", exit code {code}" if code is not None else "")
    return OPEN_NOTE if view.live else UNENDED_NOTE


def other_body(ev: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in ev.items() if k not in ("seq", "ts", "type")}, ensure_ascii=False,
                      default=str)
    return cap_text(body, 500)[0]


_MECHANICAL_REASON = re.compile(r"(fallback|question default|predicate \S+ is (true|false))")


def edge_text(ev: dict[str, Any]) -> str:
    """Why the walk took an edge, as a sentence: a condition's description, never its internal name.

    The walk records its own short forms (``fallback``, ``predicate X is true``); they are put into words
    here, and a condition that could not be checked keeps its error.
    """
    reason = text_of(ev.get("reason"))
    first, *rest = reason.split("; ")
    if ev.get("override"):
        return "chosen by the user"
    if isinstance(ev.get("condition"), dict):

        cond, _problems = parse_condition(ev["condition"])
        if cond is not None:
            said = cond.describe()
            return f"it is not the case that {said}" if ev.get("negate") else said
    if reason and not _MECHANICAL_REASON.fullmatch(first):
        return in_words(reason)
    text = edge_sentence(ev.get("predicate"), ev.get("negate"), False, first)
    broken = [in_words(part) for part in rest if " failed (" in part]
    return text + (f" ({'; '.join(broken)})" if broken else "")


def outcome(ev: dict[str, Any]) -> tuple[str, str]:
    """(mark, word) for a remedy event: applied, failed, declined (with how), practised, copied, or written
    to a file to source."""
    kind = ev.get("type")
    if kind == "remedy_declined":
        how = text_of(ev.get("how") or "")
        return MARKS["skip"], "declined" + (f": {how}" if how and how != "declined" else "")
    if kind == "remedy_practised":
        return MARKS["skip"], "practised: nothing was run"
    if kind == "remedy_copied":
        return MARKS["skip"], "copied to the clipboard: nothing was run by zdoctor"
    if kind == "remedy_written":
        return MARKS["ok"], written_text(text_of(ev.get("env_file")) or "a file")
    return (MARKS["ok"], "applied") if ev.get("ok") is True else (MARKS["fail"], "failed")


def fleet_tables(fleet: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], list[int]]]:
    """The recorded fleet report as two tables (title, columns, rows, highlighted rows): the node x check
    matrix by check family, and every fact that should be equal with its majority and the nodes that differ."""

    from zdoctor.fleet.result import families, worst  # the fleet's own modules, only for a fleet's report

    nodes = [n for n in fleet.get("nodes") or [] if isinstance(n, dict)]
    fams = families([text_of(c) for c in fleet.get("checks") or []])
    rows, hot = [], []
    for i, n in enumerate(nodes):
        launch = _dict(n.get("launch"))
        cells = _dict(n.get("cells"))
        row = [f"{MARKS.get(text_of(n.get('status')), '?')} {text_of(n.get('host'))}", text_of(launch.get("status"))]
        for checks in fams.values():
            got = [text_of(cells[c]) for c in checks if text_of(cells.get(c)) in STATUS_RANK]
            row.append(MARKS[worst(got)] if got and launch.get("status") == "ok" else "")
        rows.append(row)
        if n.get("status") in ("fail", "crash"):
            hot.append(i)
    skew_rows, skew_hot = [], []
    for i, r in enumerate(x for x in fleet.get("skew") or [] if isinstance(x, dict)):
        values = _dict(r.get("values"))
        judged = r.get("judged") is not False  # a per-node fact (an address) lists every node's value
        differing = [text_of(h) for h in ((r.get("differing") or []) if judged else list(values or {}))]
        skew_rows.append([text_of(r.get("title")), text_of(r.get("majority")),
                          "; ".join(f"{h}: {text_of(values.get(h))}" for h in differing)
                          or f"same on all {len(values)}"])
        if differing and judged:
            skew_hot.append(i)
    return [("Nodes x checks", ["node", "launch", *fams], rows, hot),
            ("Facts that should be equal on every node", ["fact", "majority", "differs on"], skew_rows, skew_hot)]


def _counted(value: Any, word: str) -> str:
    """A count of a recorded summary with its noun; what is not a count is shown as it was recorded."""
    return count_of(value, word) if isinstance(value, int) else f"{text_of(value)} {plural(word)}"


def fleet_line(fleet: dict[str, Any]) -> str:
    s = _dict(fleet.get("summary"))
    differing = s.get("differing_facts")
    return (f"{_counted(s.get('nodes'), 'node')} from {text_of(fleet.get('source'))} via "
            f"{text_of(fleet.get('launcher'))}: {text_of(s.get('reached'))} reached, {text_of(s.get('failing'))} "
            f"failing, {_counted(differing, 'fact')} {'differs' if differing == 1 else 'differ'}")


# --- building it --------------------------------------------------------------------------------

_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class Anchors:
    """Unique, safe anchor names (``finding-<id>``, ``playbook-<id>`` …), none of them a section's."""

    def __init__(self) -> None:
        self.used: set[str] = set(SECTION_ANCHORS)

    def make(self, prefix: str, name: Any) -> str:
        base = f"{prefix}-{_ID_UNSAFE.sub('-', str(name)).strip('-') or 'x'}"
        anchor, n = base, 1
        while anchor in self.used:
            n += 1
            anchor = f"{base}-{n}"
        self.used.add(anchor)
        return anchor


class _Tables:
    """Gives each distinct table (label, columns, rows, highlight) one id, in the order it is first met."""

    def __init__(self) -> None:
        self.by_key: dict[str, EvidenceTable] = {}

    def take(self, label: str, table: dict[str, Any]) -> tuple[EvidenceTable, bool]:
        columns = [text_of(c) for c in table.get("columns") or []]
        rows = [[text_of(c) for c in r] if isinstance(r, (list, tuple, str)) else [text_of(r)]
                for r in table.get("rows") or []]
        highlight = [h for h in table.get("highlight") or [] if isinstance(h, int)]
        key = json.dumps([label, columns, rows, highlight], ensure_ascii=False)
        if key in self.by_key:
            return self.by_key[key], False
        made = EvidenceTable(f"E{len(self.by_key) + 1}", label, columns, rows, highlight)
        self.by_key[key] = made
        return made, True


def _evidence(ev: dict[str, Any], tables: _Tables) -> Evidence:
    kind = text_of(ev.get("kind")) or "command"
    label = text_of(ev.get("label") or kind)
    dur = ev.get("duration_s")
    item = Evidence(kind=kind, label=label, command="$ " + argv_text(ev["argv"]) if ev.get("argv") else "",
                    has_exit=kind == "command" or ev.get("exit_code") is not None, exit_code=ev.get("exit_code"),
                    duration_s=dur if isinstance(dur, (int, float)) and dur else None,
                    paths=[text_of(p) for p in ev.get("paths") or []], error=text_of(ev.get("error")),
                    truncated=bool(ev.get("truncated")), stdout=text_of(ev.get("stdout")),
                    stderr=text_of(ev.get("stderr")))
    if isinstance(ev.get("table"), dict):
        item.table, item.table_first = tables.take(label, ev["table"])
    return item


def _field(item: Any, key: str) -> Any:
    """A remedy's field, whether it is a recorded dict or the remedy `check` made."""
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def remedy_items(remedies: list[Any], elsewhere: bool, titles: dict[str, str]) -> list[RemedyItem]:
    """A finding's remedies as the document shows them (``titles``: finding id -> title, for what comes first)."""
    steps = are_steps(remedies)
    out = []
    for i, rem in enumerate(remedies, 1):
        out.append(RemedyItem(label=option_label(i, len(remedies), steps, rem), title=text_of(_field(rem, "title")),
                              flags=remedy_flags(rem, recorded_elsewhere=elsewhere),
                              first=first_line(requires_of(rem), titles) if requires_of(rem) else "",
                              explanation=text_of(_field(rem, "explanation")),
                              commands=[text_of(c) for c in _field(rem, "commands") or []],
                              undo=[text_of(c) for c in _field(rem, "undo") or []],
                              recommended=is_recommended(rem), verification=verification_of(rem).state,
                              requires_root=bool(_field(rem, "requires_root")), missing=missing_tools(rem)))
    return out


def _finding(f: dict[str, Any], anchor: str, explains: list[str], remedies: list[Any], elsewhere: bool,
             titles: dict[str, str], tables: _Tables) -> FindingItem:
    """A finding as recorded (``remedies``: its remedies, as recorded or as `check` made them)."""
    return FindingItem(id=text_of(f.get("id")), status=text_of(f.get("status")),
                       title=text_of(f.get("title") or f.get("id")), detail=text_of(f.get("detail")), anchor=anchor,
                       explains=explains,
                       evidence=[_evidence(e, tables) for e in f.get("evidence") or [] if isinstance(e, dict)],
                       remedies=remedy_items(remedies, elsewhere, titles),
                       options_heading=options_heading(len(remedies), are_steps(remedies)) if remedies else "",
                       recommendation=recommendation(remedies) if remedies else "")


def _symptoms(entries: list[dict[str, Any]]) -> list[SymptomItem]:
    return [SymptomItem(id=text_of(e.get("id")), place=symptom_place(e), text=text_of(e.get("text")),
                        verdict=symptom_verdict(e), explained_by=[text_of(x) for x in e.get("explained_by") or []],
                        answer=answer_line(e) or "", origin=text_of(e.get("origin") or "")) for e in entries]


def _findings(answers: list[dict[str, Any]], rest: list[dict[str, Any]], symptoms: list[SymptomItem],
              elsewhere: bool, anchors: Anchors) -> tuple[list[FindingItem], list[FindingItem], list[EvidenceTable]]:
    tables = _Tables()
    titles = {str(f.get("id")): text_of(f.get("title")) for f in answers + rest}
    made = []
    for f in answers + rest:
        fid = text_of(f.get("id"))
        remedies = [r for r in f.get("remedies") or [] if isinstance(r, dict)]
        made.append(_finding(f, anchors.make("finding", f.get("id")),
                             [s.id for s in symptoms if fid in s.explained_by], remedies, elsewhere, titles, tables))
    return made[:len(answers)], made[len(answers):], list(tables.by_key.values())


def _walk_run(run: WalkView, anchors: Anchors) -> WalkRun:
    anchor = anchors.make("playbook", run.playbook)
    steps = []
    for n, ev in run.numbered():
        if ev.get("type") == "node_enter":
            steps.append(WalkStep(n, False, node=text_of(ev.get("node")), kind=text_of(ev.get("kind")),
                                  title=text_of(ev.get("title")), anchor=anchors.make("step", f"{run.playbook}-{n}")))
        else:
            steps.append(WalkStep(n, True, to=text_of(ev.get("to")), origin=text_of(ev.get("from")),
                                  why=edge_text(ev)))
    diag = run.diagnosis or {}
    path = run.end.get("path") if run.end else None
    reason = text_of(run.end.get("reason")) if run.end else ""
    return WalkRun(playbook=run.playbook, title=run.title,
                   path=[text_of(p) for p in path] if isinstance(path, list) else [], steps=steps,
                   diagnosis=text_of(diag.get("node")),
                   diagnosis_title=text_of(diag.get("title") or (run.end or {}).get("diagnosis")),
                   reason=in_words(reason) if reason else "", open_note=open_walk_note(run),
                   anchor=anchor)


def _applied(ev: dict[str, Any]) -> AppliedFix:
    rem = _dict(ev.get("remedy"))
    sym, word = outcome(ev)
    return AppliedFix(mark=sym, status={MARKS["ok"]: "ok", MARKS["fail"]: "fail"}.get(sym, "skip"),
                      title=text_of(rem.get("title") or "Remedy"), outcome=word,
                      finding_id=text_of(ev.get("finding_id")), when=when(ev.get("ts")),
                      ran=ev.get("type") == "remedy_applied", exit_code=ev.get("exit_code"),
                      env_file=text_of(ev.get("env_file")) if ev.get("type") != "remedy_written" else "",
                      changed=[text_of(p) for p in ev.get("changed") or []], backup=text_of(ev.get("backup")),
                      commands=[text_of(c) for c in rem.get("commands") or []],
                      undo=[text_of(c) for c in rem.get("undo") or []], output=text_of(ev.get("output")))


def _probe_row(ev: dict[str, Any]) -> ProbeRow:
    res = ev["result"]
    dur = res.get("duration_s")
    return ProbeRow(probe=text_of(res.get("probe")), status=text_of(res.get("status")),
                    time=f"{dur:.2f} s" if isinstance(dur, (int, float)) else "",
                    step="/".join(text_of(ev.get(k)) for k in ("playbook", "node") if ev.get(k)),
                    error=text_of(res.get("error")))


def from_session(view: SessionView, events: list[Any] | None = None) -> ReportDoc:
    """The document of a recorded session (``events``: the records it was folded from, for the JSON)."""
    start = view.start
    meta: list[tuple[str, list[tuple[str, bool]]]] = [("Host", [(host_line(view.host), False)]),
                                                       ("Mode", [(text_of(start.get("mode") or "unknown"), False)])]
    if start.get("argv") is not None:
        meta.append(("Command", [(command_line(start.get("argv")), True)]))
    meta.append(("Started", [(when(start.get("started", start.get("ts"))), False)]))
    meta += [("Resumed", [(when(ev.get("resumed", ev.get("ts"))), False)]) for ev in view.resumes]
    if view.end is not None and view.end.get("exit_code") is not None:
        meta.append(("Ended", [(when(view.end.get("ts")) + ", exit code ", False),
                               (text_of(view.end.get("exit_code")), True)]))
    else:
        meta.append(("Ended", [(ended_text(view), False)]))
    meta.append(("zdoctor", [(text_of(start.get("zdoctor_version") or "unknown"), False)]))
    entries = view.symptoms()
    ordered = view.sorted_findings()
    answers, rest = split_answers(ordered, entries)
    symptoms = _symptoms(entries)
    anchors = Anchors()
    done_answers, done_rest, tables = _findings(answers, rest, symptoms, view.recorded_elsewhere, anchors)
    counts = view.counts()
    events = list(view.events if events is None else events)
    data = {
        "format": "zdoctor-session", "version": 1, "session": view.session_id or None,
        "zdoctor_version": start.get("zdoctor_version"), "mode": start.get("mode"), "host": view.host,
        "started": start.get("started", start.get("ts")), "ended": view.end.get("ts") if view.end else None,
        "exit_code": view.end.get("exit_code") if view.end else None, "torn_last_event": view.torn,
        "events": events, "symptoms": entries, "findings": ordered, "summary": counts,
    }
    fleet = FleetPart(fleet_line(view.fleet), fleet_tables(view.fleet)) if view.fleet is not None else None
    return ReportDoc(kind="session", session_id=view.session_id, host=view.host, meta=meta,
                     torn=view.torn, symptoms=symptoms, unexplained=unexplained_headline(entries) or "",
                     counts=counts, answers=done_answers, rest=done_rest,
                     runs=[_walk_run(r, anchors) for r in view.runs],
                     fleet=fleet, applied=[_applied(ev) for ev in view.applied],
                     applied_heading=applied_heading(view.applied), probes=[_probe_row(ev) for ev in view.probes],
                     others=[OtherEvent(text_of(ev.get("seq", "?")), text_of(ev.get("type")), when(ev.get("ts")),
                                        other_body(ev)) for ev in view.others],
                     tables=tables, recorded_elsewhere=view.recorded_elsewhere, data=data)


def _check_run(run: PlaybookRun) -> WalkRun:
    return WalkRun(playbook=run.id, title=run.title, path=list(run.path), diagnosis=run.diagnosis or "",
                   diagnosis_title=run.diagnosis_title, reason=in_words(run.reason) if run.reason else "",
                   healthy=run.healthy, examined=list(run.examined),
                   not_examined=list(run.not_examined), failing_on_path=list(run.failing_on_path))


def from_check(report: CheckReport) -> ReportDoc:
    """The document of a `check` run (as it may be shown: pass the redacted report)."""
    entries = [dict(s) for s in report.symptoms]
    answers, rest = split_answers(report.findings, report.symptoms)
    symptoms = _symptoms(entries)
    elsewhere = report.host.get("kind") == "replay"
    anchors = Anchors()
    titles = {f.id: f.title for f in report.findings}
    tables = _Tables()
    made = []
    for f in answers + rest:
        made.append(_finding(f.to_dict(), anchors.make("finding", f.id),
                             [s.id for s in symptoms if f.id in s.explained_by], list(f.remedies), elsewhere, titles,
                             tables))
    return ReportDoc(kind="check", session_id=report.session or "", host=report.host, meta=[], torn=False,
                     symptoms=symptoms, unexplained=unexplained_headline(report.symptoms) or "",
                     counts=dict(report.summary), answers=made[:len(answers)], rest=made[len(answers):],
                     runs=[_check_run(r) for r in report.playbooks], tables=list(tables.by_key.values()),
                     recorded_elsewhere=elsewhere, incomplete=report.incomplete, layers=list(report.layers),
                     data=report.to_dict())


def summary_texts(counts: dict[str, Any]) -> list[tuple[str, str]]:
    """``(text, status)`` per status, then the total (status ``""``), as the exports' summary line shows them."""
    return summary_parts(counts) + [(total_line(counts), "")]
