"""The playbook linter: on top of the loader's structural problems (:mod:`zdoctor.walk.playbook`), the
vocabulary a playbook uses (probes, checks, predicates, finding ids, facts) and the shape of its graph
(reachability, endings, traps, unmarked cycles). ``lint_playbook`` never raises for a bad file."""

from __future__ import annotations

import difflib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zdoctor.core import registry
from zdoctor.core.registry import CHECKS, owner_check
from zdoctor.walk.conditions import Condition, FactCondition
from zdoctor.walk.playbook import END_KINDS, KINDS, LintError, Playbook, parse_file, reference_errors


@dataclass
class Vocabulary:
    """The names a playbook may use; defaults to zdoctor.core.registry after load_vocabulary()."""

    probes: Iterable[str]
    checks: Iterable[str]
    predicates: Iterable[str]

    @classmethod
    def from_registry(cls) -> Vocabulary:

        registry.load_vocabulary()
        return cls(registry.PROBES, registry.CHECKS, registry.PREDICATES)


def _unknown(file: str, node: str, what: str, name: str, known: set[str], prefix: str = "") -> LintError:
    hint = difflib.get_close_matches(name, sorted(known), n=1)
    extra = f" (did you mean {hint[0]!r}?)" if hint else ""
    return LintError(file, node, f"{prefix}unknown {what} {name!r}{extra}")


def _vocabulary_errors(pb: Playbook, vocab: Vocabulary) -> list[LintError]:
    file = str(pb.path)
    probes, checks, preds = set(vocab.probes), set(vocab.checks), set(vocab.predicates)
    out = []
    for node in pb.nodes.values():
        out += [_unknown(file, node.id, "probe", p, probes) for p in node.probes if p not in probes]
        out += [_unknown(file, node.id, "check", c, checks) for c in node.checks if c not in checks]
        out += [_unknown(file, node.id, "predicate", e.when, preds, prefix=f"edge to {e.to!r}: ")
                for e in node.next if e.when is not None and e.when not in preds]
        out += [LintError(file, node.id, f"edge to {e.to!r}: {problem}")
                for e in node.next if e.cond is not None for problem in _condition_problems(e.cond, vocab)]
    return out


def _condition_problems(cond: Condition, vocab: Vocabulary) -> list[str]:
    """Why a data condition cannot hold: a finding id no registered check produces, or an unknown probe."""
    if isinstance(cond, FactCondition):
        probes = set(vocab.probes)
        if cond.probe in probes:
            return []
        hint = difflib.get_close_matches(cond.probe, sorted(probes), n=1)
        return [f"unknown probe {cond.probe!r} in fact {cond.fact!r}"
                + (f" (did you mean {hint[0]!r}?)" if hint else "")]
    checks = vocab.checks if isinstance(vocab.checks, Mapping) else {c: None for c in vocab.checks}
    owner = owner_check(cond.finding, checks)
    if owner is None:
        return [f"no registered check produces finding {cond.finding!r}"]
    if not finding_id_known(cond.finding, owner, checks):
        return [f"check {owner!r} never produces a finding {cond.finding!r} (a typo?)"]
    return []


def finding_id_known(fid: str, owner: str, checks: Mapping[str, Any]) -> bool:
    """Whether check ``owner`` declares finding id ``fid`` (or a family or a dotted prefix of ids it makes)."""

    spec = checks.get(owner) or CHECKS.get(owner)
    produces = getattr(spec, "produces", None)
    return fid == owner or (callable(produces) and bool(produces(fid)))


def end_nodes(pb: Playbook) -> set[str]:
    """Nodes where a walk may stop: no outgoing edge, or (not a question) no fallback edge.

    Edges to undefined nodes are left out (they are reported on their own).
    """
    out = set()
    for n in pb.nodes.values():
        edges = [e for e in n.next if e.to in pb.nodes]
        if not edges or (n.kind != "question" and not any(e.is_fallback for e in edges)):
            out.add(n.id)
    return out


def _path_to(parents: dict[str, str | None], nid: str) -> str:
    chain = [nid]
    while parents[chain[-1]] is not None:
        chain.append(parents[chain[-1]])  # type: ignore[arg-type]
    return " -> ".join(reversed(chain))


