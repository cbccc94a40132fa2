"""What a guided session needs from the engine beyond :class:`~zdoctor.walk.engine.Walk`: the probes a step
runs, their titles and time budgets, giving up on a slow probe, and a text picture of a playbook graph.

Never imports textual; networkx is imported only for the graph picture.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from zdoctor.core.answers import answering_walk
from zdoctor.core.model import Finding, ProbeResult
from zdoctor.core.registry import CHECKS, PROBES, load_vocabulary
from zdoctor.core.symptom import UNEXPLAINED_PREFIX
from zdoctor.host import Host
from zdoctor.layers import probes_for
from zdoctor.proc import children
from zdoctor.walk.doctor import walk_playbooks
from zdoctor.walk.engine import Walk, probe_names
from zdoctor.walk.playbook import Node, Playbook


def node_probes(node: Node) -> list[str]:
    """Every probe a visit of ``node`` runs, in the order :meth:`Walk.evaluate` asks for them: the node's
    own probes, those its checks read, those its edge predicates read."""

    return probe_names(node)


#: Probes a start screen shows even though no check reads them: the node at a glance.
GLANCE_PROBES = ("system", "nvml")


def first_pass_probes() -> list[str]:
    """The probes of the node at a glance, then every probe the registered checks read (what
    ``zdoctor check`` runs)."""

    load_vocabulary()
    glance = [p for p in GLANCE_PROBES if p in PROBES]
    return list(dict.fromkeys([*glance, *probes_for(CHECKS)]))


def probe_title(name: str) -> str:
    """The registered title of a probe (its name when it is not registered)."""
    spec = PROBES.get(name)
    return spec.title if spec is not None else name


def probe_budget(name: str) -> float | None:
    """The seconds a probe may run before the host abandons it (None when unknown)."""
    spec = PROBES.get(name)
    return spec.timeout if spec is not None else None


def pending(host: Host, names: Iterable[str]) -> list[str]:
    """The probes among ``names`` that ``host`` has no result for yet."""
    done = host.recorded()
    return [n for n in names if n not in done]


def abandon_probe(host: Host, name: str, waited_s: float) -> ProbeResult:
    """Give up waiting for a running probe: the host answers a ``timeout`` result from now on.

    The commands the probe runs are ended (their whole trees; a JIT lock one left is removed, as at a time
    limit); a result the probe still produces replaces this one for the steps that come after. Returns
    the result in effect.
    """
    res = ProbeResult(probe=name, status="timeout", started=time.time() - waited_s, duration_s=waited_s,
                      error=f"probe {name} was cancelled by the user after {waited_s:.1f} s")
    settled = host.settle(name, res)
    children.end_started_by(f"probe:{name}")
    return settled


def _edge_rule(edge) -> str:
    if edge.is_fallback:
        return "otherwise"
    return f"if not {edge.condition_text}" if edge.negate else f"if {edge.condition_text}"


def graph_text(book: Playbook, path: list[str] | None = None, current: str | None = None) -> str:
    """The playbook graph as text: nodes by distance from the start, each with its outgoing edges.

    ``●`` marks the current node, ``✓`` nodes on the path walked so far, ``○`` the rest; ``⇒`` marks an
    edge the walk took.
    """
    import networkx as nx

    g = book.graph
    path = list(path or [])
    taken = set(zip(path, path[1:]))
    depth = nx.single_source_shortest_path_length(g, book.start)
    order = sorted(book.nodes, key=lambda n: (depth.get(n, len(book.nodes)), list(book.nodes).index(n)))
    width = max(len(n) for n in book.nodes)
    visited = sum(1 for n in book.nodes if n in path)
    out = [f"{book.id}: {book.title}", f"{len(book.nodes)} steps, {g.number_of_edges()} edges; "
           f"{visited} visited.  ● here  ✓ walked  ○ not visited  ⇒ edge taken", ""]
    level = None
    for nid in order:
        d = depth.get(nid)
        if d != level:
            level = d
            out.append(f"── distance {d} from the start ──" if d is not None else "── not reachable ──")
        node = book.nodes[nid]
        mark = "●" if nid == current else ("✓" if nid in path else "○")
        out.append(f"{mark} {nid:<{width}}  {node.kind:<9}  {node.title}")
        for e in node.next:
            arrow = "⇒" if (nid, e.to) in taken else "→"
            label = f"  ({e.label})" if e.label else ""
            out.append(f"    {arrow} {e.to:<{width}}  {_edge_rule(e)}{label}")
        for implied, when in ((book.not_checked_edge(node), "instead of a healthy end, if a probe gave no facts"),
                              (book.unexplained_edge(node), "instead of a healthy end, while a symptom is "
                                                            "unexplained")):
            if implied is not None and all(e.to != implied.to for e in node.next):
                arrow = "⇒" if (nid, implied.to) in taken else "→"
                out.append(f"    {arrow} {implied.to:<{width}}  {when}")
    return "\n".join(out)


#: Which playbook follows up a failing finding, by the finding id's first part.
PLAYBOOK_FOR = {"libs": "zero3-launch", "jit": "zero3-launch", "hangs": "zero3-launch", "toolchain": "toolchain",
                "pyenv": "toolchain", "gpu": "gpu-stack", "offload": "offload-bottleneck",
                "storage": "offload-bottleneck"}
#: The placeholder in advice to name the training interpreter.
TRAINING_PYTHON = "/path/to/env/bin/python"


def target_label(pyenv: dict | None, fallback: str = "python3") -> str:
    """The interpreter as zdoctor ran it (the path a user passes to --python), the same in every line."""
    target = (pyenv or {}).get("target") or {}
    return str(target.get("resolved") or target.get("requested") or fallback)


def findings_on_walk(book: Playbook, host: Host) -> set[str]:
    """The ids of every finding a walk of ``book`` on ``host`` shows, following the edges the facts choose
    (the probes it needs are the first pass's, already run)."""
    walk = Walk(book, host)
    seen: set[str] = set()
    for _ in range(len(book.nodes) + 1):
        if walk.done:
            break
        seen |= {f.id for f in walk.evaluate().findings}
        walk.advance()
    return seen


def _walk_for(finding: Finding, host: Host | None, books: Mapping[str, Playbook] | None) -> str | None:
    """The playbook whose walk reaches ``finding``: the one for its subject first, then any other; without a
    host to walk on, the subject's playbook."""
    first = PLAYBOOK_FOR.get(finding.id.split(".")[0], "zero3-launch")
    if host is None or books is None:
        return first
    for pid in [first, *sorted(set(books) - {first})]:
        if pid in books and finding.id in findings_on_walk(books[pid], host):
            return pid
    return None


def answer_step(symptoms: Iterable[Mapping[str, Any]], findings: Iterable[Finding], host: Host | None,
                books: Mapping[str, Playbook] | None) -> str | None:
    """The walk that answers the first symptom a finding explains (:func:`zdoctor.core.answers.answering_walk`, on
    walks of ``books`` on the host's facts; without them, the explaining finding's playbook), as the next
    step; None when no symptom is explained."""
    titles = {f.id: f.title for f in findings}
    for entry in symptoms:
        explaining = [str(x) for x in entry.get("explained_by") or []]
        if not explaining:
            continue
        sid = entry.get("id")
        if host is None or books is None:
            fid = explaining[0]
            pid = PLAYBOOK_FOR.get(fid.split(".")[0], "zero3-launch")
            return f"Next: walk {pid} (select it below), for what you saw ({sid}): {titles.get(fid, fid)}"
        answer, _why = answering_walk(entry, [r.end() for r in walk_playbooks(host, None, dict(books))])
        if answer is None:
            fid = explaining[0]
            return (f"Next: read what explains what you saw ({sid}) in the list above (no walk reaches it): "
                    f"{titles.get(fid, fid)}")
        fid = answer["finding"]
        return f"Next: walk {answer['playbook']} (select it below), for what you saw ({sid}): {titles.get(fid, fid)}"
    return None


def next_step(findings: Iterable[Finding], pyenv: dict | None, replay: bool = False, host: Host | None = None,
              books: Mapping[str, Playbook] | None = None, symptoms: Iterable[Mapping[str, Any]] = ()) -> str:
    """The one thing to do next, from the first pass: run again later when the interpreter had not answered
    in zdoctor's time while working (slow, not broken); name the training interpreter when the probed one
    cannot be it (missing, no torch); else, while a symptom stands unexplained, read its finding; else walk
    the playbook that answers the first explained symptom (:func:`answer_step`); else walk the playbook that
    reaches the worst finding (with ``host`` and ``books``: a walk on the host's facts shows it). A warning
    no walk reaches is named as one to read in the list, not as a walk."""
    found = list(findings)
    target = (pyenv or {}).get("target") or {}
    torch = (pyenv or {}).get("torch") or {}
    if pyenv and pyenv.get("error_kind") == "timeout" and not pyenv.get("waiting"):  # late, not broken
        return ("Next: run zdoctor again when the node is less busy: the training interpreter had not answered "
                f"when zdoctor's time ran out ({pyenv.get('node_load') or 'load unknown'})")
    if not replay and not target.get("explicit") and (pyenv is None or pyenv.get("error")
                                                       or torch.get("installed") is False):
        return f"Next: name the training interpreter: zdoctor --python {TRAINING_PYTHON}"
    if not replay and torch.get("installed") is False:
        return "Next: install torch in the interpreter above, or name the training one with --python"
    open_ones = [f for f in found if f.id.startswith(UNEXPLAINED_PREFIX)]
    if open_ones:  # what the user saw comes first: no walk's failure is the answer to it
        ids = ", ".join(f.id[len(UNEXPLAINED_PREFIX):] for f in open_ones)
        known = any("from the message only" in f.title for f in open_ones)
        return (f"Next: what you saw ({ids}) is explained by nothing zdoctor examined: read its Unexplained "
                "finding above" + (" (the likely cause, from the message only)" if known else
                                   " (what was and was not examined)"))
    answer = answer_step(symptoms, found, host, books)
    if answer is not None:
        return answer
    unwalked: Finding | None = None
    for status in ("fail", "crash", "warn"):
        for worst in (f for f in found if f.status == status):
            pid = _walk_for(worst, host, books)
            if pid is None:
                unwalked = unwalked or worst
                continue
            what = "a warning" if status == "warn" else "a failure"
            return f"Next: walk {pid} (select it below), for {what}: {worst.title}"
    if unwalked is not None:
        what = "warning" if unwalked.status == "warn" else "failure"
        return f"Next: read the {what} in the list above (no walk reaches it): {unwalked.title}"
    return "Next: nothing failed; walk zero3-launch (Enter) if the launch still fails, with --command \"...\""
