"""A late probe is never the node's failure: a probe that ran out of time is "not examined" with the node's
load, its budget stretches on a node busier than its CPUs, and a walk concludes a hang only from a wait
(a process sleeping or stuck), never from zdoctor's own time limit. The slow interpreter is real: it works
on a CPU for half a minute before it starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli

from zdoctor.core import registry
from zdoctor.core.registry import Facts
from zdoctor.host import LiveHost
from zdoctor.layers import evaluate_check, probe_findings
from zdoctor.layers.libraries.check_libs import hang_evidence
from zdoctor.proc.nodeload import MAX_STRETCH, budget_stretch, node_load


def test_a_budget_stretches_with_the_load_per_cpu_within_a_bound():
    assert budget_stretch(None, 2) == 1.0  # the load unknown: the budget as it is
    assert budget_stretch(1.5, 2) == 1.0
    assert budget_stretch(6.0, 2) == 3.0
    assert budget_stretch(40.0, 2) == MAX_STRETCH
    load, cpus = node_load()
    assert cpus >= 1 and (load is None or load >= 0)


def test_zdoctors_own_limits_stretch_with_the_load_and_the_users_never_do(monkeypatch):
    from zdoctor.proc.target import Target

    cpus = node_load()[1]
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus * 3.0, 0.0, 0.0))  # a node three times busier than its CPUs
    assert Target.of().limit(120) == 360.0  # zdoctor's budget: the run is given the time the node can give it
    assert Target.of(timeout=5).limit(120) == 5.0  # the user's --timeout is theirs: a hang past it is a hang
    # a trial that needs a part of the run: the user's limit, within zdoctor's stretched budget for it
    assert Target.of(timeout=500).limit(120, capped=True) == 360.0
    assert Target.of(timeout=5).limit(120, capped=True) == 5.0 and Target.of().limit(120, capped=True) == 360.0
    monkeypatch.setattr(os, "getloadavg", lambda: (cpus * 40.0, 0.0, 0.0))
    assert Target.of().limit(120) == 120 * MAX_STRETCH  # within a bound
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert Target.of().limit(120) == 120.0


def test_a_probe_that_ran_out_of_time_is_not_examined_with_the_nodes_load(monkeypatch):
    import time

    def late(host):
        time.sleep(30)
        return {}, []

    monkeypatch.setitem(registry.PROBES, "t.late", registry.ProbeSpec("t.late", late, "Late", 0.3, ()))
    res = LiveHost().result("t.late")
    assert res.status == "timeout" and "ran out of time" in res.error and "CPUs" in res.error
    (f,) = probe_findings(Facts({"t.late": res}))
    assert f.status == "skip" and f.title == "probe t.late: not examined: ran out of time"
    assert "nothing is concluded from its lateness" in f.detail


def test_a_probes_budget_counts_its_own_time_not_its_wait_for_the_probes_it_reads(monkeypatch):
    """The rendezvous probe reads the traced run (minutes on a crowded node): its 20 s are its own work's,
    not the wait. A probe that then works past its budget is still out of time, and says how long it waited."""
    import time

    def slow_source(host):
        time.sleep(1.5)  # a slow probe of its own budget (the traced run, say)
        return {"answer": 42}, []

    def reader(host):
        answer = host.facts_of("t.source")["answer"]
        time.sleep(0.05)
        return {"read": answer}, []

    def reader_of_many(host):
        facts = host.results(["t.source2"])
        return {"read": facts.of("t.source2")["answer"]}, []

    def late_reader(host):
        host.facts_of("t.source")
        time.sleep(30)
        return {}, []

    for name, func, budget in [("t.source", slow_source, 10.0), ("t.source2", slow_source, 10.0),
                               ("t.reader", reader, 0.5), ("t.reader_of_many", reader_of_many, 0.5),
                               ("t.late_reader", late_reader, 0.3)]:
        monkeypatch.setitem(registry.PROBES, name, registry.ProbeSpec(name, func, name, budget, ()))
    host = LiveHost()
    facts = host.results(["t.reader", "t.reader_of_many", "t.late_reader"])
    assert facts["t.reader"].status == "ok" and facts.of("t.reader") == {"read": 42}
    assert facts["t.reader"].duration_s >= 1.5  # it waited the whole 1.5 s, three times its budget
    assert facts["t.reader_of_many"].status == "ok" and facts.of("t.reader_of_many") == {"read": 42}
    late = facts["t.late_reader"]
    assert late.status == "timeout", late
    assert "s waiting for the probes it reads" in late.error and "its 0.3s budget" in late.error


def test_hang_evidence_is_a_wait_not_zdoctors_own_limit():
    assert hang_evidence({"stuck_states": ["pid 7 (python): sleeping in hrtimer_nanosleep"]})
    assert hang_evidence({"stuck_states": ["pid 7 (python): in the kernel (uninterruptible) in nfs_wait"]})
    assert not hang_evidence({"stuck_states": ["pid 7 (python): running", "pid 8 (sh): running"]})
    assert hang_evidence({"source": "command"})  # the user's own limit, and no sample
    assert not hang_evidence({"source": "import-probe"})


@pytest.mark.slow
def test_a_slow_interpreter_is_slow_not_hung(tmp_path: Path):
    slow = tmp_path / "bin" / "python3"
    slow.parent.mkdir()
    slow.write_text("#!/bin/sh\n# works on a CPU for half a minute before it starts\n"
                    "timeout 30 sh -c 'while :; do :; done'\nexec /usr/bin/python3 \"$@\"\n")
    slow.chmod(0o755)
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), NO_COLOR="1")
    proc = run_cli(["check", "--json", "--no-log", "--python", str(slow), "--timeout", "5",
                    "--playbook", "zero3-launch"], env=env, timeout=600)
    doc = json.loads(proc.stdout)
    (live,) = [f for f in doc["findings"] if f["id"] == "libs.live"]
    assert live["status"] == "skip" and "slow, not hung" in live["title"], live["title"]
    (walk,) = doc["playbooks"]
    assert walk["diagnosis"] == "diag-live-late", walk["path"]
    assert not [f for f in doc["findings"] if f["id"].startswith("probe.") and f["status"] != "skip"]


def zero3_walk(host: LiveHost) -> list[str]:
    from zdoctor.walk.engine import Walk
    from zdoctor.walk.playbook import load_all

    registry.load_vocabulary()
    result = Walk(load_all()["zero3-launch"], host).run()
    assert result.stopped is None, result.reason
    return result.path


def test_a_run_working_at_its_limit_is_not_examined_and_one_waiting_is_a_hang(tmp_path: Path):
    """The same limit, three runs: one works on a CPU until it is ended (slow: the walk says "not examined",
    and the run neither failed nor hung), one sleeps and one is stopped (each a wait: the walk follows the
    hang)."""
    from zdoctor.core.registry import PREDICATES

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    working = LiveHost(None, env, command="sh -c 'while :; do :; done'", timeout=1.5)
    path = zero3_walk(working)
    assert path == ["symptom", "diag-live-late"], path
    facts = working.results(["livetrace"])
    live = facts.of("livetrace")
    assert live["timed_out"] and live["stuck_states"] and not hang_evidence(live)
    assert not PREDICATES["live_run_failed"].func(facts) and not PREDICATES["live_run_hung"].func(facts)
    (f,) = [f for f in evaluate_check("libs.live", working.results(registry.CHECKS["libs.live"].probes))
            if f.id == "libs.live"]
    # the user's own command and limit: still working at it, not a hang, and what to do about it
    assert f.status == "warn" and "was still working when the time limit (1.5 s) came: not a hang" in f.title
    assert "It loaded no libstdc++ before the limit" in f.detail  # a shell loop loads none: said as it is
    assert [r.title for r in f.remedies] == ["See how it ends: run the check again with a longer time limit"]

    for command, state in (("sleep 60", "sleeping"), ("sh -c 'kill -STOP $$'", "stopped")):
        waiting = LiveHost(None, env, command=command, timeout=1.5)
        path = zero3_walk(waiting)
        assert path[:2] == ["symptom", "build-log"], (command, path)
        facts = waiting.results(["livetrace"])
        assert any(state in x for x in facts.of("livetrace")["stuck_states"]), facts.of("livetrace")["stuck_states"]
        assert PREDICATES["live_run_hung"].func(facts) and not PREDICATES["live_run_late"].func(facts)


def test_a_working_process_with_an_unreaped_child_is_slow_not_hung(tmp_path: Path):
    """A zombie waits for nothing: its parent, still working on a CPU, is what the sample shows (the zombie
    alone read as a wait, and the run as a hang)."""
    import sys

    from zdoctor.core.registry import PREDICATES

    registry.load_vocabulary()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    code = "import os\nif os.fork() == 0: os._exit(0)\nwhile True: pass"
    host = LiveHost(None, env, command=f"{sys.executable} -c '{code}'", timeout=1.5)
    facts = host.results(["livetrace"])
    states = facts.of("livetrace")["stuck_states"]
    assert states and all(x.endswith(": running") for x in states) and not any("zombie" in x for x in states), states
    assert PREDICATES["live_run_late"].func(facts) and not PREDICATES["live_run_hung"].func(facts)
