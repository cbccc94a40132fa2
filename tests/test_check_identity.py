"""A check's identity comes from its declaration: its function never restates its own id, and every finding
that says a check could not look carries the declared title."""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from pathlib import Path

import pytest

from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import CHECKS, Concluded, Facts, check, load_vocabulary
from zdoctor.host.replay import ReplayHost
from zdoctor.layers import evaluate_check, probes_for

load_vocabulary()

SNAPSHOTS = sorted((Path(__file__).parent / "fixtures" / "snapshots").glob("*.json"))


def _own_id_literals(name: str, func: ast.FunctionDef) -> list[str]:
    """The string literals in the body of ``func`` that spell check ``name``'s id or one below it."""
    body = ast.Module(body=func.body, type_ignores=[])
    return [n.value for n in ast.walk(body) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and (n.value == name or n.value.startswith(name + "."))]


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_no_check_restates_its_own_id(name: str):
    func = inspect.unwrap(CHECKS[name].func)
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert not _own_id_literals(name, node), f"check {name} spells its own id; use me.name / me.id(...)"


def test_the_scan_sees_a_restated_id():
    """The scan above would catch a check that spells its id (so its silence means something)."""
    src = textwrap.dedent('''
        def check_x(facts, me):
            return [Finding(id="demo.x.sub", status="ok", title="t")]
    ''')
    [node] = ast.parse(src).body
    assert isinstance(node, ast.FunctionDef)
    assert _own_id_literals("demo.x", node) == ["demo.x.sub"]


def test_check_modules_make_not_checked_findings_only_through_the_declaration():
    """No check module calls the bare ``not_checked(fid, title, ...)``: the id and title come from ``me``."""
    folder = Path(inspect.getfile(evaluate_check)).parent
    offenders = [f"{p.name}:{n}" for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"(?<![.\w])not_checked\(", line)]
    assert not offenders


def test_a_check_receives_its_declaration():
    seen = []

    @check("identity-demo.check", title="A demonstration", probes=("demo",), findings=("identity-demo.check.part",))
    def check_demo(facts: Facts, me) -> list:
        seen.append(me)
        return [me.finding("ok", detail="looked"), me.finding("warn", "Part", sub="part"),
                me.not_checked("no demo facts"), me.not_checked("no part", sub="part", part="the part")]

    try:
        ok, part, skipped, part_skipped = check_demo(Facts({}))
        assert seen == [CHECKS["identity-demo.check"]]
        assert (ok.id, ok.status, ok.title, ok.detail) == ("identity-demo.check", "ok", "A demonstration", "looked")
        assert (part.id, part.title) == ("identity-demo.check.part", "Part")
        assert (skipped.id, skipped.status, skipped.title, skipped.detail) == (
            "identity-demo.check", "skip", "A demonstration: not checked", "no demo facts")
        assert (part_skipped.id, part_skipped.title) == ("identity-demo.check.part",
                                                         "A demonstration (the part): not checked")
    finally:
        del CHECKS["identity-demo.check"]


def test_a_check_that_requires_a_missing_record_ends_with_its_not_checked_finding():
    reached = []

    @check("identity-demo.require", title="A demonstration", probes=("demo",))
    def check_demo(facts: Facts, me) -> list:
        record = me.require(facts.of("demo"), "the demo probe did not run", sub="not-checked")
        reached.append(record)
        return [me.finding("ok", detail=str(record))]

    @check("identity-demo.early", title="Another", probes=("demo",))
    def check_early(facts: Facts, me) -> list:
        raise Concluded(me.finding("ok", "Nothing to judge"), me.finding("warn", "And a doubt", sub="doubt"))

    try:
        [skipped] = check_demo(Facts({}))
        assert reached == []  # nothing after require ran
        assert (skipped.id, skipped.status, skipped.title, skipped.detail) == (
            "identity-demo.require.not-checked", "skip", "A demonstration: not checked", "the demo probe did not run")
        [ok] = check_demo(Facts({"demo": ProbeResult("demo", facts={"x": 1})}))
        assert (ok.status, ok.detail, reached) == ("ok", "{'x': 1}", [{"x": 1}])
        assert [(f.id, f.title) for f in check_early(Facts({}))] == [
            ("identity-demo.early", "Nothing to judge"), ("identity-demo.early.doubt", "And a doubt")]
    finally:
        del CHECKS["identity-demo.require"], CHECKS["identity-demo.early"]


def _allowed_not_checked_title(title: str, declared: str) -> bool:
    """``DECLARED: not checked``, or ``DECLARED (PART): not checked`` for a part of the check."""
    return title == f"{declared}: not checked" or (title.startswith(f"{declared} (")
                                                     and title.endswith("): not checked"))


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.name)
def test_every_not_checked_title_is_the_declared_title(snapshot: Path):
    """Replaying the recorded snapshot, and the same with no facts at all, every check's "not checked" finding
    carries its declared title."""
    host = ReplayHost(json.loads(snapshot.read_text()), source=str(snapshot))
    facts = host.results(probes_for(CHECKS))
    empty = Facts({})
    seen = 0
    for name, spec in CHECKS.items():
        for found in (evaluate_check(name, facts), evaluate_check(name, empty)):
            for f in found:
                if f.title.endswith(": not checked"):
                    seen += 1
                    assert _allowed_not_checked_title(f.title, spec.title), (name, f.id, f.title)
    assert seen > len(CHECKS)
