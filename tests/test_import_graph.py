"""The project's own import graph, read from the code (module-level, function-level and TYPE_CHECKING
imports alike): no circle, and no import that runs up the declared layer order. An exception must be
declared here, with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "zdoctor"

#: The layers, bottom first: a module may import its own layer and those below, never one above. A module
#: is in the layer of the longest prefix listed.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("zdoctor", "zdoctor.errors", "zdoctor.units", "zdoctor.verdicts", "zdoctor.plural", "zdoctor.shellquote",
              "zdoctor.symptoms.model", "zdoctor.resources", "zdoctor.scripts", "zdoctor.layers", "zdoctor.progress",
              "zdoctor.shim", "zdoctor.factstypes")),
    ("model", ("zdoctor.model", "zdoctor.redact", "zdoctor.userfile", "zdoctor.atomic", "zdoctor.children",
               "zdoctor.runner", "zdoctor.target", "zdoctor.packages", "zdoctor.present", "zdoctor.asuser",
               "zdoctor.sysfile", "zdoctor.isolate_env", "zdoctor.contain", "zdoctor.cgroup",
               "zdoctor.rules", "zdoctor.runas", "zdoctor.codeowner", "zdoctor.privilege", "zdoctor.trainuser",
               "zdoctor.systools", "zdoctor.scratch",
               "zdoctor.shape", "zdoctor.filefix")),
    ("facts", ("zdoctor.registry", "zdoctor.host", "zdoctor.forensics", "zdoctor.storage", "zdoctor.gpu",
               "zdoctor.offload", "zdoctor.symptoms.extract", "zdoctor.symptoms.match", "zdoctor.symptoms.view",
               "zdoctor.symptoms", "zdoctor.core_apply", "zdoctor.glossary", "zdoctor.container",
               "zdoctor.fleet.hosts", "zdoctor.launch")),
    ("probes", ("zdoctor.probes",)),
    ("checks", ("zdoctor.checks", "zdoctor.symptoms.ledger")),
    ("walk", ("zdoctor.conditions", "zdoctor.walkwords", "zdoctor.playbook", "zdoctor.playbook_lint",
              "zdoctor.events", "zdoctor.session", "zdoctor.engine", "zdoctor.doctor", "zdoctor.guide",
              "zdoctor.practice", "zdoctor.apply", "zdoctor.resume", "zdoctor.answers")),
    ("report", ("zdoctor.report", "zdoctor.progressline", "zdoctor.exportparts", "zdoctor.export",
                "zdoctor.htmlreport", "zdoctor.fleet")),
    ("front", ("zdoctor.fleet_command", "zdoctor.cli", "zdoctor.tui", "zdoctor.isolate", "zdoctor.__main__",
               "zdoctor.bundle")),
]

#: Imports allowed against the layer order, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(mods: dict[str, Path]) -> nx.DiGraph:
    """Every import between the project's modules (``from . import x`` counts as importing ``x``)."""
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[:len(up) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    g.add_edge(name, t)
    return g


def layer_of(name: str) -> int:
    best, rank = -1, -1
    for i, (_label, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank >= 0, f"{name} is in no declared layer: add it to LAYERS"
    return rank


def test_there_is_no_import_circle():
    g = imports(modules())
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == [], circles


def test_no_import_runs_up_the_layers():
    g = imports(modules())
    up = [(a, b) for a, b in g.edges if layer_of(a) < layer_of(b) and (a, b) not in EXCEPTIONS]
    assert up == [], "\n".join(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                               for a, b in up)


def test_every_declared_exception_is_still_needed():
    g = imports(modules())
    assert [e for e in EXCEPTIONS if not g.has_edge(*e)] == []
