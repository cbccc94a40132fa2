"""The session record: one frozen dataclass per event kind, the :class:`Recorder` protocol, and the fold of a
session's events into a :class:`SessionView` that the exports, resume and the walk all read.

Events are written by :class:`zdoctor.walk.session.SessionLog` as JSON lines ``{"seq", "ts", "type", ...data}``;
each class here names one ``type`` and its data fields. :meth:`Event.to_dict` gives the data (what
``SessionLog.record`` takes); :func:`parse` reads a line back (tolerantly: a field of the wrong type becomes
its default, so logs written by earlier releases still read). A kind this module does not know is kept as
:class:`Unknown`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Mapping, Protocol

from zdoctor.core.answers import WalkEnd, with_answers
from zdoctor.core.model import ProbeResult
from zdoctor.core.symptom import EXPLAINING
from zdoctor.core.verdicts import answer_first, count
from zdoctor.symptoms.view import ledger_entries

#: Keys of the envelope every recorded event carries.
ENVELOPE = ("seq", "ts", "type")


class Recorder(Protocol):
    """Where events go: ``record(type, data)`` (a :class:`~zdoctor.walk.session.SessionLog`'s ``record``, or any
    callable with that shape)."""

    def __call__(self, type_: str, data: dict[str, Any], /) -> None:  # pragma: no cover - a protocol
        ...


def no_record(_type: str, _data: dict[str, Any]) -> None:
    """A :class:`Recorder` that keeps nothing."""
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


@dataclass(frozen=True)
class Event:
    """One recorded event; ``seq`` and ``ts`` are the log's envelope (0 before it is written)."""

    TYPE: ClassVar[str] = ""
    seq: int = field(default=0, compare=False)
    ts: float = field(default=0.0, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The event's data, as :meth:`SessionLog.record` takes it (no envelope)."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name in ("seq", "ts"):
                continue
            out[f.metadata.get("key", f.name)] = getattr(self, f.name)
        return out

    def record(self, recorder: Recorder) -> None:
        recorder(self.TYPE, self.to_dict())

    @classmethod
    def from_dict(cls, ev: Mapping[str, Any]) -> Event:
        """Read a recorded event (envelope and data); odd field values fall back to their defaults."""
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = f.metadata.get("key", f.name)
            if key not in ev:
                continue
            value = ev[key]
            kind = f.metadata.get("kind")
            if kind is not None and not isinstance(value, kind):
                continue
            kwargs[f.name] = value
        if not isinstance(kwargs.get("seq", 0), int) or isinstance(kwargs.get("seq"), bool):
            kwargs.pop("seq")
        if not isinstance(kwargs.get("ts", 0.0), (int, float)) or isinstance(kwargs.get("ts"), bool):
            kwargs.pop("ts")
        return cls(**kwargs)


def _f(default: Any = None, kind: Any = None, key: str | None = None, factory: Any = None) -> Any:
    meta: dict[str, Any] = {}
    if kind is not None:
        meta["kind"] = kind
    if key is not None:
        meta["key"] = key
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SessionStart(Event):
    TYPE: ClassVar[str] = "session_start"
    session_id: str = _f("", str)
    zdoctor_version: str | None = _f(None, str)
    mode: str | None = _f(None, str)
    argv: list | None = _f(None, list)
    host: dict = _f(kind=dict, factory=dict)
    started: float | None = _f(None, (int, float))


@dataclass(frozen=True)
class SessionResume(Event):
    TYPE: ClassVar[str] = "session_resume"
    session_id: str = _f("", str)
    zdoctor_version: str | None = _f(None, str)
    resumed: float | None = _f(None, (int, float))
    dropped_torn_bytes: int = _f(0, int)
    argv: list | None = _f(None, list)


@dataclass(frozen=True)
class SessionEnd(Event):
    TYPE: ClassVar[str] = "session_end"
    exit_code: int | None = _f(None, int)


@dataclass(frozen=True)
class _OfWalk(Event):
    """An event of a walk through ``playbook``."""

    playbook: str = _f("", str)


@dataclass(frozen=True)
class _AtNode(_OfWalk):
    """An event at one node of the walk."""

    node: str = _f("", str)


@dataclass(frozen=True)
class _Move(_OfWalk):
    """The walk moved from the step ``source`` to the step ``to``."""

    source: str = _f("", str, key="from")
    to: str = _f("", str)


@dataclass(frozen=True)
class PlaybookStart(_OfWalk):
    TYPE: ClassVar[str] = "playbook_start"
    title: str = _f("", str)
    start: str = _f("", str)


@dataclass(frozen=True)
class NodeEnter(_AtNode):
    TYPE: ClassVar[str] = "node_enter"
    kind: str = _f("", str)
    title: str = _f("", str)


@dataclass(frozen=True)
class EdgeTaken(_Move):
    TYPE: ClassVar[str] = "edge"
    predicate: str | None = _f(None, str)
    negate: bool = _f(False, bool)
    reason: str = _f("", str)
    override: Any = _f(False)
    condition: dict | None = _f(None, dict)  # a data condition (zdoctor.walk.conditions), when the edge has one

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if out.get("condition") is None:
            out.pop("condition", None)
        return out


@dataclass(frozen=True)
class StepBack(_Move):
    """The user went back from ``source`` to the previous step ``to``."""

    TYPE: ClassVar[str] = "step_back"
    reason: str = _f("", str)


@dataclass(frozen=True)
class DiagnosisReached(_AtNode):
    TYPE: ClassVar[str] = "diagnosis"
    title: str = _f("", str)


@dataclass(frozen=True)
class PlaybookEnd(_OfWalk):
    TYPE: ClassVar[str] = "playbook_end"
    path: list = _f(kind=list, factory=list)
    diagnosis: str | None = _f(None, str)
    reason: str = _f("", str)
    #: The ids of the findings met on the way that the end names (recorded only when there are some).
    named: list = _f(kind=list, factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if not self.named:
            out.pop("named", None)
        return out


@dataclass(frozen=True)
class _AtStep(Event):
    """An event that carries one payload (``PAYLOAD``), recorded at a walk's step or outside any walk."""

    PAYLOAD: ClassVar[str] = ""
    playbook: str | None = _f(None, str)
    node: str | None = _f(None, str)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {self.PAYLOAD: getattr(self, self.PAYLOAD)}
        if self.playbook is not None:
            out["playbook"] = self.playbook
        if self.node is not None or self.playbook is not None:
            out["node"] = self.node
        return out


@dataclass(frozen=True)
class ProbeRecorded(_AtStep):
    """A probe's result; each one (probe, started) is written once per session (the log sees to it)."""

    TYPE: ClassVar[str] = "probe_result"
    PAYLOAD: ClassVar[str] = "result"
    result: dict = _f(kind=dict, factory=dict)

    @property
    def key(self) -> tuple:
        """What makes a result the same one: its probe and when it started."""
        return (self.result.get("probe"), self.result.get("started"))


@dataclass(frozen=True)
class FindingRecorded(_AtStep):
    """A finding, as a check (at a walk's step, or in the check of every probe) produced it."""

    TYPE: ClassVar[str] = "finding"
    PAYLOAD: ClassVar[str] = "finding"
    finding: dict = _f(kind=dict, factory=dict)


@dataclass(frozen=True)
class SummaryRecorded(Event):
    TYPE: ClassVar[str] = "summary"
    counts: dict = _f(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.counts)

    @classmethod
    def from_dict(cls, ev: Mapping[str, Any]) -> Event:
        return cls(seq=ev.get("seq", 0), ts=ev.get("ts", 0.0),
                   counts={k: v for k, v in ev.items() if k not in ENVELOPE})


#: What a person did with a remedy: ran it, said no, practised it, copied its commands, or had its
#: ``export``/``unset`` lines written to a file to source (all a remedy of only such lines can be given).
REMEDY_KINDS = {"applied": "remedy_applied", "declined": "remedy_declined", "practised": "remedy_practised",
                "copied": "remedy_copied", "written": "remedy_written"}


@dataclass(frozen=True)
class RemedyOutcome(Event):
    """A remedy applied (with its outcome), declined (with how), practised, copied, or written to a file to
    source (``env_file``)."""

    TYPE: ClassVar[str] = "remedy"
    type: str = _f("remedy_applied", str)
    playbook: str | None = _f(None, str)
    node: str | None = _f(None, str)
    finding_id: str | None = _f(None, str)
    remedy: dict = _f(kind=dict, factory=dict)
    details: dict = _f(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"playbook": self.playbook, "node": self.node, "finding_id": self.finding_id,
                "remedy": self.remedy, **self.details}

    def record(self, recorder: Recorder) -> None:
        recorder(self.type, self.to_dict())

    @classmethod
    def from_dict(cls, ev: Mapping[str, Any]) -> Event:
        known = {"playbook", "node", "finding_id", "remedy", *ENVELOPE}
        return cls(seq=ev.get("seq", 0) if isinstance(ev.get("seq"), int) else 0,
                   ts=ev.get("ts", 0.0) if isinstance(ev.get("ts"), (int, float)) else 0.0,
                   type=str(ev.get("type")), playbook=_str(ev.get("playbook")), node=_str(ev.get("node")),
                   finding_id=_str(ev.get("finding_id")), remedy=_dict(ev.get("remedy")),
                   details={k: v for k, v in ev.items() if k not in known})

    @property
    def outcome(self) -> str:
        """``applied``, ``declined``, ``practised``, ``copied`` or ``written``."""
        return next((k for k, v in REMEDY_KINDS.items() if v == self.type), self.type)


@dataclass(frozen=True)
class ExportWritten(Event):
    TYPE: ClassVar[str] = "export"
    format: str = _f("", str)
    path: str = _f("", str)


@dataclass(frozen=True)
class FleetStart(Event):
    """A fleet run began: how the nodes are reached, which ones, and the options of the run."""

    TYPE: ClassVar[str] = "fleet_start"
    launcher: str = _f("", str)
    source: str = _f("", str)
    hosts: list = _f(kind=list, factory=list)
    slots: dict = _f(kind=dict, factory=dict)
    remote: list = _f(kind=list, factory=list)
    timeout: float | None = _f(None, (int, float))
    parallel: int | None = _f(None, int)


@dataclass(frozen=True)
class FleetNode(Event):
    """One node's answer (its snapshot, or why there is none), as it arrived."""

    TYPE: ClassVar[str] = "fleet_node"
    node: dict = _f(kind=dict, factory=dict)


@dataclass(frozen=True)
class FleetResult(Event):
    """The evaluated fleet report."""

    TYPE: ClassVar[str] = "fleet_result"
    report: dict = _f(kind=dict, factory=dict)


@dataclass(frozen=True)
class Unknown(Event):
    """An event of a kind this release does not know (kept whole)."""

    TYPE: ClassVar[str] = "?"
    type: str = "?"
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)

    def record(self, recorder: Recorder) -> None:
        recorder(self.type, self.to_dict())


KINDS: dict[str, type[Event]] = {c.TYPE: c for c in (
    SessionStart, SessionResume, SessionEnd, PlaybookStart, NodeEnter, EdgeTaken, StepBack, DiagnosisReached,
    PlaybookEnd,
    ProbeRecorded, FindingRecorded, SummaryRecorded, ExportWritten, FleetStart, FleetNode, FleetResult)}
KINDS.update({t: RemedyOutcome for t in REMEDY_KINDS.values()})


def parse(ev: Any) -> Event:
    """The typed event for one recorded line (a dict with ``type``); anything else is :class:`Unknown`."""
    if not isinstance(ev, Mapping):
        return Unknown(type="?", data={"value": ev})
    kind, seq, ts = ev.get("type"), ev.get("seq"), ev.get("ts")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return Unknown(seq=seq if isinstance(seq, int) else 0, ts=ts if isinstance(ts, (int, float)) else 0.0,
                       type=str(ev.get("type", "?")),
                       data={k: v for k, v in ev.items() if k not in ENVELOPE})
    return cls.from_dict(ev)


def record_remedy(recorder: Recorder, outcome: str, playbook: str | None, node: str | None,
                  finding_id: str | None, remedy: Any, **details: Any) -> None:
    """Record what a person did with a remedy: ``applied`` (``details``: the run's outcome), ``declined``
    (``how``), ``practised``, ``copied``, or ``written`` (its lines only change a shell: ``details`` name
    the ``env_file`` to source)."""
    if outcome not in REMEDY_KINDS:
        raise ValueError(f"unknown remedy outcome {outcome!r}")
    data = remedy.to_dict() if hasattr(remedy, "to_dict") else dict(remedy)
    RemedyOutcome(type=REMEDY_KINDS[outcome], playbook=playbook, node=node, finding_id=finding_id, remedy=data,
                  details=details).record(recorder)


# --- the fold ---------------------------------------------------------------------------------------

@dataclass
class WalkView:
    """One walk through a playbook as recorded: nodes entered and edges taken, in order, and how it ended."""

    playbook: str
    title: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)  # node_enter and edge events, as recorded
    diagnosis: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    #: Each finding recorded at a step of this walk: id -> its latest status.
    statuses: dict[str, str] = field(default_factory=dict)

    def numbered(self) -> list[tuple[int, dict[str, Any]]]:
        """The steps with the number of the node they belong to (an edge carries the number of the node it
        leaves; 0 before the first node)."""
        out, n = [], 0
        for ev in self.steps:
            n += ev.get("type") == "node_enter"
            out.append((n, ev))
        return out

    @property
    def nodes(self) -> list[str]:
        """The path: the nodes entered, in order, less those the user stepped back from."""
        path: list[str] = []
        for s in self.steps:
            if s.get("type") == "node_enter" and isinstance(s.get("node"), str):
                path.append(s["node"])
            elif s.get("type") == "step_back" and len(path) > 1:
                path.pop()
        return path

    @property
    def diagnosis_node(self) -> str | None:
        node = (self.diagnosis or {}).get("node")
        return node if isinstance(node, str) else None

    @property
    def ended(self) -> bool:
        return self.end is not None

    def walk_end(self) -> WalkEnd:
        """How the walk ended, for :func:`zdoctor.core.answers.answering_walk`."""
        met = tuple(fid for fid, status in self.statuses.items() if status in EXPLAINING)
        named = (self.end or {}).get("named")
        return WalkEnd(self.playbook, self.title, self.diagnosis_node, str((self.diagnosis or {}).get("title") or ""),
                       met, tuple(str(x) for x in named if str(x) in met) if isinstance(named, list) else ())


