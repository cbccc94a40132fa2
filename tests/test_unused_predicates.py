"""A predicate no playbook names is dead code: ``zdoctor playbooks lint`` rejects it."""

from __future__ import annotations

import shutil
from pathlib import Path

from zdoctor.core import registry
from zdoctor.walk.playbook_lint import lint_path

PLAYBOOKS = Path(__file__).resolve().parent.parent / "playbooks"


def test_the_shipped_playbooks_use_every_registered_predicate():
    assert lint_path(PLAYBOOKS) == []


def test_a_registered_predicate_no_playbook_uses_fails_the_lint(tmp_path: Path):
    books = tmp_path / "playbooks"
    shutil.copytree(PLAYBOOKS, books)
    registry.load_vocabulary()

    @registry.predicate("nobody_asks_this", doc="a condition no playbook names", probes=("nvml",))
    def nobody_asks_this(facts: registry.Facts) -> bool:
        return True

    try:
        errors = [str(e) for e in lint_path(books)]
        assert len(errors) == 1 and "predicate 'nobody_asks_this' is used by no playbook" in errors[0]
        assert errors[0].startswith(str(books))
        # a playbook that names it on an edge makes it used
        first = sorted(books.glob("*.toml"))[0]
        text = first.read_text()
        assert lint_path(first) == []
        edge = '\n[[nodes.{node}.next]]\nto = "{to}"\nwhen = "nobody_asks_this"\n'
        start, target = _a_node_with_a_fallback(first)
        first.write_text(_before_fallback(text, start, edge.format(node=start, to=target)))
        assert lint_path(books) == [], [str(e) for e in lint_path(books)]
    finally:
        del registry.PREDICATES["nobody_asks_this"]


def test_an_unreadable_playbook_leaves_the_question_open(tmp_path: Path):
    """While a playbook of the folder cannot be read, what it names is unknown: no predicate is called unused."""
    books = tmp_path / "playbooks"
    shutil.copytree(PLAYBOOKS, books)
    (books / "zz-broken.toml").write_text("this is [not toml\n")
    registry.load_vocabulary()

    @registry.predicate("nobody_asks_this", doc="a condition no playbook names", probes=("nvml",))
    def nobody_asks_this(facts: registry.Facts) -> bool:
        return True

    try:
        errors = [str(e) for e in lint_path(books)]
        assert errors and all("zz-broken.toml" in e for e in errors)
    finally:
        del registry.PREDICATES["nobody_asks_this"]


def _a_node_with_a_fallback(book: Path) -> tuple[str, str]:
    """A node of ``book`` whose last edge is its fallback (no ``when``), and that edge's target."""
    from zdoctor.walk.playbook import load_playbook

    pb = load_playbook(book)
    for node in pb.nodes.values():
        if node.next and node.next[-1].is_fallback:
            return node.id, node.next[-1].to
    raise AssertionError(f"no node with a fallback edge in {book}")


def _before_fallback(text: str, node: str, edge: str) -> str:
    """``text`` with ``edge`` put before the first edge of ``node`` (conditions are tried in order; the
    fallback stays last)."""
    marker = f"[[nodes.{node}.next]]"
    at = text.index(marker)
    return text[:at] + edge.lstrip("\n") + "\n" + text[at:]
