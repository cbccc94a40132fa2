"""The guide's panes draw from the report document the exports read: the same trial state of every remedy,
the same table shown once however many findings rest on it, the same labels of captured output."""

from __future__ import annotations

import asyncio
import sys

import pytest
from conftest import FIXTURES, REPO
from test_tui import SCENARIO, make, name, plain, settle, step_ready

from zdoctor.core import registry
from zdoctor.core.model import Evidence, Finding, Remedy, Table
from zdoctor.host import ReplayHost
from zdoctor.report.export import render
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_playbook
from zdoctor.walk.practice import get_scenario
from zdoctor.walk.session import SessionLog, load_events
from zdoctor.walk.walkwords import in_words

pytest.importorskip("textual")
sys.path.insert(0, str(REPO))

from screens.app import Context  # noqa: E402
from screens.docview import step_doc  # noqa: E402
from screens.evidence import EvidenceScreen  # noqa: E402
from screens.remedy import RemedyScreen  # noqa: E402
from screens.walk import WalkScreen  # noqa: E402

HOST = {"hostname": "node-a", "os": "Ubuntu 22.04", "kind": "live"}
#: A replayed snapshot, as the practice scenario the app below shows: its remedies were tried there.
REPLAYED = {"hostname": "train-node-01", "os": "Ubuntu 22.04", "kind": "replay"}


def exported_md(findings: list[Finding], host: dict[str, str] = HOST) -> str:
    """The Markdown export of a recorded session holding ``findings``."""
    log = SessionLog.create("check", ["check"], host)
    for f in findings:
        log.record("finding", {"finding": f.to_dict()})
    log.close(1)
    return render(load_events(log.id), "md").replace("\\", "")


def trial_of(flags: str) -> str:
    """A remedy pane's trial state without its mark (the first line of its flags)."""
    return flags.splitlines()[0].split(" ", 1)[1]


def test_the_remedy_pane_says_each_trial_state_as_the_export_does(state_home):
    """A remedy the node's facts rule out reads "not recommended, because ..." in the pane as in the export
    (the pane once said "not tried, because ..." for it); a tried one reads the same in both."""
    fixed = Remedy("Preload the system libstdc++", ["export LD_PRELOAD=/lib/x86_64-linux-gnu/libstdc++.so.6"],
                   verified=True, tried=True, note="the command succeeded with this change (exit 0 in 0.4 s)")
    ruled_out = Remedy("Rebuild cpu_adam against /opt/conda/lib/libstdc++.so.6", ["rm -rf ~/.cache/torch_extensions"],
                       recommended=False, note="that libstdc++ provides up to GLIBCXX_3.4.28 only")
    finding = Finding("libs.glibcxx", "fail", "cpu_adam.so needs GLIBCXX_3.4.30", remedies=[fixed, ruled_out])
    md = exported_md([finding], REPLAYED)
    panes: list[str] = []

    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"])
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(RemedyScreen(app.ctx, "zero3-launch", "symptom", [(finding, fixed), (finding, ruled_out)]))
            await settle(pilot, lambda: name(app) == "RemedyScreen" and bool(app.screen.query("#rem-flags")))
            await pilot.pause(0.1)
            for key in ("", "down"):
                if key:
                    await pilot.press(key)
                    await pilot.pause(0.1)
                panes.append(plain(app.screen.query_one("#rem-flags")))

    asyncio.run(scenario())
    fixed_pane, ruled_out_pane = (trial_of(p) for p in panes)
    assert fixed_pane.startswith("tried on the recorded node: fixed") and fixed_pane in md
    assert ruled_out_pane == "not recommended, because that libstdc++ provides up to GLIBCXX_3.4.28 only"
    assert ruled_out_pane in md


