"""Walk a playbook: run each node's probes, evaluate its checks and edge predicates, pick the next node.

The TUI drives a :class:`Walk` one node at a time (``evaluate`` then ``advance``/``answer``);
``zdoctor check`` drives it to the end with ``run``. Every step is reported through ``record(type,
data)`` with plain JSON data, so a session log can be replayed and a walk resumed from it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.core.model import Finding, ProbeResult
from zdoctor.core.plural import noun_for
from zdoctor.core.registry import CHECKS, PREDICATES, Facts, load_vocabulary
from zdoctor.core.verdicts import FAILING
from zdoctor.host import Host
from zdoctor.layers import evaluate_check, probe_findings, probes_for
from zdoctor.walk.conditions import holds, probes_of
from zdoctor.walk.events import (
    DiagnosisReached,
    EdgeTaken,
    Event,
    FindingRecorded,
    NodeEnter,
    PlaybookEnd,
    PlaybookStart,
    ProbeRecorded,
    Recorder,
    SessionView,
    StepBack,
    fold,
)
from zdoctor.walk.ledger import unexplained_on
from zdoctor.walk.playbook import END_KINDS, Edge, Node, Playbook


@dataclass
class Candidate:
    """An outgoing edge with what its predicate said; ``value`` is None for edges without one."""

    edge: Edge
    value: bool | None = None
    error: str | None = None

    @property
    def holds(self) -> bool | None:
        """Whether the edge's condition is met (negation applied); None when it has no condition."""
        if self.edge.is_fallback or self.value is None:
            return None
        return self.value != self.edge.negate

    def describe(self) -> str:
        """``predicate X is true`` (or ``finding F is warn or fail is true``), or the error it raised."""
        if self.edge.is_fallback:
            return "fallback"
        what = f"predicate {self.edge.when}" if self.edge.cond is None else self.edge.cond.describe()
        if self.error is not None:
            return f"{what} failed ({self.error}); counted as false"
        return f"{what} is {'true' if self.value else 'false'}"


@dataclass
class NodeOutcome:
    """What one visit of a node found and where it would go next."""

    node: Node
    visit: int
    facts: Facts
    findings: list[Finding]
    chosen: Edge | None
    reason: str
    candidates: list[Candidate]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node.id,
            "visit": self.visit,
            "probes": {name: res.status for name, res in self.facts.items()},
            "findings": [f.to_dict() for f in self.findings],
            "chosen": self.chosen.to if self.chosen else None,
            "reason": self.reason,
            "candidates": [{"to": c.edge.to, "when": c.edge.condition_text, "negate": c.edge.negate,
                            "label": c.edge.label, "value": c.value, "holds": c.holds,
                            "error": c.error} for c in self.candidates],
        }


@dataclass
class WalkResult:
    """How a walk ended; ``stopped`` is None when it reached an end of the playbook."""

    playbook: str
    path: list[str]
    diagnosis: str | None
    reason: str
    stopped: str | None  # None | "no-edge" | "loop" | "user"
    findings: list[Finding] = field(default_factory=list)
    outcomes: list[NodeOutcome] = field(default_factory=list)
    facts: dict[str, ProbeResult] = field(default_factory=dict)
    #: Failing findings met on the way that the end does not name (see :func:`failing_on_path`).
    failing_on_path: list[dict[str, str]] = field(default_factory=list)
    #: The ids of the findings met on the way that the end names (see :func:`named_on_path`).
    named: list[str] = field(default_factory=list)


def failing_on_path(outcomes: Iterable[NodeOutcome], path: list[str], end: Node) -> list[dict[str, str]]:
    """The failing findings (fail or crash) the walk met on its way to ``end`` that the end does not name:
    ``{id, title, status, node}`` each, first seen first. A finding of a check that the end (or a diagnosis
    on the path) lists, that the end's own step found, or that an edge taken tested by id, is named there;
    any other one is named with the end, so a walk never ends past a failing finding without saying so."""
    named = set(named_on_path(outcomes, path, end))
    seen: dict[str, dict[str, str]] = {}
    on_path = set(path)
    for o in (o for o in outcomes if o.node.id in on_path):
        for f in o.findings:
            if f.id in named:
                continue
            if f.status in FAILING:
                seen.setdefault(f.id, {"id": f.id, "title": f.title, "status": f.status, "node": o.node.id})
            else:  # a later visit found it no longer failing
                seen.pop(f.id, None)
    return list(seen.values())


