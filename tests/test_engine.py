"""The engine: walking playbooks over facts, recording every step, resuming from the record."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from zdoctor.core import registry
from zdoctor.core.errors import InputError
from zdoctor.core.model import Finding
from zdoctor.host import LiveHost, ReplayHost
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_playbook

FIXTURES = Path(__file__).parent / "fixtures" / "playbooks"
GOOD = FIXTURES / "good"


def _alpha_ok(facts: registry.Facts) -> list[Finding]:
    value = (facts.of("alpha") or {}).get("value", 0)
    return [Finding(id="alpha.level", status="fail" if value > 10 else "ok", title=f"alpha is {value}")]


def _boom(facts: registry.Facts) -> bool:
    raise RuntimeError("boom exploded")


@pytest.fixture(autouse=True)
def vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-only probes, checks and predicates; monkeypatch removes them afterwards."""
    preds = {
        "alpha_high": (lambda f: (f.of("alpha") or {}).get("value", 0) > 10, ("alpha",)),
        "beta_present": (lambda f: (f.of("beta") or {}).get("present", False), ("beta",)),
        "has_gamma": (lambda f: (f.of("gamma") or {}).get("installed") is True, ("gamma",)),
        "boom": (_boom, ("alpha",)),
    }
    for name, (func, probes) in preds.items():
        monkeypatch.setitem(registry.PREDICATES, name, registry.PredicateSpec(name, func, name, probes))
    monkeypatch.setitem(registry.CHECKS, "alpha_ok",
                        registry.CheckSpec("alpha_ok", _alpha_ok, "Alpha level", ("alpha",)))


def replay(**probes: dict[str, Any]) -> ReplayHost:
    """A host answering from a snapshot holding the given facts per probe."""
    return ReplayHost({"format": "zdoctor-snapshot", "version": 1,
                       "probes": {n: {"probe": n, "facts": f} for n, f in probes.items()}})


class Recorder(list):
    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        json.dumps(data)  # every event must be plain JSON data
        self.append((kind, data))

    def kinds(self) -> list[str]:
        return [k for k, _ in self]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for k, d in self if k == kind]


def pb(name: str):
    return load_playbook(GOOD / f"{name}.toml")


# -- branching -------------------------------------------------------------------------------------
def test_predicate_true_takes_its_edge() -> None:
    rec = Recorder()
    res = Walk(pb("branching"), replay(alpha={"value": 20}, beta={"present": True}), rec).run()
    assert res.path == ["gather", "too-high", "lower-alpha"]
    assert res.diagnosis == "too-high" and res.stopped is None
    # the diagnosis lists no check, so the failing finding met on the way is named with the end
    assert res.reason == ("reached remedy lower-alpha: Lower alpha; also failing on the way: alpha.level "
                          "(alpha is 20, at step gather)")
    assert res.failing_on_path == [{"id": "alpha.level", "title": "alpha is 20", "status": "fail", "node": "gather"}]
    assert rec.of("edge")[0]["reason"] == "predicate alpha_high is true"
    assert [(f.id, f.status) for f in res.findings] == [("alpha.level", "fail")]


def test_negated_predicate_takes_edge_when_false() -> None:
    rec = Recorder()
    res = Walk(pb("branching"), replay(alpha={"value": 1}, beta={"present": False}), rec).run()
    assert res.path == ["gather", "no-beta"] and res.diagnosis == "no-beta"
    edge = rec.of("edge")[0]
    assert (edge["predicate"], edge["negate"], edge["reason"]) == ("beta_present", True,
                                                                   "predicate beta_present is false")


def test_fallback_when_no_predicate_holds() -> None:
    walk = Walk(pb("branching"), replay(alpha={"value": 1}, beta={"present": True}))
    out = walk.evaluate()
    assert (out.chosen.to, out.reason) == ("healthy", "fallback")
    assert [(c.edge.to, c.value, c.holds) for c in out.candidates] == [
        ("too-high", False, False), ("no-beta", True, False), ("healthy", None, None)]
    assert set(out.facts) == {"alpha", "beta"}
    assert walk.run().diagnosis == "healthy"