def _graph_errors(pb: Playbook) -> list[LintError]:
    """Reachability, endings, traps and unmarked cycles."""
    import networkx as nx

    file = str(pb.path)
    g = pb.graph
    out: list[LintError] = []
    if pb.start not in pb.nodes:
        return out  # reported as a reference error; nothing is reachable
    reachable = {pb.start} | nx.descendants(g, pb.start)
    for nid in pb.nodes:
        if nid not in reachable:
            out.append(LintError(file, nid, f"unreachable from start node {pb.start!r}"))

    ends = end_nodes(pb)
    for nid in ends:
        node = pb.nodes[nid]
        if node.kind in END_KINDS or node.kind not in KINDS:
            continue
        if not any(e.to in pb.nodes for e in node.next):
            out.append(LintError(file, nid, f"the walk ends here but this is a {node.kind} node: "
                                            "every path must end in a diagnosis or remedy"))
        else:
            out.append(LintError(file, nid, "no fallback edge: the walk stops here when no predicate "
                                            "holds (add a last edge without 'when')"))

    # Ends reachable without passing a diagnosis: breadth-first, not expanding through diagnoses.
    parents: dict[str, str | None] = {pb.start: None}
    queue = deque([pb.start])
    while queue:
        cur = queue.popleft()
        if pb.nodes[cur].kind == "diagnosis":
            continue
        if cur in ends and pb.nodes[cur].kind == "remedy":
            out.append(LintError(file, cur, "the walk can end here without passing a diagnosis "
                                            f"({_path_to(parents, cur)})"))
        for succ in g.successors(cur):
            if succ not in parents:
                parents[succ] = cur
                queue.append(succ)

    # Traps: reachable nodes from which no end can be reached.
    can_end = set(ends)
    for end in ends:
        can_end |= nx.ancestors(g, end)
    for nid in pb.nodes:
        if nid in reachable and nid not in can_end:
            out.append(LintError(file, nid, "trapped: no path from here ever ends the walk "
                                            "(every way out loops back)"))

    # Cycles must be marked: the graph without loop edges must be a DAG.
    forward = nx.DiGraph()
    forward.add_nodes_from(g.nodes)
    forward.add_edges_from((u, v) for u, v, data in g.edges(data=True)
                           if not any(e.loop for e in data["parallel"]))
    for comp in nx.strongly_connected_components(forward):
        if len(comp) == 1 and not any(forward.has_edge(n, n) for n in comp):
            continue
        cycle = nx.find_cycle(forward.subgraph(comp))
        names = [u for u, _ in cycle] + [cycle[0][0]]
        out.append(LintError(file, min(comp, key=list(pb.nodes).index),
                             f"cycle {' -> '.join(names)} is not marked as a loop "
                             "(set loop = true on the edge that goes back)"))
    for node in pb.nodes.values():
        for e in node.next:
            if e.loop and e.to in pb.nodes and not nx.has_path(g, e.to, node.id):
                out.append(LintError(file, node.id, f"edge to {e.to!r} is marked loop = true but "
                                                    "does not go back to an earlier step"))
    return out


def _lint_one(target: Playbook | Path, vocab: Vocabulary) -> list[LintError]:
    if isinstance(target, Playbook):
        pb: Playbook | None = target
        errors = reference_errors(target)
        if target.id != target.path.stem:
            errors.insert(0, LintError(str(target.path), None, f"id {target.id!r} does not match the file "
                                                               f"name (expected {target.path.stem!r})"))
    else:
        pb, errors = parse_file(target)
    if pb is None:
        return errors
    errors += _vocabulary_errors(pb, vocab)
    errors += _graph_errors(pb)
    return errors


def lint_playbook(
    target: str | Path | Playbook,
    *,
    probes: Iterable[str] | None = None,
    checks: Iterable[str] | None = None,
    predicates: Iterable[str] | None = None,
) -> list[LintError]:
    """Every problem in a playbook file, a loaded Playbook, or each ``*.toml`` of a directory.

    Names not given default to the registered vocabulary. Never raises for a bad file.
    """
    if probes is None or checks is None or predicates is None:
        reg = Vocabulary.from_registry()
        probes = reg.probes if probes is None else probes
        checks = reg.checks if checks is None else checks
        predicates = reg.predicates if predicates is None else predicates
    vocab = Vocabulary(list(probes), list(checks), list(predicates))
    if isinstance(target, Playbook):
        return _lint_one(target, vocab)
    path = Path(target)
    if path.is_dir():
        files = sorted(path.glob("*.toml"))
        if not files:
            return [LintError(str(path), None, "no playbooks (*.toml) in this directory")]
        return [err for f in files for err in _lint_one(f, vocab)] + unused_predicates(path, files, vocab.predicates)
    return _lint_one(path, vocab)


def unused_predicates(folder: Path, files: Iterable[Path], predicates: Iterable[str]) -> list[LintError]:
    """An error for each predicate of the vocabulary that no playbook of ``folder`` names on an edge (a
    condition nothing asks is dead code: a one-lookup one is data in the playbook, ``when = {finding = ...}``
    or ``{fact = ...}``). Nothing is said while a playbook there cannot be read: what it names is unknown."""
    used: set[str] = set()
    for f in files:
        pb, errors = parse_file(f)
        if pb is None or errors:
            return []
        used |= {e.when for node in pb.nodes.values() for e in node.next if e.when is not None}
    return [LintError(str(folder), None, f"predicate {name!r} is used by no playbook: delete it, or make the "
                                         "condition data in the playbook that needs it")
            for name in sorted(set(predicates) - used)]


def lint_path(path: str | Path) -> list[LintError]:
    """Lint a playbook file or every ``*.toml`` of a directory against the registered vocabulary."""
    return lint_playbook(path)