def test_the_remedy_pane_of_the_walk_agrees_with_the_session_export(tmp_path):
    """The practice walk to its diagnosis: every fix the pane lists reads, option by option, the trial state
    the session's Markdown export gives it."""
    panes: list[str] = []
    exported: list[str] = []

    async def scenario() -> None:
        app = make(demo=SCENARIO, export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            while True:
                await step_ready(pilot, app)
                if app.screen.walk.current == "diag-ld-library-path":
                    break
                await pilot.press("n")
            await pilot.press("r")
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            screen = app.screen
            for i in range(len(screen.pairs)):
                screen.show(i)
                panes.append(plain(screen.query_one("#rem-flags")))
            exported.append(app.export("md").read_text(encoding="utf-8").replace("\\", ""))

    asyncio.run(scenario())
    assert len(panes) >= 3
    for pane in panes:
        assert "on the recorded node" in pane or pane.startswith("? not tried")
        assert trial_of(pane) in exported[0], pane


def test_the_evidence_pane_shows_a_shared_table_once_and_labels_output_as_the_export(state_home):
    """Two findings resting on one table: the pane shows it in full under the first and refers to it under
    the second, as the export does (one table, E1); a command's stderr is "Errors (stderr)" in both."""
    served = Table(["library", "libstdc++.so.6 served"], [["torch._C", "/opt/conda/lib/libstdc++.so.6"],
                                                        ["cpu_adam.so", "/opt/conda/lib/libstdc++.so.6"]],
                   highlight=[1])
    run = Evidence("import cpu_adam", argv=["python", "-c", "import cpu_adam"], exit_code=1,
                   stderr="ImportError: /opt/conda/lib/libstdc++.so.6: version `GLIBCXX_3.4.30' not found")
    first = Finding("libs.glibcxx", "fail", "cpu_adam.so needs GLIBCXX_3.4.30",
                    evidence=[Evidence("libstdc++ served", kind="table", table=served), run])
    second = Finding("libs.ld_library_path", "warn", "LD_LIBRARY_PATH puts /opt/conda/lib first",
                     evidence=[Evidence("libstdc++ served", kind="table", table=served)])
    doc = step_doc([first, second])
    assert [t.id for t in doc.tables] == ["E1"]
    md = exported_md([first, second])
    assert "Evidence E1" in md and "Errors (stderr)" in md
    seen: dict[str, object] = {}

    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"])
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(EvidenceScreen("step", doc))
            await settle(pilot, lambda: name(app) == "EvidenceScreen" and bool(app.screen.query(".ev-table")))
            await pilot.pause(0.1)
            screen = app.screen
            seen["tables"] = len(screen.query(".ev-table"))
            seen["refs"] = [plain(w) for w in screen.query(".ev-ref")]
            seen["items"] = "\n".join(plain(w) for w in screen.query(".ev-item"))

    asyncio.run(scenario())
    assert seen["tables"] == 1
    assert seen["refs"] == ["  libstdc++ served: shown above, under libs.glibcxx\n"]
    assert "Errors (stderr):" in str(seen["items"]) and "GLIBCXX_3.4.30' not found" in str(seen["items"])


def test_a_walk_that_ends_without_a_diagnosis_says_why_in_the_reports_words(monkeypatch):
    """A walk stuck where no edge applies: the finished walk's line gives the reason in the words the report
    document gives it (the predicate's description), not the engine's record (``predicate NAME is false``)."""
    monkeypatch.setitem(registry.PREDICATES, "alpha_high", registry.PredicateSpec(
        "alpha_high", lambda f: (f.of("alpha") or {}).get("value", 0) > 10, "alpha is above 10", ("alpha",)))
    host = ReplayHost({"format": "zdoctor-snapshot", "version": 1,
                       "probes": {"alpha": {"probe": "alpha", "facts": {"value": 1}}}})
    walk = Walk(load_playbook(FIXTURES / "playbooks" / "broken" / "no_fallback.toml"), host)
    result = walk.run()
    assert result.diagnosis is None and "predicate alpha_high is false" in result.reason
    said: list[str] = []

    async def scenario() -> None:
        app = make(host=get_scenario(SCENARIO).host(), argv=["tui"])
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(WalkScreen(Context(host=host, mode="tui"), walk))
            await settle(pilot, lambda: name(app) == "WalkScreen" and bool(app.screen.query("#verdict"))
                         and "Walk finished" in plain(app.screen.query_one("#verdict")))
            said.append(plain(app.screen.query_one("#verdict")))

    asyncio.run(scenario())
    assert "Walk finished. stuck at a: no edge applies: not: alpha is above 10\nx exports the report" in said[0]
    assert in_words(result.reason) in said[0] and "predicate alpha_high" not in said[0]