def test_missing_probe_is_a_skip_and_predicates_see_defaults() -> None:
    out = Walk(pb("branching"), replay(alpha={"value": 3})).evaluate()
    assert out.facts["beta"].status == "skip"
    assert out.chosen.to == "no-beta"  # beta_present defaults to false


# -- questions -------------------------------------------------------------------------------------
def test_question_takes_default_headless() -> None:
    rec = Recorder()
    res = Walk(pb("asking"), replay(gamma={"installed": False}), rec).run()
    assert res.path == ["ask", "unsure"]
    assert rec.of("edge")[0]["reason"] == "question default"


def test_question_predicate_answers_first() -> None:
    rec = Recorder()
    res = Walk(pb("asking"), replay(gamma={"installed": True}), rec).run()
    assert res.path == ["ask", "has-gamma"]
    assert rec.of("edge")[0]["reason"] == "predicate has_gamma is true"


def test_user_answer_is_recorded_without_override() -> None:
    rec = Recorder()
    walk = Walk(pb("asking"), replay(), rec)
    out = walk.evaluate()
    assert [c.edge.label for c in out.candidates] == ["Yes", "No", "Not sure"]
    walk.answer("no-gamma")
    assert walk.current == "no-gamma" and walk.diagnosis == "no-gamma"
    edge = rec.of("edge")[0]
    assert (edge["to"], edge["reason"], edge["override"]) == ("no-gamma", "answer: No", False)
    with pytest.raises(ValueError, match="not a question"):
        walk.answer("unsure")


def test_answer_must_be_an_edge() -> None:
    walk = Walk(pb("asking"), replay())
    with pytest.raises(ValueError, match=r"'healthy' is not a next step of 'ask' \(choices: has-gamma, no-gamma"):
        walk.answer("healthy")
    assert walk.current == "ask" and not walk.done


# -- overrides -------------------------------------------------------------------------------------
def test_user_override_is_recorded() -> None:
    rec = Recorder()
    walk = Walk(pb("branching"), replay(alpha={"value": 20}, beta={"present": True}), rec)
    assert walk.evaluate().chosen.to == "too-high"
    walk.advance("healthy")
    edge = rec.of("edge")[-1]
    assert edge["override"] is True
    assert edge["reason"] == "user chose healthy over too-high (predicate alpha_high is true)"
    assert walk.path == ["gather", "healthy"]
    walk.advance()
    assert walk.done and walk.diagnosis == "healthy"


def test_explicit_pick_of_the_chosen_edge_is_no_override() -> None:
    rec = Recorder()
    walk = Walk(pb("branching"), replay(alpha={"value": 20}, beta={"present": True}), rec)
    walk.advance("too-high")
    assert rec.of("edge")[0]["override"] is False
    with pytest.raises(ValueError, match="not a next step"):
        walk.advance("gather")


# -- loops and bounds ------------------------------------------------------------------------------
def test_loop_bound_stops_the_walk() -> None:
    rec = Recorder()
    res = Walk(pb("looping"), replay(alpha={"value": 20}), rec).run()
    assert res.path == ["check", "high", "fix"] * 3
    assert res.stopped == "loop" and res.diagnosis == "high"
    assert "check would be visited 4 times (limit 3)" in res.reason
    assert rec.of("playbook_end")[0]["reason"] == res.reason
    assert len(rec.of("probe_result")) == 1  # each probe once per walk
    # The stop itself takes no edge: fix -> check was followed twice, not three times.
    assert [e["to"] for e in rec.of("edge")].count("check") == 2 and rec.of("edge")[-1]["to"] == "fix"


def test_max_visits_is_configurable() -> None:
    res = Walk(pb("looping"), replay(alpha={"value": 20}), max_visits=1).run()
    assert res.path == ["check", "high", "fix"] and res.stopped == "loop"
    with pytest.raises(ValueError):
        Walk(pb("looping"), replay(), max_visits=0)