def named_on_path(outcomes: Iterable[NodeOutcome], path: list[str], end: Node) -> list[str]:
    """The ids of the findings the walk met on its way to ``end`` that the end names, first seen first: those
    of the end's own step, of a check the end (or a diagnosis on the path) lists, or that an edge taken on
    the way tested by id."""
    on_path = set(path)
    outcomes = [o for o in outcomes if o.node.id in on_path]
    owners = list(end.checks) + [c for o in outcomes if o.node.kind in END_KINDS for c in o.node.checks]
    owners += [str(getattr(o.chosen.cond, "finding", "")) for o in outcomes
               if o.chosen is not None and o.chosen.cond is not None]
    owners = [c for c in owners if c]
    named: dict[str, None] = {}
    for o in outcomes:
        for f in o.findings:
            if o.node.id == end.id or f.id in owners or any(f.id.startswith(c + ".") for c in owners):
                named.setdefault(f.id)
    return list(named)


def naming(failing: list[dict[str, str]]) -> str:
    """``; also failing on the way: storage.libaio (libaio ...), ...`` (empty when nothing is)."""
    if not failing:
        return ""
    return "; also failing on the way: " + "; ".join(f"{x['id']} ({x['title']}, at step {x['node']})"
                                                     for x in failing)


def _offer(implied: Edge | None, cands: list[Candidate]) -> Edge | None:
    """An implied edge (to the not-checked or the unexplained end) among the candidates shown, once."""
    if implied is not None and not any(c.edge.to == implied.to for c in cands):
        cands.append(Candidate(implied))
    return implied


def _event_pair(event: Any) -> tuple[str, Mapping[str, Any]] | None:
    """Accept ``(type, data)``, ``{"type", "data"}`` or ``{"type", **data}``."""
    if isinstance(event, (tuple, list)) and len(event) == 2 and isinstance(event[1], Mapping):
        return str(event[0]), event[1]
    if isinstance(event, Mapping) and "type" in event:
        data = event.get("data")
        return str(event["type"]), data if isinstance(data, Mapping) else event
    return None


def _started(view: SessionView) -> bool:
    """Whether the recorded events hold a start of the walk (a ``playbook_start``)."""
    return any(ev.get("type") == "playbook_start" for ev in view.events if isinstance(ev, dict))


def probe_names(node: Node) -> list[str]:
    """Every probe a visit of ``node`` runs: its own, those its checks read, those its edge predicates read."""
    load_vocabulary()  # the checks and predicates it names must be registered
    names = list(node.probes) + probes_for(c for c in node.checks if c in CHECKS)
    for e in node.next:
        if e.when is not None and e.when in PREDICATES:
            names += PREDICATES[e.when].probes
        if e.cond is not None:
            names += probes_of(e.cond, CHECKS)
    return list(dict.fromkeys(names))


