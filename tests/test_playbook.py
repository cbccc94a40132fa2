"""The playbook format: loading, the graph it builds, and every lint rule."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zdoctor.core import registry
from zdoctor.core.errors import InputError
from zdoctor.walk.playbook import LintError, Playbook, describe, find_playbook, load_all, load_playbook
from zdoctor.walk.playbook_lint import end_nodes, lint_path, lint_playbook

FIXTURES = Path(__file__).parent / "fixtures" / "playbooks"
GOOD = FIXTURES / "good"
BROKEN = FIXTURES / "broken"
REPO = Path(__file__).resolve().parent.parent

VOCAB = {
    "probes": ["alpha", "beta", "gamma"],
    "checks": ["alpha_ok"],
    "predicates": ["alpha_high", "beta_present", "has_gamma", "boom"],
}

GOOD_FILES = sorted(GOOD.glob("*.toml"))
BROKEN_FILES = sorted(BROKEN.glob("*.toml"))
EXPECT = re.compile(r"^# expect: (?P<node>.+?): (?P<text>.+)$")


def expectations(path: Path) -> list[tuple[str | None, str]]:
    out = []
    for line in path.read_text().splitlines():
        m = EXPECT.match(line)
        if m:
            out.append((None if m["node"] == "-" else m["node"], m["text"]))
    return out


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- good playbooks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", GOOD_FILES, ids=lambda p: p.stem)
def test_good_fixtures_lint_clean(path: Path) -> None:
    assert lint_playbook(path, **VOCAB) == []


def test_fixture_sets_are_not_empty() -> None:
    assert len(GOOD_FILES) >= 4 and len(BROKEN_FILES) >= 20


def test_load_playbook_builds_nodes_and_edges_in_order() -> None:
    pb = load_playbook(GOOD / "branching.toml")
    assert (pb.id, pb.start, pb.path) == ("branching", "gather", GOOD / "branching.toml")
    assert pb.title == "Branching on probe facts" and pb.summary.startswith("Gathers alpha")
    assert list(pb.nodes) == ["gather", "too-high", "lower-alpha", "no-beta", "healthy"]
    gather = pb.nodes["gather"]
    assert (gather.kind, gather.probes, gather.checks) == ("probe", ["alpha"], ["alpha_ok"])
    assert [(e.to, e.when, e.negate, e.order) for e in gather.next] == [
        ("too-high", "alpha_high", False, 0), ("no-beta", "beta_present", True, 1), ("healthy", None, False, 2)]
    assert gather.next[2].is_fallback and not gather.next[0].is_fallback
    assert pb.nodes["lower-alpha"].is_terminal


def test_graph_carries_nodes_and_edges() -> None:
    pb = load_playbook(GOOD / "looping.toml")
    g = pb.graph
    assert set(g.nodes) == set(pb.nodes)
    assert g.nodes["check"]["node"] is pb.nodes["check"]
    assert g.edges["check", "high"]["order"] == 0 and g.edges["check", "healthy"]["order"] == 1
    assert g.edges["check", "high"]["when"] == "alpha_high"
    assert g.edges["fix", "check"]["loop"] is True
    assert g.edges["fix", "check"]["edge"] is pb.nodes["fix"].next[0]
    assert pb.graph is g  # built once


def test_graph_keeps_parallel_edges(tmp_path: Path) -> None:
    text = (GOOD / "asking.toml").read_text().replace('to = "no-gamma"', 'to = "unsure"')
    text = text.replace('[nodes.no-gamma]', '[nodes.unused]')
    pb = load_playbook(write(tmp_path, "asking.toml", text))
    data = pb.graph.edges["ask", "unsure"]
    assert [e.label for e in data["parallel"]] == ["No", "Not sure"]
    assert data["edge"].label == "No"


def test_question_node_fields() -> None:
    ask = load_playbook(GOOD / "asking.toml").nodes["ask"]
    assert ask.question == "Did you install gamma yourself?" and ask.default == "unsure"
    assert [e.label for e in ask.next] == ["Yes", "No", "Not sure"]


def test_end_nodes() -> None:
    assert end_nodes(load_playbook(GOOD / "branching.toml")) == {"lower-alpha", "no-beta", "healthy"}
    assert end_nodes(load_playbook(GOOD / "looping.toml")) == {"healthy"}


# -- broken playbooks: one rule each ---------------------------------------------------------------
@pytest.mark.parametrize("path", BROKEN_FILES, ids=lambda p: p.stem)
def test_broken_fixture_reports_exactly_its_errors(path: Path) -> None:
    expected = expectations(path)
    assert expected, f"{path.name} states no expected errors"
    errors = lint_playbook(path, **VOCAB)
    for node, text in expected:
        assert any(e.node == node and text in e.message for e in errors), (node, text, errors)
    assert len(errors) == len(expected), [str(e) for e in errors]
    for e in errors:
        assert e.file == str(path)
        assert "\n" not in str(e)


def test_lint_error_format() -> None:
    assert str(LintError("pb.toml", "gather", "boom")) == "pb.toml:gather: boom"
    assert str(LintError("pb.toml", None, "boom")) == "pb.toml: boom"
    assert str(LintError("pb.toml", None, "bad", line=3, col=7)) == "pb.toml:3:7: bad"


def test_toml_syntax_error_has_position() -> None:
    path = BROKEN / "syntax.toml"
    [err] = lint_playbook(path, **VOCAB)
    assert (err.line, err.col) == (9, 9)
    assert str(err) == f"{path}:9:9: invalid TOML: Invalid value"
    with pytest.raises(InputError, match=re.escape(f"{path}:9:9: invalid TOML")):
        load_playbook(path)


def test_toml_error_at_end_of_document(tmp_path: Path) -> None:
    path = write(tmp_path, "eof.toml", 'id = "eof"\nlist = [1,\n  2,')
    [err] = lint_playbook(path, **VOCAB)
    assert (err.line, err.col) == (3, 5)
    assert "end of document" in err.message


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "absent.toml", "no such file"),
    (lambda d: d, "no playbooks (*.toml) in this directory"),
    (lambda d: (d / "bin.toml").write_bytes(b'id = "\xff\xfe"\n') and d / "bin.toml", "not UTF-8 text"),
])
def test_unreadable_input_is_one_lint_error(tmp_path: Path, make, message: str) -> None:
    path = make(tmp_path)
    [err] = lint_playbook(path, **VOCAB)
    assert message in err.message


def test_unreadable_file_raises_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="absent.toml: no such file"):
        load_playbook(tmp_path / "absent.toml")
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        load_playbook(tmp_path / "dir.toml")


def test_load_rejects_structure_and_counts_the_rest() -> None:
    with pytest.raises(InputError) as info:
        load_playbook(BROKEN / "wrong_types.toml")
    msg = str(info.value)
    assert msg.startswith(f"{BROKEN / 'wrong_types.toml'}: 'title' in the playbook must be a string")
    assert "(and 4 more; run `zdoctor playbooks lint`)" in msg
    with pytest.raises(InputError, match="edge to unknown node 'ghost'"):
        load_playbook(BROKEN / "unknown_target.toml")
    with pytest.raises(InputError, match="start node 'nowhere' is not defined"):
        load_playbook(BROKEN / "unknown_start.toml")


def test_load_leaves_graph_shape_and_vocabulary_to_lint() -> None:
    # Walkable though badly shaped: the loader accepts it, the linter does not.
    pb = load_playbook(BROKEN / "unreachable.toml")
    assert "orphan" in pb.nodes
    assert [e.node for e in lint_playbook(pb, **VOCAB)] == ["orphan"]


def test_lint_of_loaded_playbook_checks_vocabulary() -> None:
    pb = load_playbook(GOOD / "branching.toml")
    errors = lint_playbook(pb, probes=["alpha"], checks=[], predicates=["alpha_high"])
    assert sorted(e.message for e in errors) == [
        "edge to 'no-beta': unknown predicate 'beta_present'",
        "unknown check 'alpha_ok'",
    ]


def test_lint_directory_lints_each_file() -> None:
    assert lint_playbook(GOOD, **VOCAB) == []
    errors = lint_playbook(BROKEN, **VOCAB)
    assert {Path(e.file).name for e in errors} == {p.name for p in BROKEN_FILES}
    assert len(errors) == sum(len(expectations(p)) for p in BROKEN_FILES)


def test_lint_defaults_to_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "VOCABULARY_PACKAGES", ())
    monkeypatch.setattr(registry, "VOCABULARY_ROOTS", ())
    for kind, names in VOCAB.items():
        table = {"probes": registry.PROBES, "checks": registry.CHECKS, "predicates": registry.PREDICATES}[kind]
        for name in names:
            monkeypatch.setitem(table, name, object())
    assert lint_playbook(GOOD / "branching.toml") == []
    monkeypatch.delitem(registry.PREDICATES, "beta_present")
    [err] = lint_playbook(GOOD / "branching.toml")
    assert err.message == "edge to 'no-beta': unknown predicate 'beta_present'"


# -- finding playbooks -----------------------------------------------------------------------------
def test_load_all_and_find(tmp_path: Path) -> None:
    found = load_all([GOOD])
    assert list(found) == ["asking", "branching", "fragile", "looping"]
    assert all(isinstance(pb, Playbook) for pb in found.values())
    assert find_playbook("looping", [GOOD]).start == "check"
    with pytest.raises(InputError, match=r"no playbook named 'nope' \(known: asking, branching, fragile, looping\)"):
        find_playbook("nope", [GOOD])


def test_find_playbook_refuses_paths(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write(tmp_path, "secret.toml", (GOOD / "fragile.toml").read_text().replace('"fragile"', '"secret"'))
    with pytest.raises(InputError, match="no playbook named '../secret'"):
        find_playbook("../secret", [tmp_path / "sub"])


def test_load_all_rejects_duplicates_and_missing_dirs(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write(other, "fragile.toml", (GOOD / "fragile.toml").read_text())
    with pytest.raises(InputError, match="playbook id 'fragile' is already defined"):
        load_all([GOOD, other])
    with pytest.raises(InputError, match="not a directory of playbooks"):
        load_all([tmp_path / "missing"])
    with pytest.raises(InputError, match="bad_node_id.toml:'a b': node id"):
        load_all([BROKEN])


def test_load_all_defaults_to_bundled_playbooks(monkeypatch: pytest.MonkeyPatch) -> None:
    from zdoctor.core import resources

    asked = []

    def fake_data_dir(name: str) -> Path:
        asked.append(name)
        return GOOD

    monkeypatch.setattr(resources, "data_dir", fake_data_dir)
    assert list(load_all()) == ["asking", "branching", "fragile", "looping"]
    assert find_playbook("asking").id == "asking"
    assert asked == ["playbooks", "playbooks"]


def test_networkx_is_not_imported_until_a_graph_is_needed() -> None:
    code = f"""