def test_loop_leaves_once_facts_change() -> None:
    rec = Recorder()
    walk = Walk(pb("looping"), replay(alpha={"value": 20}), rec)
    for _ in range(3):
        walk.step()
    assert walk.current == "check"
    # The fix worked: facts measured afresh are recorded again and change the way.
    walk.host = replay(alpha={"value": 5})
    res = walk.run()
    assert res.path == ["check", "high", "fix", "check", "healthy"]
    assert res.diagnosis == "healthy" and res.stopped is None
    assert [d["result"]["facts"]["value"] for d in rec.of("probe_result")] == [20, 5]
    assert [(f.id, f.status) for f in res.findings] == []


# -- failures inside the vocabulary ----------------------------------------------------------------
def test_raising_predicate_counts_as_false() -> None:
    rec = Recorder()
    walk = Walk(pb("fragile"), replay(alpha={"value": 1}), rec)
    out = walk.evaluate()
    boom = out.candidates[0]
    assert (boom.value, boom.holds) == (False, False)
    assert boom.error == "RuntimeError: boom exploded"
    assert out.chosen.to == "healthy"
    assert out.reason == "fallback; predicate boom failed (RuntimeError: boom exploded); counted as false"
    res = walk.run()
    assert res.diagnosis == "healthy"
    assert "boom exploded" in rec.of("edge")[0]["reason"]


def test_unknown_predicate_and_check_do_not_crash(tmp_path: Path) -> None:
    text = (GOOD / "branching.toml").read_text()
    text = text.replace('"alpha_high"', '"not_registered"').replace('["alpha_ok"]', '["no_such_check"]')
    path = tmp_path / "branching.toml"
    path.write_text(text)
    out = Walk(load_playbook(path), replay(alpha={"value": 20}, beta={"present": True})).evaluate()
    assert out.candidates[0].error == "unknown predicate 'not_registered'"
    assert out.chosen.to == "healthy"
    assert [(f.id, f.status) for f in out.findings] == [("no_such_check.unknown", "crash")]


def test_no_applicable_edge_stops_with_reason() -> None:
    walk = Walk(load_playbook(FIXTURES / "broken" / "no_fallback.toml"), replay(alpha={"value": 1}))
    res = walk.run()
    assert res.path == ["a"] and res.stopped == "no-edge" and res.diagnosis is None
    assert res.reason == "stuck at a: no edge applies: predicate alpha_high is false"


def test_probes_run_concurrently_on_a_live_host(monkeypatch: pytest.MonkeyPatch) -> None:
    barrier = threading.Barrier(2, timeout=5)

    def meet(host):
        barrier.wait()  # only passes when both probes run at the same time
        return {"value": 20}, []

    def crash(host):
        raise OSError("disk on fire")

    monkeypatch.setitem(registry.PROBES, "alpha", registry.ProbeSpec("alpha", meet, "Alpha", 10, ()))
    monkeypatch.setitem(registry.PROBES, "beta", registry.ProbeSpec("beta", meet, "Beta", 10, ()))
    out = Walk(pb("branching"), LiveHost()).evaluate()
    assert {n: r.status for n, r in out.facts.items()} == {"alpha": "ok", "beta": "ok"}
    assert out.chosen.to == "too-high"

    monkeypatch.setitem(registry.PROBES, "alpha", registry.ProbeSpec("alpha", crash, "Alpha", 10, ()))
    monkeypatch.setitem(registry.PROBES, "beta", registry.ProbeSpec("beta", lambda h: ({}, []), "Beta", 10, ()))
    out = Walk(pb("branching"), LiveHost()).evaluate()
    assert [(f.id, f.status) for f in out.findings] == [("probe.alpha", "crash"), ("alpha_ok.not-checked", "skip")]
    assert out.chosen.to == "no-beta"