class Walk:
    """One walk through a playbook on a host."""

    def __init__(self, playbook: Playbook, host: Host, record: Recorder | None = None,
                 max_visits: int = 3) -> None:
        self._setup(playbook, host, record, max_visits)
        self._emit(PlaybookStart(playbook=playbook.id, title=playbook.title, start=playbook.start))
        self._enter(playbook.start)

    def _setup(self, playbook: Playbook, host: Host, record: Recorder | None, max_visits: int) -> None:
        if max_visits < 1:
            raise ValueError("max_visits must be at least 1")

        self.playbook = playbook
        self.host = host
        self.record = record
        self.max_visits = max_visits
        self.path: list[str] = []
        self.current: str = playbook.start
        self.done = False
        self.diagnosis: str | None = None
        self.end_reason: str | None = None
        self.stopped: str | None = None
        self.outcomes: list[NodeOutcome] = []
        self.visits: Counter[str] = Counter()
        self._outcome: NodeOutcome | None = None
        self._seen_results: dict[str, ProbeResult] = {}
        self._arrived_because = ""
        self._lock = threading.RLock()

    # -- recording ---------------------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        if self.record is not None:
            event.record(self.record)

    def _enter(self, nid: str) -> None:
        node = self.playbook.nodes[nid]
        self.current = nid
        self.path.append(nid)
        self.visits[nid] += 1
        self._outcome = None
        self._emit(NodeEnter(playbook=self.playbook.id, node=nid, kind=node.kind, title=node.title))
        if node.kind == "diagnosis":
            self.diagnosis = nid
            self._emit(DiagnosisReached(playbook=self.playbook.id, node=nid, title=node.title))

    def _finish(self, reason: str, stopped: str | None, named: list[str] | None = None) -> None:
        """End the walk; ``named``: the ids of the findings met on the way that its end names."""
        self.done = True
        self.end_reason = reason
        self.stopped = stopped
        self._emit(PlaybookEnd(playbook=self.playbook.id, path=list(self.path), diagnosis=self.diagnosis,
                               reason=reason, named=list(named or [])))

    # -- evaluation --------------------------------------------------------------------------------
    @property
    def node(self) -> Node:
        return self.playbook.nodes[self.current]

    @staticmethod
    def _condition(edge: Edge, facts: Facts) -> tuple[bool, str | None]:
        """Evaluate an edge's condition: a data condition from the checks' (cached) findings, else the
        named predicate."""
        if edge.cond is None:
            return Walk._predicate(str(edge.when), facts)
        try:
            return holds(edge.cond, facts, lambda check: evaluate_check(check, facts)), None
        except Exception as exc:  # noqa: BLE001 - a broken condition must not end the walk
            return False, f"{type(exc).__name__}: {exc}"

    @staticmethod
    def _predicate(name: str, facts: Facts) -> tuple[bool, str | None]:
        spec = PREDICATES.get(name)
        if spec is None:
            return False, f"unknown predicate {name!r}"
        try:
            return bool(spec.func(facts)), None
        except Exception as exc:  # noqa: BLE001 - a broken predicate must not end the walk
            return False, f"{type(exc).__name__}: {exc}"

    def _findings(self, node: Node, facts: Facts) -> list[Finding]:
        out = probe_findings(facts)
        for c in node.checks:
            if c in CHECKS:
                out += evaluate_check(c, facts)
            else:
                out.append(Finding(id=f"{c}.unknown", status="crash", title=f"unknown check {c}",
                                   detail=f"playbook {self.playbook.id} names check {c!r}, "
                                          "which is not registered"))
        return out

    def _choose(self, node: Node, facts: Facts) -> tuple[list[Candidate], Edge | None, str]:
        cands = []
        for e in node.next:
            if e.is_fallback:
                cands.append(Candidate(e))
            else:
                value, error = self._condition(e, facts)
                cands.append(Candidate(e, value, error))
        failed: list[str] = []

        def because(text: str) -> str:
            return "; ".join([text, *failed])

        if node.kind == "question":
            for c in cands:
                if c.holds:
                    return cands, c.edge, because(c.describe())
                if c.error is not None:
                    failed.append(c.describe())
            default = next((e for e in node.next if e.to == node.default), None)
            if default is not None:
                return cands, default, because("question default")
            return cands, None, because(f"question {node.id} has no default answer")
        for c in cands:
            if c.edge.is_fallback:
                return cands, c.edge, because("fallback")
            if c.holds:
                return cands, c.edge, because(c.describe())
            if c.error is not None:
                failed.append(c.describe())
        if not cands:
            return cands, None, f"{node.id} has no next step"
        return cands, None, "no edge applies: " + "; ".join(c.describe() for c in cands)

    def unchecked_probes(self, facts: Facts, findings: list[Finding] | None = None) -> list[str]:
        """``probe (why)`` for every probe the walk's verdict rests on that gave no facts: a probe a step on
        the path declares (``probes = [...]``) that gave none while a check of that step could not judge
        (came out skip or crash), and any probe that crashed or timed out. A probe with nothing to do, or
        one whose step still judged (a fallback rule), does not count."""
        steps = [(o.node, o.facts, o.findings) for o in self.outcomes if o is not self._outcome]
        steps.append((self.node, facts, list(findings or [])))
        seen: dict[str, str] = {}
        for node, step_facts, step_findings in steps:
            undecided = any(f.status in ("skip", "crash") for f in step_findings)
            for name, res in step_facts.items():
                if res.status in ("crash", "timeout") or (res.status != "ok" and undecided and name in node.probes):
                    seen[name] = str(res.error or (res.facts or {}).get("skipped") or res.status)
                elif res.status == "ok":
                    seen.pop(name, None)
        return [f"{name} ({why})" for name, why in seen.items()]

    def _guard_healthy(self, node: Node, facts: Facts, cands: list[Candidate], chosen: Edge | None,
                       reason: str, findings: list[Finding] | None = None) -> tuple[Edge | None, str]:
        """A healthy diagnosis is never reached from missing data: when a probe the walk rests on gave no
        facts, the walk goes to the playbook's ``not_checked`` diagnosis instead, and says which."""
        implied = _offer(self.playbook.not_checked_edge(node), cands)
        if implied is None or chosen is None or not self.playbook.nodes[chosen.to].healthy:
            return chosen, reason
        missing = self.unchecked_probes(facts, findings)
        if not missing:
            return chosen, reason
        return implied, f"not {chosen.to}: no facts from {', '.join(missing)}"

    def _guard_unexplained(self, node: Node, cands: list[Candidate], chosen: Edge | None,
                           reason: str) -> tuple[Edge | None, str]:
        """A healthy diagnosis is never reached while a symptom the user saw is explained by no finding: the
        walk goes to the playbook's ``unexplained`` diagnosis instead, quoting the symptom."""
        implied = _offer(self.playbook.unexplained_edge(node), cands)
        if implied is None or chosen is None or not self.playbook.nodes[chosen.to].open_end:
            return chosen, reason
        open_ones = unexplained_on(self.host)
        if not open_ones:
            return chosen, reason
        quoted = "; ".join(f'{e.symptom.id} "{e.symptom.text}"' for e in open_ones)
        return implied, f"not {chosen.to}: unexplained {noun_for(len(open_ones), 'symptom')} {quoted}"

    def evaluate(self) -> NodeOutcome:
        """Probe, check and choose for the current node (once per visit; later calls reuse it)."""
        load_vocabulary()  # the checks and predicates every edge is judged by (loaded with the first step)
        with self._lock:
            if self.done:
                raise RuntimeError(f"the walk of {self.playbook.id} is finished")
            if self._outcome is not None:
                return self._outcome
            node = self.node
            names = probe_names(node)
            facts = self.host.results(names) if names else Facts({})
            for name, res in facts.items():
                if self._seen_results.get(name) is not res:
                    self._seen_results[name] = res
                    self._emit(ProbeRecorded(result=res.to_dict(), playbook=self.playbook.id, node=node.id))
            findings = self._findings(node, facts)
            for f in findings:
                self._emit(FindingRecorded(finding=f.to_dict(), playbook=self.playbook.id, node=node.id))
            cands, chosen, reason = self._choose(node, facts)
            chosen, reason = self._guard_healthy(node, facts, cands, chosen, reason, findings)
            chosen, reason = self._guard_unexplained(node, cands, chosen, reason)
            self._outcome = NodeOutcome(node=node, visit=self.visits[node.id], facts=facts,
                                        findings=findings, chosen=chosen, reason=reason, candidates=cands)
            self.outcomes.append(self._outcome)
            return self._outcome

    # -- moving ------------------------------------------------------------------------------------
    def advance(self, to: str | None = None) -> None:
        """Follow the chosen edge, or the outgoing edge to ``to`` the user picked; at an end: finish."""
        with self._lock:
            outcome = self.evaluate()
            node = outcome.node
            chosen = outcome.chosen
            if to is None:
                if chosen is None:
                    self._end_here(node, outcome.reason)
                    return
                self._go(chosen, outcome.reason, override=False)
                return
            edges = node.edges_to(to) or [c.edge for c in outcome.candidates if c.edge.to == to]
            if not edges:
                choices = ", ".join(e.to for e in node.next) or "none"
                raise ValueError(f"{to!r} is not a next step of {node.id!r} (choices: {choices})")
            edge = chosen if chosen is not None and chosen.to == to else edges[0]
            if node.kind == "question":
                self._go(edge, f"answer: {edge.label or edge.to}", override=False)
            elif edge is chosen:
                self._go(edge, outcome.reason, override=False)
            else:
                suggested = f" over {chosen.to} ({outcome.reason})" if chosen else f" ({outcome.reason})"
                self._go(edge, f"user chose {to}{suggested}", override=True)

    def answer(self, to: str) -> None:
        """Answer the current question with the answer edge leading to ``to``."""
        if self.node.kind != "question":
            raise ValueError(f"{self.current!r} is a {self.node.kind} node, not a question")
        self.advance(to)

    def _go(self, edge: Edge, reason: str, override: bool) -> None:
        seen = self.visits[edge.to]
        if seen >= self.max_visits:
            self._finish(f"stopped: {edge.to} would be visited {seen + 1} times (limit {self.max_visits}); "
                         f"the walk keeps going round the loop {edge.source} -> {edge.to}", "loop")
            return
        self._arrived_because = reason
        self._emit(EdgeTaken(playbook=self.playbook.id, source=edge.source, to=edge.to, predicate=edge.when,
                             negate=edge.negate, reason=reason, override=override,
                             condition=edge.cond.to_dict() if edge.cond is not None else None))
        self._enter(edge.to)

    def _end_here(self, node: Node, reason: str) -> None:
        if node.kind in END_KINDS:
            why = self._arrived_because
            said = f" ({why})" if node.id == self.playbook.unexplained and why else ""
            self._finish(f"reached {node.kind} {node.id}: {node.title}{said}"
                         + naming(failing_on_path(self.outcomes, self.path, node)), None,
                         named_on_path(self.outcomes, self.path, node))
        elif node.is_terminal:
            self._finish(f"ended at {node.kind} node {node.id}, which has no next step", "no-edge")
        else:
            self._finish(f"stuck at {node.id}: {reason}", "no-edge")

    def back(self) -> str:
        """Return to the previous step of the path (a finished walk is open again); returns its id.

        Recorded as a ``step_back`` event, so a resumed session stands where the user went back to."""
        with self._lock:
            if len(self.path) < 2:
                raise ValueError(f"{self.current!r} is the first step of {self.playbook.id}: there is no previous one")
            left = self.path.pop()
            self.visits[left] -= 1
            self.current = self.path[-1]
            self.diagnosis = next((n for n in reversed(self.path) if self.playbook.nodes[n].kind == "diagnosis"), None)
            self.done, self.end_reason, self.stopped = False, None, None
            self._outcome = None
            self._emit(StepBack(playbook=self.playbook.id, source=left, to=self.current,
                                reason="the user went back to the previous step"))
            return self.current

    def stop(self, reason: str = "stopped by the user") -> None:
        """End the walk where it stands."""
        with self._lock:
            if not self.done:
                self._finish(reason, "user")

    def step(self) -> NodeOutcome:
        """Evaluate the current node and follow its chosen edge."""
        outcome = self.evaluate()
        self.advance()
        return outcome

    def run(self) -> WalkResult:
        """Walk to the end without asking anybody (questions take predicates, else their default)."""
        while not self.done:
            self.step()
        return self.result()

    def result(self) -> WalkResult:
        """The walk so far: path, diagnosis, every finding (the latest per id) and every fact."""
        findings: dict[str, Finding] = {}
        for outcome in self.outcomes:
            for f in outcome.findings:
                findings[f.id] = f
        end = self.playbook.nodes.get(self.path[-1]) if self.done and self.stopped is None and self.path else None
        return WalkResult(playbook=self.playbook.id, path=list(self.path), diagnosis=self.diagnosis,
                          reason=self.end_reason or "", stopped=self.stopped,
                          findings=list(findings.values()), outcomes=list(self.outcomes),
                          facts=dict(self._seen_results),
                          failing_on_path=failing_on_path(self.outcomes, self.path, end) if end else [],
                          named=named_on_path(self.outcomes, self.path, end) if end else [])

    # -- resuming ----------------------------------------------------------------------------------
    @classmethod
    def resume(cls, playbook: Playbook, host: Host, events: Iterable[Any], record: Recorder | None = None,
               max_visits: int = 3) -> Walk:
        """Rebuild the position (path, current node, diagnosis, done) from recorded events.

        Events are ``(type, data)`` pairs or dicts with ``type`` (and ``data`` or the fields inline);
        only those of this playbook's latest start count. Probes run again on the new host.
        """
        walk = cls.__new__(cls)
        walk._setup(playbook, host, record, max_visits)
        pairs = (_event_pair(e) for e in events)
        view = fold([{**data, "type": kind} for kind, data in (p for p in pairs if p is not None)
                     if data.get("playbook") == playbook.id])
        recorded = view.walk_of(playbook.id)
        if recorded is None or not _started(view):
            raise InputError(f"no recorded walk of playbook {playbook.id} to resume")
        path = recorded.nodes
        for nid in path:
            if nid not in playbook.nodes:
                raise InputError(f"recorded node {nid!r} is not in playbook {playbook.id} "
                                 "(was the playbook changed since?)")
        diagnosis = recorded.diagnosis_node
        end = (str(recorded.end.get("reason") or "ended")) if recorded.end is not None else None
        if not path:
            walk._enter(playbook.start)
        else:
            walk.path = path
            walk.current = path[-1]
            walk.visits = Counter(path)
        walk.diagnosis = diagnosis
        if end is not None:
            walk.done = True
            walk.end_reason = end
        return walk