import json, sys
from zdoctor.walk.playbook import load_playbook
from zdoctor.walk.engine import Walk
from zdoctor.host import ReplayHost
pb = load_playbook({str(GOOD / 'fragile.toml')!r})
host = ReplayHost({{"format": "zdoctor-snapshot", "version": 1, "probes": {{}}}})
res = Walk(pb, host).run()
before = "networkx" in sys.modules
pb.graph
print(json.dumps([res.path, before, "networkx" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert json.loads(out.stdout) == [["gather", "healthy"], False, True]


def test_lint_path_uses_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "VOCABULARY_PACKAGES", ())
    monkeypatch.setattr(registry, "VOCABULARY_ROOTS", ())
    monkeypatch.setitem(registry.PROBES, "alpha", object())
    errors = lint_path(GOOD / "looping.toml")
    assert [str(e) for e in errors] == [
        f"{GOOD / 'looping.toml'}:check: edge to 'high': unknown predicate 'alpha_high'"]


def test_describe_outlines_nodes_and_edges() -> None:
    text = describe(load_playbook(GOOD / "asking.toml"))
    assert text.splitlines()[:3] == [
        "asking: A question with a default",
        "  Asks the user; a predicate can answer for them, otherwise the default answer is taken headless.",
        "start: ask",
    ]
    assert '    -> has-gamma when has_gamma "Yes"' in text
    assert '    -> unsure (answer) "Not sure" (default)' in text
    text = describe(load_playbook(GOOD / "branching.toml"))
    assert '    -> no-beta unless beta_present "beta is missing"' in text
    assert "    -> healthy (fallback)" in text and "    checks: alpha_ok" in text
    assert '    -> check (fallback) "check again" (loop)' in describe(load_playbook(GOOD / "looping.toml"))


def test_lint_of_loaded_playbook_checks_its_id(tmp_path: Path) -> None:
    pb = load_playbook(GOOD / "fragile.toml")
    pb.path = tmp_path / "renamed.toml"
    [err] = lint_playbook(pb, **VOCAB)
    assert err.message == "id 'fragile' does not match the file name (expected 'renamed')"


def test_bundled_playbooks_use_the_three_state_wording_of_remedies() -> None:
    """The step texts say "tried: fixed / tried: did not fix / not tried, because ...", never the wording
    from before (a remedy "marked verified", "verification failed"), nor that zdoctor tries every fix."""
    from zdoctor.walk.playbook import load_all

    stale = re.compile(r"marked verified|verification failed|tries each one before offering", re.I)
    for pid, book in load_all().items():
        for node in book.nodes.values():
            for text in (node.title, node.why, node.explain):
                assert not stale.search(text or ""), (pid, node.id, text)
    verify = load_all()["zero3-launch"].nodes["verify"]
    assert '"tried: fixed"' in verify.explain and '"not tried, because ..."' in verify.explain