@dataclass
class SessionView:
    """What a session's events say, folded once: the start, resumes and end, each walk (a playbook started
    again begins a new walk), the latest version of each finding, every probe result, what was done with
    remedies, the summary, a fleet's report, and whatever else was recorded."""

    session_id: str = ""
    start: dict[str, Any] = field(default_factory=dict)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    closed: bool = False  # the last word was a session_end (a resume reopens it)
    walks: list[WalkView] = field(default_factory=list)
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> latest "finding" event
    probes: list[dict[str, Any]] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)  # remedy_* events
    summary: dict[str, Any] | None = None
    others: list[dict[str, Any]] = field(default_factory=list)
    fleet: dict[str, Any] | None = None
    fleet_nodes: int = 0
    torn: bool = False
    events: list[Any] = field(default_factory=list)
    live: bool = False  # read from inside the session while it runs (an export made in the guide)

    @property
    def recorded_elsewhere(self) -> bool:
        """The evidence came from another node (a replay or a practice scenario), not this machine."""
        return self.host.get("kind") == "replay" or self.start.get("mode") == "demo"

    def symptoms(self) -> list[dict[str, Any]]:
        """The symptom ledger: each recorded symptom with the findings that explain it and the recorded walk
        that answers it (:func:`zdoctor.core.answers.with_answers`)."""
        entries = ledger_entries(self.probes, [ev["finding"] for ev in self.findings.values()])
        return with_answers(entries, [w.walk_end() for w in self.walks]) if entries else []

    def sorted_findings(self) -> list[dict[str, Any]]:
        """The latest version of each finding: those that answer a symptom first, then worst first, then by
        id (:func:`zdoctor.core.verdicts.answer_first`)."""

        return answer_first((ev["finding"] for ev in self.findings.values()), self.symptoms())

    def counts(self) -> dict[str, Any]:
        """The last recorded summary, or one counted from the latest findings when none is current."""

        if self.summary is not None:
            return {k: v for k, v in self.summary.items() if k not in ENVELOPE}
        return dict(count(f["finding"].get("status") for f in self.findings.values()))

    @property
    def runs(self) -> list[WalkView]:
        """The walks, in the order they started."""
        return self.walks

    @property
    def host(self) -> dict[str, Any]:
        host = self.start.get("host")
        return host if isinstance(host, dict) else {}

    @property
    def mode(self) -> str | None:
        mode = self.start.get("mode")
        return mode if isinstance(mode, str) else None

    def last_walk(self) -> WalkView | None:
        """The walk started last."""
        return self.walks[-1] if self.walks else None

    def walk_of(self, playbook: str) -> WalkView | None:
        """The latest walk of ``playbook``."""
        return next((w for w in reversed(self.walks) if w.playbook == playbook), None)

    def results(self) -> dict[str, ProbeResult]:
        """The latest recorded result of each probe."""
        out: dict[str, ProbeResult] = {}
        for ev in self.probes:
            res = ev.get("result")
            if isinstance(res, dict) and isinstance(res.get("probe"), str):
                try:
                    out[res["probe"]] = ProbeResult.from_dict(res)
                except (KeyError, TypeError, ValueError):
                    continue
        return out


