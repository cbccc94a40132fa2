"""Playbooks: TOML decision graphs, their model and their loader.

A playbook names a ``start`` node and a table of nodes; each node lists outgoing edges in the order
they are tried. Edges name registered predicates (never Python to evaluate). ``load_playbook`` parses
and checks structure (types, keys, references between nodes); :mod:`zdoctor.walk.playbook_lint` also checks
the shape of the graph and the vocabulary it uses. networkx is imported only when a graph is asked for.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zdoctor.core import resources
from zdoctor.core.errors import InputError
from zdoctor.proc.userfile import read_user_file
from zdoctor.walk.conditions import Condition, parse_condition

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

if TYPE_CHECKING:
    import networkx

KINDS = ("probe", "question", "diagnosis", "remedy")
#: Kinds of node where a walk may legitimately end.
END_KINDS = frozenset({"diagnosis", "remedy"})
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

TOP_KEYS = ("id", "title", "summary", "start", "nodes", "not_checked", "unexplained")
NODE_KEYS = ("kind", "title", "why", "explain", "probes", "checks", "question", "default", "next", "healthy",
             "examined", "not_examined", "elsewhere")
EDGE_KEYS = ("to", "when", "negate", "label", "loop")
#: A playbook is a few KiB of TOML.
MAX_PLAYBOOK_BYTES = 1024 * 1024

_TOML_POS = re.compile(r"^(?P<msg>.*?)\s*\(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)
_TOML_END = re.compile(r"^(?P<msg>.*?)\s*\(at end of document\)$", re.S)


# -- data ------------------------------------------------------------------------------------------
@dataclass
class Edge:
    """One outgoing edge: ``when`` names a predicate, or ``cond`` is a condition given as data (see
    :mod:`zdoctor.walk.conditions`); neither for the fallback (or for a plain answer of a question)."""

    source: str
    to: str
    when: str | None = None
    negate: bool = False
    label: str = ""
    loop: bool = False
    order: int = 0
    cond: Condition | None = None

    @property
    def is_fallback(self) -> bool:
        return self.when is None and self.cond is None

    @property
    def condition_text(self) -> str | None:
        """The condition as written: the predicate's name, or the data condition in words."""
        return self.when if self.cond is None else self.cond.describe()


@dataclass
class Node:
    """One step of a playbook."""

    id: str
    kind: str
    title: str
    why: str
    explain: str
    probes: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    question: str | None = None
    default: str | None = None
    next: list[Edge] = field(default_factory=list)
    #: A diagnosis that says all is well (``healthy = true``): never to be reached from missing data.
    healthy: bool = False
    #: A healthy diagnosis's scope: what it rests on, and what it did not look at.
    examined: list[str] = field(default_factory=list)
    not_examined: list[str] = field(default_factory=list)
    #: A diagnosis that only says the cause is elsewhere (``elsewhere = true``): like a healthy one, it gives
    #: way to the playbook's ``unexplained`` end while a symptom the user saw is explained by no finding.
    elsewhere: bool = False

    @property
    def open_end(self) -> bool:
        """A diagnosis that names no cause: healthy, or "the cause is elsewhere"."""
        return self.healthy or self.elsewhere

    @property
    def is_terminal(self) -> bool:
        return not self.next

    def edges_to(self, target: str) -> list[Edge]:
        return [e for e in self.next if e.to == target]


