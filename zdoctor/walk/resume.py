"""Resume a guided session from its log: where the walk stopped, with the evidence gathered so far.

A session log (:mod:`zdoctor.walk.session`) holds every node entered and every probe result. A
:class:`ResumePoint` reads that back; :class:`SessionHost` answers probes from the recorded results
(falling back to the real host for probes not run yet); :func:`resume_walk` rebuilds the
:class:`~zdoctor.walk.engine.Walk` at the node where it stopped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.model import ProbeResult
from zdoctor.host import Host, LiveHost, ReplayHost
from zdoctor.proc.target import Target
from zdoctor.walk.events import Recorder, fold
from zdoctor.walk.session import SUFFIX, load_events, sessions_dir

#: Session modes a guided walk can be resumed from.
GUIDED_MODES = ("tui", "demo")



@dataclass
class ResumePoint:
    """Where a recorded guided session stands."""

    session_id: str
    path: Path
    mode: str | None
    host_info: dict[str, Any]
    started: float | None
    playbook: str | None = None
    nodes: list[str] = field(default_factory=list)
    diagnosis: str | None = None
    walk_ended: bool = False
    closed: bool = False
    torn: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def node(self) -> str | None:
        """The node the walk stopped at."""
        return self.nodes[-1] if self.nodes else None

    @property
    def resumable(self) -> bool:
        return self.mode in GUIDED_MODES and self.playbook is not None

    def describe(self) -> str:
        """One line for a list: host, playbook, where it stopped."""
        host = self.host_info.get("hostname") or "?"
        if self.host_info.get("scenario"):
            host = f"practice {self.host_info['scenario']}"
        where = f"{self.playbook} at {self.node}" if self.playbook else "no walk started"
        state = "walk finished" if self.walk_ended else ("interrupted" if not self.closed else "left")
        return f"{host}: {where} ({len(self.nodes)} steps, {state})"


def read_point(session: str | os.PathLike[str], state_dir: Path | None = None) -> ResumePoint:
    """Read a session (an id, or a :class:`~pathlib.Path` to its log) into a :class:`ResumePoint`."""
    events = load_events(session, state_dir)
    view = fold(events)
    path = Path(events.path) if events.path is not None else Path(str(session))
    point = ResumePoint(session_id=path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name,
                        path=path, mode=view.mode, host_info=view.host,
                        started=view.start.get("started", view.start.get("ts")), torn=events.torn,
                        events=list(events), closed=view.closed)
    walk = view.last_walk()
    if walk is not None and walk.playbook:
        point.playbook = walk.playbook
        point.nodes = walk.nodes
        point.diagnosis = walk.diagnosis_node
        point.walk_ended = walk.ended
    return point


def resumable_sessions(state_dir: Path | None = None, limit: int = 5, scan: int = 25) -> list[ResumePoint]:
    """The newest guided sessions with a walk in them (at most ``limit``; only the newest ``scan`` logs
    are read). Unreadable logs are left out."""
    folder = sessions_dir(state_dir)
    try:
        files = sorted((p for p in folder.iterdir() if p.name.endswith(SUFFIX)), key=lambda p: p.name,
                       reverse=True)[:scan]
    except OSError:
        return []
    out: list[ResumePoint] = []
    for p in files:
        try:
            point = read_point(p)
        except InputError:
            continue
        if point.resumable:
            out.append(point)
        if len(out) >= limit:
            break
    return out


def latest_point(state_dir: Path | None = None) -> ResumePoint:
    """The newest resumable session; none is an :class:`InputError`."""
    found = resumable_sessions(state_dir, limit=1)
    if not found:
        raise InputError(f"no guided session to resume in {sessions_dir(state_dir)}")
    return found[0]


def find_point(session: str | None = None, state_dir: Path | None = None) -> ResumePoint:
    """The session ``session`` (an id), or the newest resumable one; one without a walk is refused."""
    if session is None:
        return latest_point(state_dir)
    point = read_point(session, state_dir)
    if not point.resumable:
        raise InputError(f"session {point.session_id} has no guided walk to resume "
                         f"(mode {point.mode or 'unknown'})")
    return point


def recorded_results(events: Iterable[Mapping[str, Any]]) -> dict[str, ProbeResult]:
    """The latest recorded result of each probe in ``events``."""
    return fold(list(events)).results()


class SessionHost(Host):
    """Answers probes from a session's recorded results; probes not recorded go to ``base``.

    :meth:`forget` drops recorded results too, so a re-check probes the real host again.
    """

    def __init__(self, base: Host, recorded: Mapping[str, ProbeResult]) -> None:
        super().__init__()
        self.base = base
        self.kind = base.kind
        self._recorded = dict(recorded)
        self.info = dict(base.info)
        target = getattr(base, "target", None)
        if target is not None:
            self.target: Target = target

    def _compute(self, name: str) -> ProbeResult:
        rec = self._recorded.get(name)
        return rec if rec is not None else self.base.result(name)

    def forget(self, names: Iterable[str]) -> None:
        names = list(names)
        for n in names:
            self._recorded.pop(n, None)
            self._results.pop(n, None)
        self.base.forget(names)


def rebuild_host(info: Mapping[str, Any]) -> Host:
    """The host a session ran against, from its recorded host info: the same snapshot or practice
    scenario for a replay, else this machine with the recorded interpreter, command and options."""
    if info.get("scenario"):
        from zdoctor.walk.practice import get_scenario

        return get_scenario(str(info["scenario"])).host()
    if info.get("kind") == "replay":
        source = info.get("source")
        if not isinstance(source, str) or not source:
            raise InputError("the session replayed a snapshot but did not record which file")
        return ReplayHost.load(source)
    return LiveHost(target=Target.from_info(info))


def resume_walk(point: ResumePoint, host: Host, record: Recorder | None = None):
    """The walk of ``point``'s playbook, back at the node where it stopped (see :meth:`Walk.resume`)."""
    from zdoctor.walk.engine import Walk
    from zdoctor.walk.playbook import load_all

    books = load_all()
    if point.playbook not in books:
        raise InputError(f"session {point.session_id} walked playbook {point.playbook!r}, which is not installed")
    return Walk.resume(books[point.playbook], host, point.events, record=record)
