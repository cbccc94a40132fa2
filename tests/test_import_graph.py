"""The project's own import graph, read from the code (module-level, function-level and TYPE_CHECKING
imports alike), against the import contract declared in pyproject.toml (``[tool.importlinter]``, in
import-linter's format): no circle between modules or between folders, no import that runs up the tiers,
and no node layer that imports one above it. The contract names packages, so a new module is held to its
folder's tier without being named anywhere."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import networkx as nx

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tests run on 3.11 too
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "zdoctor"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CONTRACTS = {c["id"]: c for c in PYPROJECT["tool"]["importlinter"]["contracts"]}


def tiers(contract: dict) -> list[tuple[str, ...]]:
    """The contract's layers bottom first, each a tuple of package names (``:`` joins one tier's packages)."""
    prefix = [f"{c}." for c in contract.get("containers", [])] or [""]
    return [tuple(prefix[0] + p.strip() for p in layer.split(":")) for layer in reversed(contract["layers"])]


TIERS = tiers(CONTRACTS["tiers"])
NODE_LAYERS = tiers(CONTRACTS["node-layers"])


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """One module's syntax tree, parsed once per test process (every test here reads the whole package)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def imports(mods: dict[str, Path]) -> nx.DiGraph:
    """Every import between the project's modules (``from p import x`` counts as importing ``p.x`` when that
    is a module)."""
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(parsed(path)):
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


def rank_in(levels: list[tuple[str, ...]], name: str) -> int:
    """The index of the level whose package holds ``name`` (the longest match), or -1."""
    best, rank = -1, -1
    for i, packages in enumerate(levels):
        for p in packages:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    return rank


def folder(name: str) -> str:
    """The folder a module lives in, as the contracts name folders (a node layer's package, else the top one)."""
    parts = name.split(".")
    if name.startswith("zdoctor.layers."):
        return ".".join(parts[:3])
    return ".".join(parts[:2]) if len(parts) > 2 else name


def test_every_module_is_in_a_declared_tier():
    assert [m for m in modules() if m != "zdoctor" and rank_in(TIERS, m) < 0] == []
    layers = {folder(m) for m in modules() if m.startswith("zdoctor.layers.")}
    assert sorted(layers) == sorted(p for level in NODE_LAYERS for p in level)


def test_there_is_no_import_circle():
    g = imports(modules())
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert circles == [], circles


def test_there_is_no_circle_between_folders():
    g = imports(modules())
    folders = nx.DiGraph((folder(a), folder(b)) for a, b in g.edges if folder(a) != folder(b))
    assert [sorted(c) for c in nx.strongly_connected_components(folders) if len(c) > 1] == []


def test_no_import_runs_up_the_tiers():
    g = imports(modules())
    up = [(a, b) for a, b in g.edges
          if a != "zdoctor" and b != "zdoctor" and rank_in(TIERS, a) < rank_in(TIERS, b)]
    assert up == [], "\n".join(f"{a} imports {b}, a tier above it" for a, b in up)


def test_no_node_layer_imports_one_above_it():
    g = imports(modules())
    up = [(a, b) for a, b in g.edges
          if rank_in(NODE_LAYERS, a) >= 0 and rank_in(NODE_LAYERS, a) < rank_in(NODE_LAYERS, b)]
    assert up == [], "\n".join(f"{a} imports {b}, a node layer above it" for a, b in up)


def test_the_contract_orders_the_tiers_as_documented():
    """A few known ranks, so a contract read the wrong way round (top first vs bottom first) cannot pass."""
    assert rank_in(TIERS, "zdoctor.front.cli") > rank_in(TIERS, "zdoctor.report.export")
    assert rank_in(TIERS, "zdoctor.report.export") > rank_in(TIERS, "zdoctor.walk.engine")
    assert rank_in(TIERS, "zdoctor.layers.gpu.check_gpu") > rank_in(TIERS, "zdoctor.readers.elf")
    gpu, kernel_log = "zdoctor.layers.gpu.check_gpu", "zdoctor.layers.kernel_log.kernlog"
    assert rank_in(NODE_LAYERS, gpu) > rank_in(NODE_LAYERS, kernel_log)


def deferred_imports(mods: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a zdoctor module made inside a function."""
    out: set[tuple[str, str]] = set()
    for name, path in mods.items():
        for fn in ast.walk(parsed(path)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                targets: list[str] = []
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                               for a in node.names]
                for t in targets:
                    while t and t not in mods:
                        t = t.rpartition(".")[0]
                    if t.startswith("zdoctor") and t != name:
                        out.add((name, t))
    return out


def test_every_deferred_import_is_declared_with_its_reason():
    declared = {tuple(k.split(" -> ")): why for k, why in PYPROJECT["tool"]["zdoctor"]["deferred-imports"].items()}
    found = deferred_imports(modules())
    assert sorted(found - set(declared)) == [], "import these at the top of the module, or declare why not"
    assert sorted(set(declared) - found) == [], "declared deferred imports that no longer exist"
    assert all(len(why) > 20 for why in declared.values())