@dataclass
class Playbook:
    """A loaded playbook; ``graph`` is a networkx DiGraph built on first use."""

    id: str
    title: str
    summary: str
    start: str
    path: Path
    nodes: dict[str, Node]
    #: The diagnosis a walk ends in, instead of a ``healthy`` one, when a probe on its path gave no facts.
    not_checked: str | None = None
    #: The diagnosis a walk ends in, instead of a ``healthy`` one, while a symptom the user saw is unexplained.
    unexplained: str | None = None

    @cached_property
    def graph(self) -> networkx.DiGraph:
        """Nodes carry ``node`` (the Node); edges carry the Edge's fields, ``edge`` and ``parallel``."""
        import networkx as nx

        g = nx.DiGraph(id=self.id, title=self.title, start=self.start)
        for nid, node in self.nodes.items():
            g.add_node(nid, node=node, kind=node.kind, title=node.title)
        for node in self.nodes.values():
            for e in node.next:
                if e.to not in self.nodes:
                    continue
                if g.has_edge(node.id, e.to):
                    g.edges[node.id, e.to]["parallel"].append(e)
                    continue
                g.add_edge(node.id, e.to, edge=e, parallel=[e], when=e.when, negate=e.negate,
                           label=e.label, loop=e.loop, order=e.order)
        for node in self.nodes.values():
            for implied in (self.not_checked_edge(node), self.unexplained_edge(node)):
                if implied is not None and not g.has_edge(node.id, implied.to):
                    g.add_edge(node.id, implied.to, edge=implied, parallel=[implied], when=None, negate=False,
                               label=implied.label, loop=False, order=implied.order, implied=True)
        return g

    def _leads_to_healthy(self, node: Node) -> bool:
        return any(self.nodes[e.to].healthy for e in node.next if e.to in self.nodes)

    def not_checked_edge(self, node: Node) -> Edge | None:
        """The implied edge from ``node`` to :attr:`not_checked`, taken instead of an edge into a healthy
        diagnosis when a probe the walk rests on gave no facts (None when ``node`` has no such edge)."""
        if not self.not_checked or self.not_checked not in self.nodes or not self._leads_to_healthy(node):
            return None
        return Edge(source=node.id, to=self.not_checked, label="not everything a healthy verdict rests on "
                    "could be checked", order=len(node.next))

    def unexplained_edge(self, node: Node) -> Edge | None:
        """The implied edge from ``node`` to :attr:`unexplained`, taken instead of an edge into a healthy
        diagnosis while a symptom the user saw is explained by no finding (None when ``node`` has none)."""
        if not self.unexplained or self.unexplained not in self.nodes:
            return None
        if not any(self.nodes[e.to].open_end for e in node.next if e.to in self.nodes):
            return None
        return Edge(source=node.id, to=self.unexplained, label="a symptom you saw is not explained by any finding",
                    order=len(node.next) + 1)

    def node(self, nid: str) -> Node:
        return self.nodes[nid]


@dataclass(frozen=True)
class LintError:
    """One problem in a playbook file; ``node`` is None for file-level problems."""

    file: str
    node: str | None
    message: str
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}:{self.col or 1}"
        if self.node is not None:
            where += f":{self.node}"
        return f"{where}: {self.message}"


# -- parsing ---------------------------------------------------------------------------------------
def _toml_type(value: Any) -> str:
    names = {bool: "boolean", str: "string", int: "integer", float: "float", list: "array",
             dict: "table"}
    return names.get(type(value), type(value).__name__)


def _toml_error(file: str, text: str, exc: Exception) -> LintError:
    msg = str(exc)
    m = _TOML_POS.match(msg)
    if m:
        return LintError(file, None, f"invalid TOML: {m['msg']}", int(m["line"]), int(m["col"]))
    m = _TOML_END.match(msg)
    if m:
        lines = text.split("\n")
        return LintError(file, None, f"invalid TOML: {m['msg']} at end of document", len(lines),
                         len(lines[-1]) + 1)
    return LintError(file, None, f"invalid TOML: {msg}")


def _read_toml(path: Path) -> tuple[dict[str, Any] | None, LintError | None]:

    file = str(path)
    try:
        raw = read_user_file(file, "playbook file", MAX_PLAYBOOK_BYTES)
    except InputError as exc:
        if not path.exists() and not path.is_symlink():
            return None, LintError(file, None, "no such file")
        return None, LintError(file, None, str(exc)[len(file) + 2:] if str(exc).startswith(file + ": ") else str(exc))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, LintError(file, None, f"not UTF-8 text (bad byte at offset {exc.start})")
    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as exc:
        return None, _toml_error(file, text, exc)
    except RecursionError:  # arrays or inline tables nested thousands deep
        return None, LintError(file, None, "nested too deeply to read (arrays or inline tables)")