def fold(events: Iterable[Any]) -> SessionView:
    """Fold a session's events (as :func:`zdoctor.walk.session.load_events` reads them) into a :class:`SessionView`."""
    events = events if isinstance(events, list) else list(events)
    view = SessionView(torn=bool(getattr(events, "torn", False)), events=events)
    current: dict[str, WalkView] = {}

    def walk_for(ev: Mapping[str, Any]) -> WalkView:
        name = ev.get("playbook")
        name = "" if name is None else str(name)
        if name not in current:
            current[name] = WalkView(playbook=name)
            view.walks.append(current[name])
        return current[name]

    for ev in events:
        if not isinstance(ev, dict):
            view.others.append({"type": "?", "value": ev})
            continue
        kind = ev.get("type")
        if kind == "session_start":
            view.start = ev
            view.session_id = "" if ev.get("session_id") is None else str(ev.get("session_id"))
            view.closed = False
        elif kind == "session_resume":
            view.resumes.append(ev)
            view.closed = False
        elif kind == "session_end":
            view.end = ev
            view.closed = True
        elif kind == "playbook_start":
            w = WalkView(playbook="" if ev.get("playbook") is None else str(ev.get("playbook")),
                         title="" if ev.get("title") is None else str(ev.get("title")))
            current[w.playbook] = w
            view.walks.append(w)
        elif kind in ("node_enter", "edge"):
            walk_for(ev).steps.append(ev)
        elif kind == "step_back":
            w = walk_for(ev)
            w.steps.append(ev)
            w.end = None  # a finished walk is open again
            if w.diagnosis is not None and w.diagnosis.get("node") not in w.nodes:
                w.diagnosis = None
        elif kind == "diagnosis":
            walk_for(ev).diagnosis = ev
        elif kind == "playbook_end":
            walk_for(ev).end = ev
        elif kind == "probe_result" and isinstance(ev.get("result"), dict):
            view.probes.append(ev)
        elif kind == "finding" and isinstance(ev.get("finding"), dict) and "id" in ev["finding"]:
            fid = str(ev["finding"]["id"])
            view.findings.pop(fid, None)
            view.findings[fid] = ev
            if isinstance(ev.get("playbook"), str) and ev["playbook"] in current:
                current[ev["playbook"]].statuses[fid] = str(ev["finding"].get("status"))
            view.summary = None  # a finding recorded after the summary (a re-check) makes it stale
        elif kind in REMEDY_KINDS.values():
            view.applied.append(ev)
        elif kind == "summary":
            view.summary = ev
        elif kind == "fleet_result" and isinstance(ev.get("report"), dict):
            view.fleet = ev["report"]
        elif kind in ("fleet_start", "fleet_node"):
            view.fleet_nodes += kind == "fleet_node"  # kept whole in the JSON export
        else:
            view.others.append(ev)
    return view
