"""Seeded mutation runs: recorded snapshots and session logs with one field of the wrong type are read as
one finding (a snapshot) or one skipped line (a session), never a traceback anywhere; deeply nested TOML
is a lint error, not a RecursionError. Checks and exports run in-process to keep this fast."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, run_cli

from zdoctor.core.errors import ZdoctorError
from zdoctor.core.registry import Facts
from zdoctor.host import ReplayHost
from zdoctor.layers import probe_findings
from zdoctor.report import export
from zdoctor.walk.doctor import check
from zdoctor.walk.session import load_events

#: Values of every JSON type; a mutation puts one of another type than the field's.
WRONG = [None, 0, -1, 10**30, 1.5, "x", "", [], {}, True, [1, "a"], {"a": 1}, [None], {"": None}]
RUNS = 300


def _paths(obj: Any, pre: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield pre
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*pre, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            yield from _paths(v, (*pre, i))


def _mutate(obj: Any, rng: random.Random) -> tuple[Any, tuple[Any, ...]]:
    """A copy of ``obj`` with the value at one random path replaced by one of another type."""
    obj = copy.deepcopy(obj)
    path = rng.choice(list(_paths(obj))[1:])
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = rng.choice([v for v in WRONG if type(v) is not type(parent[path[-1]])])
    return obj, path


def _tracebacks(doc: Any) -> bool:
    return "Traceback (most recent call last)" in json.dumps(doc)


def test_mutated_snapshots_give_findings_never_tracebacks():
    doc = json.loads((FIXTURES / "snapshots" / "healthy.json").read_text())
    rng = random.Random(20261201)
    malformed = 0
    for i in range(RUNS):
        name = rng.choice(sorted(doc["probes"]))
        record, path = _mutate(doc["probes"][name], rng)
        mutated = {**doc, "probes": {**doc["probes"], name: record}}
        report = check(ReplayHost(mutated), walk=i % 5 == 0)
        found = [f.to_dict() for f in report.findings]
        crashed = [f["id"] for f in found if f["status"] == "crash" or _tracebacks(f)]
        assert not crashed, f"run {i}: {name}{list(path)} made {crashed} crash"
        flagged = [f for f in found if f["id"] == f"probe.{name}" and "malformed" in f["title"]]
        assert len(flagged) <= 1
        malformed += bool(flagged)
    assert malformed >= RUNS // 4, "the type check caught almost nothing"


def test_a_malformed_probe_record_is_one_finding_not_an_error():
    host = ReplayHost({"format": "zdoctor-snapshot", "version": 1, "probes": {"jitprereq": {"facts": 1}}})
    res = host.result("jitprereq")
    assert res.status == "crash"
    assert res.error == "the recorded result is malformed: jitprereq.facts is number, expected object"
    (f,) = probe_findings(Facts({"jitprereq": res}))
    assert f.status == "warn" and "malformed" in f.title and "Traceback" not in f.detail


def test_one_wrong_typed_finding_field_no_longer_breaks_every_export(tmp_path: Path):
    events = [json.loads(line) for line in
              (FIXTURES / "sessions" / "20261201T130416-d9aa.jsonl").read_text().splitlines() if line.strip()]
    at = next(i for i, e in enumerate(events) if e["type"] == "finding")
    events[at]["finding"]["status"] = ["fail"]
    log = tmp_path / "s.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    read = load_events(log)
    assert len(read) == len(events) - 1
    assert read.skipped == [(at + 1, "malformed event: finding event of the wrong shape: finding.status is "
                                     "['fail'], expected one of crash, fail, ok, skip, warn")]
    for fmt in ("md", "html", "json"):
        text = export.render(read, fmt)
        assert "skipped" in text or fmt == "json"


def test_mutated_session_logs_export_without_a_traceback(tmp_path: Path):
    logs = [[json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            for p in sorted((FIXTURES / "sessions").glob("*.jsonl"))]
    rng = random.Random(1201)
    log = tmp_path / "s.jsonl"
    for i in range(RUNS):
        events = rng.choice(logs)
        at = rng.randrange(len(events))
        mutated, _path = _mutate({"e": events[at]}, rng)
        changed = [*events[:at], mutated["e"], *events[at + 1:]]
        log.write_text("".join(json.dumps(e) + "\n" for e in changed))
        fmt = ("md", "html", "json")[i % 3]
        try:  # anything but a one-line error (no readable event at all) fails the test
            text = export.render(load_events(log), fmt)
        except ZdoctorError:
            continue
        assert text.strip()


@pytest.mark.parametrize("toml", [
    "id = 'x'\nnodes = " + "[" * 5000 + "]" * 5000 + "\n",
    "id = 'x'\nt = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
])
def test_deeply_nested_toml_is_a_lint_error(tmp_path: Path, toml: str):
    book = tmp_path / "deep.toml"
    book.write_text(toml)
    r = run_cli(["playbooks", "lint", str(book)])
    assert r.returncode != 0 and "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert f"{book}: nested too deeply to read" in r.stdout + r.stderr
