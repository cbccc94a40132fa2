"""The headless pieces under the guided session: a step's probes, giving up on a slow probe, the graph
picture, practice scenarios, the glossary, resuming from a session log, and applying a remedy."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from zdoctor.core.errors import InputError, UsageError
from zdoctor.core.glossary import find_term, load_glossary
from zdoctor.core.model import ProbeResult, Remedy
from zdoctor.core.registry import PROBES, load_vocabulary
from zdoctor.host import Host, ReplayHost
from zdoctor.walk import apply, guide, practice
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_all
from zdoctor.walk.resume import (
    SessionHost,
    find_point,
    rebuild_host,
    recorded_results,
    resumable_sessions,
    resume_walk,
)
from zdoctor.walk.session import SessionLog, load_events

SCENARIO = "conda-ld-library-path"
STORY_PATH = ["symptom", "loaded", "needs", "layers", "verify", "source", "fix-ld-library-path",
              "diag-ld-library-path"]


@pytest.fixture(scope="module", autouse=True)
def vocabulary():
    load_vocabulary()


def test_node_probes_are_what_the_engine_runs():
    """The UI shows (and runs ahead) exactly the probes Walk.evaluate asks the host for."""
    book = load_all()["zero3-launch"]

    class Recording(ReplayHost):
        def __init__(self, doc):
            super().__init__(doc)
            self.asked: list[str] = []

        def results(self, names):
            names = list(names)
            self.asked = names
            return super().results(names)

    host = Recording(json.loads(practice.get_scenario(SCENARIO).snapshot.read_text()))
    walk = Walk(book, host)
    for _ in range(4):
        walk.evaluate()
        assert guide.node_probes(walk.node) == host.asked
        walk.advance()


def test_abandoned_probe_answers_timeout_and_a_late_result_is_kept():
    class Slow(Host):
        kind = "test"

        def __init__(self) -> None:
            super().__init__()
            self.release = threading.Event()

        def _compute(self, name: str) -> ProbeResult:
            self.release.wait(10)
            return ProbeResult(probe=name, facts={"late": True})

    host = Slow()
    t = threading.Thread(target=host.result, args=("system",), daemon=True)
    t.start()
    time.sleep(0.05)
    assert guide.pending(host, ["system"]) == ["system"]
    res = guide.abandon_probe(host, "system", 1.5)
    assert res.status == "timeout" and "cancelled by the user after 1.5 s" in res.error
    facts = host.results(["system"])  # does not wait for the running probe
    assert facts["system"] is res
    host.release.set()
    t.join(5)
    assert host.result("system").facts == {"late": True}  # a result that arrives later replaces it


def test_graph_text_marks_the_walk():
    book = load_all()["zero3-launch"]
    text = guide.graph_text(book, ["symptom", "loaded", "needs"], "needs")
    lines = text.splitlines()
    assert lines[0].startswith("zero3-launch: ")
    assert any(line.startswith("✓ symptom") for line in lines)
    assert any(line.startswith("● needs") for line in lines)
    assert any(line.startswith("○ diag-healthy") for line in lines)
    assert any("⇒ loaded" in line for line in lines)  # the edge taken
    assert any("→ diag-stale-lock" in line and "if stale_jit_lock" in line for line in lines)
    # every node and every edge of the networkx graph appears
    for nid in book.nodes:
        assert any(f" {nid} " in f"{line} " for line in lines), nid
    assert sum(1 for line in lines if line.lstrip().startswith(("→", "⇒"))) == book.graph.number_of_edges()


def test_bundled_scenario_replays_to_its_diagnosis():
    scenarios = practice.load_scenarios()
    s = practice.get_scenario(SCENARIO, scenarios)
    assert s.part == 1 and s.playbook == "zero3-launch" and s.snapshot.is_file()
    result = Walk(load_all()[s.playbook], s.host()).run()
    assert result.path == STORY_PATH and result.diagnosis == s.diagnosis
    doc = json.loads(s.snapshot.read_text())
    text = json.dumps(doc)
    assert "/opt/conda/lib/libstdc++.so.6" in text and "GLIBCXX_3.4.30" in text
    for leak in ("/tmp/pytest-", "/work/", "/root/.cache/zdoctor-tests"):
        assert leak not in text
    with pytest.raises(UsageError, match="no practice scenario 'nope'.*conda-ld-library-path"):
        practice.get_scenario("nope", scenarios)


def test_adding_a_scenario_is_a_file_and_an_entry(tmp_path):
    src = practice.get_scenario(SCENARIO)
    (tmp_path / "second.json").write_text(src.snapshot.read_text())
    index = tmp_path / "index.toml"
    index.write_text((src.snapshot.parent / "index.toml").read_text() + """