# -- events and resume -----------------------------------------------------------------------------
def test_events_are_emitted_in_order() -> None:
    rec = Recorder()
    Walk(pb("branching"), replay(alpha={"value": 1}, beta={"present": False}), rec).run()
    assert rec.kinds() == ["playbook_start", "node_enter", "probe_result", "probe_result", "finding",
                           "edge", "node_enter", "diagnosis", "playbook_end"]
    start, enter, alpha, beta, finding, edge, enter2, diag, end = (d for _, d in rec)
    assert start == {"playbook": "branching", "title": "Branching on probe facts", "start": "gather"}
    assert enter == {"playbook": "branching", "node": "gather", "kind": "probe", "title": "Gather alpha"}
    assert (alpha["node"], alpha["result"]["probe"], beta["result"]["probe"]) == ("gather", "alpha", "beta")
    assert finding["finding"]["id"] == "alpha.level" and finding["node"] == "gather"
    assert edge == {"playbook": "branching", "from": "gather", "to": "no-beta", "predicate": "beta_present",
                    "negate": True, "reason": "predicate beta_present is false", "override": False}
    assert diag == {"playbook": "branching", "node": "no-beta", "title": "Beta is missing"}
    assert end == {"playbook": "branching", "path": ["gather", "no-beta"], "diagnosis": "no-beta",
                   "reason": "reached diagnosis no-beta: Beta is missing"}


def test_evaluate_is_cached_per_visit() -> None:
    rec = Recorder()
    walk = Walk(pb("branching"), replay(alpha={"value": 1}, beta={"present": True}), rec)
    assert walk.evaluate() is walk.evaluate()
    assert rec.kinds().count("finding") == 1
    walk.run()
    with pytest.raises(RuntimeError, match="finished"):
        walk.evaluate()


def test_stop_ends_the_walk() -> None:
    rec = Recorder()
    walk = Walk(pb("looping"), replay(alpha={"value": 20}), rec)
    walk.step()
    walk.stop()
    walk.stop()
    assert walk.done and rec.of("playbook_end") == [
        {"playbook": "looping", "path": ["check", "high"], "diagnosis": "high", "reason": "stopped by the user"}]
    assert walk.result().stopped == "user"


@pytest.mark.parametrize("shape", ["pairs", "json-dicts", "inline-dicts"])
def test_resume_lands_on_the_same_node(shape: str) -> None:
    facts = {"alpha": {"value": 20}}
    rec = Recorder()
    walk = Walk(pb("looping"), replay(**facts), rec)
    for _ in range(4):
        walk.step()
    assert walk.path == ["check", "high", "fix", "check", "high"]
    if shape == "pairs":
        events: list[Any] = list(rec)
    elif shape == "json-dicts":
        events = json.loads(json.dumps([{"type": k, "data": d} for k, d in rec]))
    else:
        events = [{"type": k, **d} for k, d in rec]
    rec2 = Recorder()
    again = Walk.resume(pb("looping"), replay(**facts), events, record=rec2)
    assert (again.current, again.path, again.diagnosis, again.done) == (walk.current, walk.path, "high", False)
    assert rec2 == []  # resuming records nothing by itself
    assert again.run().path == walk.run().path
    assert rec2.kinds()[-1] == "playbook_end"


def test_resume_of_a_finished_walk_and_of_a_restart() -> None:
    rec = Recorder()
    Walk(pb("branching"), replay(alpha={"value": 1}, beta={"present": False}), rec).run()
    done = Walk.resume(pb("branching"), replay(), rec)
    assert done.done and done.diagnosis == "no-beta" and done.end_reason.startswith("reached diagnosis")
    Walk(pb("branching"), replay(alpha={"value": 20}, beta={"present": True}), rec).step()
    again = Walk.resume(pb("branching"), replay(), rec)  # only the latest start counts
    assert (again.path, again.done, again.diagnosis) == (["gather", "too-high"], False, "too-high")


def test_resume_rejects_foreign_records() -> None:
    with pytest.raises(InputError, match="no recorded walk of playbook looping"):
        Walk.resume(pb("looping"), replay(), [("playbook_start", {"playbook": "other"}), "junk"])
    events = [("playbook_start", {"playbook": "looping"}), ("node_enter", {"playbook": "looping", "node": "gone"})]
    with pytest.raises(InputError, match="recorded node 'gone' is not in playbook looping"):
        Walk.resume(pb("looping"), replay(), events)


def test_resume_after_a_lost_first_step_starts_at_start() -> None:
    rec = Recorder()
    walk = Walk.resume(pb("looping"), replay(), [("playbook_start", {"playbook": "looping"})], record=rec)
    assert walk.path == ["check"] and rec.kinds() == ["node_enter"]
