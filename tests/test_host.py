"""Probes run concurrently with timeouts; crashes are isolated; a snapshot replays the same findings."""

from __future__ import annotations

import json
import threading
import time

import pytest

from zdoctor.core import registry
from zdoctor.core.errors import InputError
from zdoctor.core.model import Evidence, Finding
from zdoctor.core.registry import Facts
from zdoctor.host import LiveHost, ReplayHost, snapshot_document
from zdoctor.layers import evaluate_check, run_checks
from zdoctor.walk.doctor import check, snapshot


@pytest.fixture
def test_vocabulary():
    """Register a few test probes and checks, and remove them afterwards (the real vocabulary is loaded first,
    so that putting it back leaves it whole for the tests that follow in this process)."""
    registry.load_vocabulary()
    before = (dict(registry.PROBES), dict(registry.CHECKS))
    calls = {"slow": 0, "spans": {}}

    @registry.probe("t.ok", title="fine", timeout=5)
    def ok_probe(host):
        return {"value": 42}, [Evidence.note("n", "forty-two")]

    @registry.probe("t.boom", title="raises", timeout=5)
    def boom(host):
        raise RuntimeError("probe exploded")

    @registry.probe("t.hang", title="hangs", timeout=0.5)
    def hang(host):
        time.sleep(30)
        return {}, []

    @registry.probe("t.slow", title="slow", timeout=5)
    def slow(host):
        calls["slow"] += 1
        start = time.monotonic()
        time.sleep(0.6)
        calls["spans"]["t.slow"] = (start, time.monotonic())
        return {"thread": threading.current_thread().name}, []

    @registry.probe("t.slow2", title="slow too", timeout=5)
    def slow2(host):
        start = time.monotonic()
        time.sleep(0.6)
        calls["spans"]["t.slow2"] = (start, time.monotonic())
        return {}, []

    @registry.check("t.value", title="value check", probes=("t.ok",))
    def value_check(facts: Facts, me: registry.CheckSpec):
        v = (facts.of("t.ok") or {}).get("value")
        return [Finding("t.value", "ok" if v == 42 else "fail", f"value is {v}")]

    @registry.check("t.broken", title="broken check", probes=("t.ok",))
    def broken_check(facts: Facts, me: registry.CheckSpec):
        return [Finding("t.broken", "ok", str(1 / 0))]

    @registry.check("t.needs-boom", title="needs the crashing probe", probes=("t.boom",))
    def needs_boom(facts: Facts, me: registry.CheckSpec):
        return [Finding("t.needs-boom", "ok", "unreachable")]

    yield calls
    registry.PROBES.clear()
    registry.PROBES.update(before[0])
    registry.CHECKS.clear()
    registry.CHECKS.update(before[1])


def test_crashing_probe_becomes_a_crash_result_with_traceback(test_vocabulary):
    res = LiveHost().result("t.boom")
    assert res.status == "crash"
    assert res.error == "RuntimeError: probe exploded"
    assert "Traceback" in res.evidence[0].stdout and "probe exploded" in res.evidence[0].stdout


def test_hanging_probe_is_abandoned_at_its_budget(test_vocabulary):
    t0 = time.monotonic()
    res = LiveHost().result("t.hang")
    assert time.monotonic() - t0 < 3
    assert res.status == "timeout" and "0.5s budget" in res.error


def test_probes_run_concurrently_and_once(test_vocabulary):
    host = LiveHost()
    facts = host.results(["t.slow", "t.slow2", "t.slow"])
    (a0, a1), (b0, b1) = test_vocabulary["spans"]["t.slow"], test_vocabulary["spans"]["t.slow2"]
    assert a0 < b1 and b0 < a1  # the two 0.6 s probes ran side by side, whatever the machine's load
    assert set(facts) == {"t.slow", "t.slow2"}
    host.results(["t.slow"])
    assert test_vocabulary["slow"] == 1


def test_crash_isolation_in_checks(test_vocabulary):
    host = LiveHost()
    facts, findings = run_checks(host, ["t.value", "t.broken", "t.needs-boom"])
    by_id = {f.id: f for f in findings}
    assert by_id["t.value"].status == "ok"
    assert by_id["t.broken.crash"].status == "crash"
    assert "ZeroDivisionError" in by_id["t.broken.crash"].detail
    assert "Traceback" in by_id["t.broken.crash"].evidence[0].stdout
    assert by_id["probe.t.boom"].status == "crash"
    assert by_id["t.needs-boom.not-checked"].status == "skip"


def test_check_exit_code_counts_crashes(test_vocabulary):
    from zdoctor.proc.target import Target

    host = LiveHost(target=Target.of(command="true"))  # the training (a command) was examined: not incomplete
    facts = host.results(["t.ok"])
    assert evaluate_check("t.value", facts)[0].status == "ok"
    report = check(host, walk=False)
    assert report.exit_code == 1  # the crashing probe and check


def test_replay_equals_live(test_vocabulary):
    live = LiveHost()
    live_report = check(live, walk=False)
    doc = json.loads(json.dumps(snapshot_document(live)))
    replay_report = check(ReplayHost(doc), walk=False)
    assert [f.to_dict() for f in replay_report.findings] == [f.to_dict() for f in live_report.findings]


def test_snapshot_records_every_registered_probe(test_vocabulary):
    doc = snapshot(LiveHost())
    assert set(registry.PROBES) <= set(doc["probes"])
    assert doc["probes"]["t.ok"]["facts"] == {"value": 42}
    assert doc["probes"]["t.boom"]["status"] == "crash"


def test_replay_of_a_probe_missing_from_the_snapshot_is_a_skip():
    doc = {"format": "zdoctor-snapshot", "version": 1, "host": {}, "probes": {}}
    assert ReplayHost(doc).result("system").status == "skip"


@pytest.mark.parametrize("content, message", [
    ("{", "malformed JSON"),
    ("[]", "not a zdoctor snapshot"),
    ('{"format": "zdoctor-snapshot", "version": 99, "probes": {}}', "version 99"),
])
def test_bad_snapshots_are_input_errors(tmp_path, content, message):
    p = tmp_path / "snap.json"
    p.write_text(content)
    with pytest.raises(InputError, match=message):
        ReplayHost.load(str(p))


def test_unreadable_snapshot(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        ReplayHost.load(str(tmp_path / "missing.json"))
    with pytest.raises(InputError, match="is a directory"):
        ReplayHost.load(str(tmp_path))


def test_forget_probes_again_on_a_live_host(test_vocabulary):
    host = LiveHost()
    host.result("t.slow")
    host.forget(["t.slow"])
    host.result("t.slow")
    assert test_vocabulary["slow"] == 2