[[scenario]]
id = "nvme-offload"
part = 3
title = "Offload crawls"
playbook = "zero3-launch"
snapshot = "second.json"
summary = "s"
story = "t"
""")
    ids = [(s.id, s.part) for s in practice.load_scenarios(index)]
    assert ids[0] == (SCENARIO, 1) and ids[-1] == ("nvme-offload", 3)
    assert len(ids) == len(practice.load_scenarios()) + 1


@pytest.mark.parametrize("body, message", [
    ("[[scenario]\nid = 1", r"index.toml:1:\d+: invalid TOML"),
    ("[[scenario]]\nid = \"a\"", "missing or empty title"),
    ('[[scenario]]\nid="A b"\ntitle="t"\nsummary="s"\nstory="s"\nsnapshot="x.json"\nplaybook="p"', "lowercase"),
    ('[[scenario]]\nid="a"\ntitle="t"\nsummary="s"\nstory="s"\nsnapshot="../x.json"\nplaybook="p"', "beside"),
])
def test_bad_scenario_catalogue_is_one_line(tmp_path, body, message):
    index = tmp_path / "index.toml"
    index.write_text(body)
    with pytest.raises(InputError, match=message):
        practice.load_scenarios(index)


def test_glossary_has_the_terms_and_gets_symbol_versions_right():
    terms = load_glossary()
    for name in ("RPATH", "RUNPATH", "GLIBCXX", "SONAME", "symbol versioning", "ZeRO stages", "offload",
                 "pinned memory", "O_DIRECT", "NVMe"):
        assert find_term(terms, name) is not None, name
    sv = find_term(terms, "symbol versioning").text
    assert "`name@@VERSION` marks the default version" in sv
    assert "`name@VERSION` (one @) marks a non-default" in sv
    assert "nothing to do with weak or strong binding" in sv
    assert "after LD_LIBRARY_PATH" in find_term(terms, "RUNPATH").text
    assert "before LD_LIBRARY_PATH" in find_term(terms, "RPATH").text


# --- resume -------------------------------------------------------------------------------------

def record_partial_walk(steps: int) -> tuple[str, list[str]]:
    """A demo session that walked ``steps`` edges and was never closed (the process died)."""
    s = practice.get_scenario(SCENARIO)
    host = s.host()
    log = SessionLog.create("demo", ["--demo"], {**host.info, "scenario": s.id})
    walk = Walk(load_all()[s.playbook], host, record=log.record)
    for _ in range(steps):
        walk.evaluate()
        walk.advance()
    walk.evaluate()
    os.close(log._fd)  # no session_end: as if the connection dropped
    log._fd = None
    return log.id, list(walk.path)


def test_resume_point_and_walk_continue_where_it_stopped():
    sid, path = record_partial_walk(2)
    assert path == STORY_PATH[:3]
    (point,) = resumable_sessions()
    assert point.session_id == sid and point.node == "needs" and point.nodes == path
    assert point.mode == "demo" and not point.closed and not point.walk_ended
    assert "practice conda-ld-library-path: zero3-launch at needs" in point.describe()
    assert find_point(None).session_id == sid

    recorded = recorded_results(point.events)
    assert {"livetrace", "jitcache", "processes", "libs"} <= set(recorded)
    host = SessionHost(rebuild_host(point.host_info), recorded)
    assert host.result("libs") is recorded["libs"]  # evidence gathered so far, not probed again
    log = SessionLog.reopen(sid)
    walk = resume_walk(point, host, record=log.record)  # the log writes each probe result once
    assert walk.path == path and walk.current == "needs" and not walk.done
    result = walk.run()
    log.close(0)
    assert result.path == STORY_PATH
    events = load_events(sid)
    types = [e["type"] for e in events]
    assert types.count("session_resume") == 1 and types[-1] == "session_end"
    libs_results = [e for e in events if e["type"] == "probe_result" and e["result"]["probe"] == "libs"]
    assert len(libs_results) == 1  # the recorded result is not written twice


def test_resume_refuses_sessions_without_a_walk(state_home):
    log = SessionLog.create("check", ["check"], {"hostname": "h"})
    log.close(0)
    with pytest.raises(InputError, match="no guided walk to resume"):
        find_point(log.id)
    with pytest.raises(InputError, match="no guided session to resume"):
        find_point(None)


def test_rebuild_host_from_recorded_info(tmp_path):
    snap = practice.get_scenario(SCENARIO).snapshot
    assert isinstance(rebuild_host({"kind": "replay", "source": str(snap)}), ReplayHost)
    with pytest.raises(InputError, match="no such file"):
        rebuild_host({"kind": "replay", "source": str(tmp_path / "gone.json")})
    live = rebuild_host({"kind": "live", "python": "/opt/x/bin/python", "python_explicit": True,
                         "command": "true", "ext": ["/a.so"], "timeout": 5, "options": {"nodes": 2}})
    assert (live.python, live.command, live.ext, live.timeout, live.options) == (
        "/opt/x/bin/python", "true", ["/a.so"], 5, {"nodes": 2})
    assert rebuild_host({"kind": "live", "python": "python3", "python_explicit": False}).python_explicit is False


# --- apply --------------------------------------------------------------------------------------

def test_plan_says_when_the_terminal_is_needed():
    assert not apply.plan(Remedy("t", ["rm -f -- /x"]), is_root=False).interactive
    root = apply.plan(Remedy("t", ["apt-get install -y g++"], requires_root=True), is_root=False)
    assert root.interactive and "needs root" in root.reasons[0]
    assert not apply.plan(Remedy("t", ["apt-get install -y g++"], requires_root=True), is_root=True).interactive
    assert apply.plan(Remedy("t", ["sudo rm /etc/ld.so.preload"]), is_root=True).interactive
    assert apply.plan(Remedy("t", ["unset LD_PRELOAD", "export A=1", "echo x"])).env_lines == [
        "unset LD_PRELOAD", "export A=1"]


def test_env_effect_without_running_anything():
    env = {"LD_LIBRARY_PATH": "/opt/conda/lib:/keep", "LD_PRELOAD": "/old.so"}
    assert apply.env_effect(["export LD_LIBRARY_PATH=/keep", "unset LD_PRELOAD", "export X='a b'"], env) == [
        ("LD_LIBRARY_PATH", "/opt/conda/lib:/keep", "/keep"), ("LD_PRELOAD", "/old.so", None), ("X", None, "a b")]
    assert apply.env_effect(["export A=$HOME"], env) is None  # needs a shell to tell
    assert apply.env_effect(["export A=\"$(id)\""], env) is None
    assert apply.env_effect(["export A='$HOME'"], env) == [("A", None, "$HOME")]  # single quotes: literal
    assert apply.env_effect(["rm -f /x"], env) == []


def test_run_remedy_streams_output_and_tells_what_changed(tmp_path):
    target = tmp_path / "dir with space" / "new.txt"
    gone = tmp_path / "lock"
    gone.write_text("")
    r = Remedy("demo", [f"mkdir -p {apply.shlex.quote(str(target.parent))}",
                        f"echo hello > {apply.shlex.quote(str(target))}", f"rm -f -- {gone}",
                        "export ZD_TEST=1"])
    lines: list[str] = []
    out = apply.run_remedy(r, dict(os.environ), on_output=lines.append, env_file=(tmp_path / "fixes", "f.sh"))
    assert out.ok and out.exit_code == 0
    assert target.read_text() == "hello\n" and not gone.exists()
    assert f"created {target}" in out.changed and f"removed {gone}" in out.changed
    assert any(line.startswith("+ echo hello") for line in lines)  # set -x echoes each line
    env_file = tmp_path / "fixes" / "f.sh"
    assert out.env_file == str(env_file) and f"wrote {env_file}" in out.changed
    assert env_file.read_text().splitlines()[-1] == "export ZD_TEST=1"
    assert (env_file.stat().st_mode & 0o777) == 0o600


def test_run_remedy_stops_at_the_first_failure_and_can_be_cancelled(tmp_path):
    marker = tmp_path / "after"
    out = apply.run_remedy(Remedy("f", ["false", f"touch {marker}"]), dict(os.environ))
    assert out.exit_code == 1 and not out.ok and not marker.exists()

    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.monotonic()
    out = apply.run_remedy(Remedy("slow", ["sleep 30"]), dict(os.environ), cancel=cancel)
    assert out.cancelled and not out.ok and time.monotonic() - t0 < 10
    assert apply.ApplyOutcome(exit_code=0, cancelled=True).to_dict()["ok"] is False


def test_known_env_of_a_replayed_node():
    env = apply.known_env(practice.get_scenario(SCENARIO).host())
    assert env["LD_LIBRARY_PATH"] == "/opt/conda/lib"


def test_budgets_and_titles_come_from_the_registry():
    assert guide.probe_budget("system") == PROBES["system"].timeout
    assert guide.probe_title("system") == PROBES["system"].title
    assert guide.probe_budget("nope") is None and guide.probe_title("nope") == "nope"
    assert set(guide.first_pass_probes()) >= {"system", "pyenv", "libs"}