class _Parser:
    """Builds a best-effort Playbook from TOML data and collects every structural problem."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.file = str(path)
        self.data = data
        self.errors: list[LintError] = []

    def err(self, node: str | None, message: str) -> None:
        self.errors.append(LintError(self.file, node, message))

    def unknown_keys(self, table: Mapping[str, Any], allowed: tuple[str, ...], node: str | None,
                     where: str) -> None:
        for key in table:
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                self.err(node, f"unknown key {key!r} in {where}{extra}")

    def text(self, table: Mapping[str, Any], key: str, node: str | None, where: str,
             required: bool = True) -> str | None:
        if key not in table:
            if required:
                self.err(node, f"missing {key!r} in {where}")
            return None
        value = table[key]
        if not isinstance(value, str):
            self.err(node, f"{key!r} in {where} must be a string, not {_toml_type(value)}")
            return None
        if required and not value.strip():
            self.err(node, f"{key!r} in {where} is empty")
        return value

    def flag(self, table: Mapping[str, Any], key: str, node: str, where: str) -> bool:
        value = table.get(key, False)
        if not isinstance(value, bool):
            self.err(node, f"{key!r} in {where} must be a boolean, not {_toml_type(value)}")
            return False
        return value

    def names(self, table: Mapping[str, Any], key: str, node: str) -> list[str]:
        value = table.get(key, [])
        if not isinstance(value, list):
            self.err(node, f"{key!r} must be an array of names, not {_toml_type(value)}")
            return []
        out = []
        for item in value:
            if not isinstance(item, str) or not item:
                self.err(node, f"{key!r} must hold non-empty strings, found {item!r}")
            else:
                out.append(item)
        return out

    def parse(self) -> Playbook:
        d = self.data
        self.unknown_keys(d, TOP_KEYS, None, "the playbook")
        pid = self.text(d, "id", None, "the playbook") or ""
        if pid and pid != self.path.stem:
            self.err(None, f"id {pid!r} does not match the file name (expected {self.path.stem!r})")
        title = self.text(d, "title", None, "the playbook") or ""
        summary = self.text(d, "summary", None, "the playbook") or ""
        start = self.text(d, "start", None, "the playbook") or ""
        raw_nodes = d.get("nodes")
        nodes: dict[str, Node] = {}
        if raw_nodes is None:
            self.err(None, "missing [nodes.*] tables: a playbook needs at least one node")
        elif not isinstance(raw_nodes, dict):
            self.err(None, f"'nodes' must be a table of node tables, not {_toml_type(raw_nodes)}")
        else:
            for nid, raw in raw_nodes.items():
                node = self.parse_node(nid, raw)
                if node is not None:
                    nodes[nid] = node
        not_checked = self.text(d, "not_checked", None, "the playbook", required=False)
        unexplained = self.text(d, "unexplained", None, "the playbook", required=False)
        return Playbook(id=pid, title=title, summary=summary, start=start, path=self.path, nodes=nodes,
                        not_checked=not_checked, unexplained=unexplained)

    def parse_node(self, nid: str, raw: Any) -> Node | None:
        if not ID_RE.match(nid):
            self.err(repr(nid), "node id must start with a letter or digit and use only "
                                "letters, digits, '_', '.', '-'")
            return None
        if not isinstance(raw, dict):
            self.err(nid, f"node must be a table, not {_toml_type(raw)}")
            return None
        where = "the node"
        self.unknown_keys(raw, NODE_KEYS, nid, where)
        kind = self.text(raw, "kind", nid, where) or ""
        if kind and kind not in KINDS:
            self.err(nid, f"unknown kind {kind!r} (expected one of: {', '.join(KINDS)})")
        node = Node(
            id=nid, kind=kind,
            title=self.text(raw, "title", nid, where) or "",
            why=self.text(raw, "why", nid, where) or "",
            explain=self.text(raw, "explain", nid, where) or "",
            probes=self.names(raw, "probes", nid),
            checks=self.names(raw, "checks", nid),
            healthy=self.flag(raw, "healthy", nid, where),
            examined=self.names(raw, "examined", nid),
            not_examined=self.names(raw, "not_examined", nid),
            elsewhere=self.flag(raw, "elsewhere", nid, where),
        )
        if node.elsewhere and (kind != "diagnosis" or node.healthy):
            self.err(nid, "'elsewhere' is only allowed on a diagnosis that is not healthy")
        if node.healthy and kind != "diagnosis":
            self.err(nid, f"'healthy' is only allowed on diagnosis nodes (this node is {kind!r})")
        if (node.examined or node.not_examined) and not node.healthy:
            self.err(nid, "'examined' and 'not_examined' are the scope of a healthy diagnosis (healthy = true)")
        if node.healthy and not node.not_examined:
            self.err(nid, "a healthy diagnosis must list what it did not examine ('not_examined')")
        if node.healthy and not node.examined:
            self.err(nid, "a healthy diagnosis must list what it examined ('examined')")
        is_question = kind == "question"
        if is_question:
            node.question = self.text(raw, "question", nid, "a question node")
            node.default = self.text(raw, "default", nid, "a question node")
        else:
            for key in ("question", "default"):
                if key in raw:
                    self.err(nid, f"{key!r} is only allowed on question nodes (this node is {kind!r})")
        raw_next = raw.get("next", [])
        if not isinstance(raw_next, list) or not all(isinstance(e, dict) for e in raw_next):
            self.err(nid, "'next' must be an array of tables ([[nodes.<id>.next]])")
            raw_next = []
        for order, raw_edge in enumerate(raw_next):
            edge = self.parse_edge(nid, order, raw_edge, is_question)
            if edge is not None:
                node.next.append(edge)
        if not is_question:
            fallbacks = [e for e in node.next if e.is_fallback]
            if len(fallbacks) > 1:
                self.err(nid, f"{len(fallbacks)} fallback edges (edges without 'when'); at most one is allowed")
            elif fallbacks and fallbacks[0] is not node.next[-1]:
                self.err(nid, f"fallback edge to {fallbacks[0].to!r} must be the last edge "
                              "(edges after it could never be taken)")
        return node

    def parse_edge(self, nid: str, order: int, raw: dict[str, Any], is_question: bool) -> Edge | None:
        where = f"edge #{order + 1}"
        self.unknown_keys(raw, EDGE_KEYS, nid, where)
        to = self.text(raw, "to", nid, where)
        cond = None
        if isinstance(raw.get("when"), dict):
            cond, problems = parse_condition(raw["when"])
            for problem in problems:
                self.err(nid, f"'when' in {where}: {problem}")
            when = None
        else:
            when = self.text(raw, "when", nid, where, required=False)
        if when is not None and not when.strip():
            self.err(nid, f"'when' in {where} is empty (leave it out for a fallback edge)")
            when = None
        label = self.text(raw, "label", nid, where, required=False) or ""
        negate = self.flag(raw, "negate", nid, where)
        loop = self.flag(raw, "loop", nid, where)
        if negate and when is None and cond is None:
            self.err(nid, f"{where} sets 'negate' without a 'when' predicate")
        if is_question and not label.strip() and to:
            self.err(nid, f"answer edge to {to!r} needs a 'label' (the answer text shown to the user)")
        if not to:
            return None
        return Edge(source=nid, to=to, when=when, negate=negate, label=label, loop=loop, order=order, cond=cond)


def reference_errors(pb: Playbook) -> list[LintError]:
    """Names of nodes that point nowhere: start, edge targets, question defaults."""
    file = str(pb.path)
    out = []
    if pb.start and pb.start not in pb.nodes:
        out.append(LintError(file, None, f"start node {pb.start!r} is not defined"))
    if pb.not_checked and pb.not_checked not in pb.nodes:
        out.append(LintError(file, None, f"not_checked node {pb.not_checked!r} is not defined"))
    elif pb.not_checked and (pb.nodes[pb.not_checked].kind != "diagnosis" or pb.nodes[pb.not_checked].healthy):
        out.append(LintError(file, None, f"not_checked node {pb.not_checked!r} must be a diagnosis that is not "
                                         "healthy"))
    if not pb.unexplained and any(n.open_end for n in pb.nodes.values()):
        out.append(LintError(file, None, "a playbook with a healthy diagnosis needs 'unexplained': the diagnosis a "
                                         "walk ends in while a symptom the user saw is explained by no finding"))
    elif pb.unexplained and pb.unexplained not in pb.nodes:
        out.append(LintError(file, None, f"unexplained node {pb.unexplained!r} is not defined"))
    elif pb.unexplained and (pb.nodes[pb.unexplained].kind != "diagnosis" or pb.nodes[pb.unexplained].healthy):
        out.append(LintError(file, None, f"unexplained node {pb.unexplained!r} must be a diagnosis that is not "
                                         "healthy"))
    for node in pb.nodes.values():
        for e in node.next:
            if e.to not in pb.nodes:
                out.append(LintError(file, node.id, f"edge to unknown node {e.to!r}"))
        if node.healthy and not pb.not_checked:
            out.append(LintError(file, node.id, "a healthy diagnosis needs the playbook's not_checked "
                                                "(the diagnosis to end in when a probe gave no facts)"))
        if node.kind == "question" and node.default:
            targets = [e.to for e in node.next]
            if node.default not in targets:
                out.append(LintError(file, node.id, f"default {node.default!r} is not one of this "
                                                    f"question's answers ({', '.join(targets) or 'none'})"))
    return out


def parse_file(path: Path) -> tuple[Playbook | None, list[LintError]]:
    data, error = _read_toml(path)
    if error is not None:
        return None, [error]
    assert data is not None
    parser = _Parser(path, data)
    pb = parser.parse()
    return pb, parser.errors + reference_errors(pb)


def load_playbook(path: str | Path) -> Playbook:
    """Load one playbook; any structural problem raises :class:`InputError` (one line)."""
    path = Path(path)
    pb, errors = parse_file(path)
    if errors:
        more = f" (and {len(errors) - 1} more; run `zdoctor playbooks lint`)" if len(errors) > 1 else ""
        raise InputError(f"{errors[0]}{more}")
    assert pb is not None
    return pb


def _default_dirs() -> list[Path]:

    return [resources.data_dir("playbooks")]


def load_bundled(pid: str) -> Playbook:
    """The bundled playbook ``pid``: read from its own file (``PID.toml``) when that holds it, else found
    among them all (a ``KeyError`` when none has that id)."""
    for d in _default_dirs():
        path = d / f"{pid}.toml"
        if path.is_file():
            pb = load_playbook(path)
            if pb.id == pid:
                return pb
    return load_all()[pid]


def load_all(dirs: Iterable[str | Path] | None = None) -> dict[str, Playbook]:
    """Every ``*.toml`` playbook in ``dirs`` (default: the bundled ones), by id."""
    out: dict[str, Playbook] = {}
    for d in (_default_dirs() if dirs is None else [Path(x) for x in dirs]):
        if not d.is_dir():
            raise InputError(f"{d}: not a directory of playbooks")
        for path in sorted(d.glob("*.toml")):
            pb = load_playbook(path)
            if pb.id in out:
                raise InputError(f"{path}: playbook id {pb.id!r} is already defined by {out[pb.id].path}")
            out[pb.id] = pb
    return dict(sorted(out.items()))


def find_playbook(pid: str, dirs: Iterable[str | Path] | None = None) -> Playbook:
    """The playbook called ``pid``; InputError naming the known ones when there is none."""
    search = _default_dirs() if dirs is None else [Path(x) for x in dirs]
    if ID_RE.match(pid):
        for d in search:
            cand = d / f"{pid}.toml"
            if cand.is_file():
                return load_playbook(cand)
    known = sorted({p.stem for d in search if d.is_dir() for p in d.glob("*.toml")})
    raise InputError(f"no playbook named {pid!r} (known: {', '.join(known) or 'none'})")


def _edge_text(node: Node, e: Edge) -> str:
    if e.is_fallback:
        cond = "(answer)" if node.kind == "question" else "(fallback)"
    else:
        cond = f"{'unless' if e.negate else 'when'} {e.condition_text}"
    extras = [f'"{e.label}"'] if e.label else []
    if e.loop:
        extras.append("(loop)")
    if node.kind == "question" and e.to == node.default:
        extras.append("(default)")
    return " ".join([f"-> {e.to}", cond, *extras])


def describe(pb: Playbook) -> str:
    """A plain-text outline of a playbook: every node, what it runs and where it goes."""
    lines = [f"{pb.id}: {pb.title}", *(f"  {line}" for line in pb.summary.strip().splitlines()),
             f"start: {pb.start}"]
    if pb.not_checked:
        lines.append(f"not checked: {pb.not_checked} (instead of a healthy diagnosis when a probe gave no facts)")
    if pb.unexplained:
        lines.append(f"unexplained: {pb.unexplained} (instead of a healthy diagnosis while a symptom is unexplained)")
    lines.append("")
    for node in pb.nodes.values():
        lines.append(f"[{node.kind}{', healthy' if node.healthy else ''}] {node.id}: {node.title}")
        lines.append(f"    why: {node.why}")
        if node.question:
            lines.append(f"    question: {node.question}")
        if node.probes:
            lines.append(f"    probes: {', '.join(node.probes)}")
        if node.checks:
            lines.append(f"    checks: {', '.join(node.checks)}")
        lines += [f"    {_edge_text(node, e)}" for e in node.next]
    return "\n".join(lines)
