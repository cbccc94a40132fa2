"""The one report model: three-state verification worded once for every renderer, a finding's remedies
shown as alternatives, exports that say what happened, the HTML export as a real document, no terminal
escape through any renderer, and sessions recorded by an earlier release still exporting and resuming."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO

from zdoctor.core.model import Finding, Remedy
from zdoctor.core.present import FIXED, NOT_FIXED, NOT_TRIED, verification_of, verification_text
from zdoctor.report.export import render
from zdoctor.trials.remedies import Plan, verify
from zdoctor.walk.session import SessionLog, load_events

SESSIONS = FIXTURES / "sessions"
CHECK, PRACTICE, APPLIED, INTERRUPTED = ("20261201T130416-d9aa", "20261201T130401-fddd",
                                         "20261201T130409-797f", "20261201T130412-460b")
HOST = {"hostname": "gpu-node-7", "os": "Ubuntu 22.04.4 LTS", "kind": "live"}
ESCAPES = "\x1b[2J\x1b]0;owned\x07"


def three_remedies() -> list[Remedy]:
    return [Remedy("Preload the system libstdc++", ["export LD_PRELOAD=/lib/libstdc++.so.6"], verified=True,
                   tried=True, note="the command succeeded with this change (exit 0 in 0.4 s)"),
            Remedy("Drop /opt/old from LD_LIBRARY_PATH", ["export LD_LIBRARY_PATH=/usr/lib"], tried=True,
                   note="the command still fails with this change (exit code 1): GLIBCXX_3.4.30 not found"),
            Remedy("Upgrade the system libstdc++", ["apt-get install -y libstdc++6"], requires_root=True)]


def installed_fixtures(state_home: Path) -> Path:
    folder = state_home / "zdoctor" / "sessions"
    folder.mkdir(parents=True, exist_ok=True)
    for f in SESSIONS.glob("*.jsonl"):
        shutil.copy(f, folder / f.name)
    return folder


# --- verification ---------------------------------------------------------------------------------

def test_verification_has_three_states_and_one_wording():
    fixed, not_fixed, not_tried = three_remedies()
    assert [verification_of(r).state for r in three_remedies()] == [FIXED, NOT_FIXED, NOT_TRIED]
    assert verification_text(verification_of(fixed)).startswith("tried: fixed")
    assert verification_text(verification_of(not_fixed)) == (
        "tried: did not fix — the command still fails with this change (exit code 1): GLIBCXX_3.4.30 not found")
    assert verification_text(verification_of(not_tried)) == "not tried, because it needs root and changes the machine"
    assert verification_text(verification_of(Remedy("x"))).startswith("not tried, because ")
    assert verification_text(verification_of(fixed), recorded_elsewhere=True).startswith("tried on the recorded node")



def test_a_note_that_already_says_not_tried_is_worded_once():
    # the checks' own notes begin either way (the reboot remedy: "not tried: ...", ncclnet: "not tried, because")
    notes = {"not tried: it stops every process on the node": "not tried, because it stops every process on the node",
             "Not tried, because it changes every rank's launch": "not tried, because it changes every rank's launch"}
    for note, said in notes.items():
        v = verification_of(Remedy("x", note=note))
        assert verification_text(v) == said and v.to_dict()["reason"] == said[len("not tried, because "):]
        assert verification_text(verification_of({"verification": {"state": "not_tried", "reason": note}})) == said


def test_json_keeps_verified_as_tried_and_fixed_and_adds_the_state():
    docs = [r.to_dict() for r in three_remedies()]
    assert [d["verified"] for d in docs] == [True, False, False]
    assert [d["verification"]["state"] for d in docs] == ["fixed", "not_fixed", "not_tried"]
    assert "GLIBCXX_3.4.30 not found" in docs[1]["verification"]["reason"]
    back = [Remedy.from_dict(d) for d in docs]
    assert [verification_of(r) for r in back] == [verification_of(r) for r in three_remedies()]
    # A remedy recorded by an earlier release: `verified: false` with no state is never "did not fix"
    # unless its explanation said the re-run failed.
    assert verification_of({"verified": False, "explanation": "x"}).state == NOT_TRIED
    assert verification_of({"verified": False, "explanation": "y. Verified: the command still fails with this "
                                                              "change (exit code 1)."}).state == NOT_FIXED


def test_a_real_rerun_that_does_not_fix_says_so_with_its_output(tmp_path):
    plan = Plan(key="ld-preload", title="Preload a copy", env_changes={"LD_PRELOAD": ""})
    verify(plan, ["sh", "-c", "echo 'version GLIBCXX_3.4.30 not found' >&2; exit 1"], dict(os.environ))
    r = plan.to_remedy()
    v = verification_of(r)
    assert v.state == NOT_FIXED and "exit code 1" in v.reason and "GLIBCXX_3.4.30 not found" in v.reason
    ok = Plan(key="ld-preload", title="Preload a copy")
    verify(ok, ["true"], dict(os.environ))
    assert verification_of(ok.to_remedy()).state == FIXED
    never = Plan(key="conda-libstdcxx", title="Upgrade", verifiable=False, verification="it needs the network")
    assert verification_text(verification_of(never.to_remedy())) == "not tried, because it needs the network"
    # Plans recorded in an earlier snapshot (no `tried`) keep what their sentence says.
    old = Plan.from_dict({"key": "k", "title": "t", "verified": False,
                          "verification": "the command still fails with this change (exit code 1)."})
    assert verification_of(old.to_remedy()).state == NOT_FIXED


def test_every_renderer_uses_the_one_wording(state_home: Path):
    from zdoctor.report.terminal import print_report
    from zdoctor.walk.doctor import CheckReport

    remedies = three_remedies()
    f = Finding("libs.glibcxx", "fail", "libstdc++ lacks GLIBCXX_3.4.30", remedies=remedies)
    wordings = [verification_text(verification_of(r)) for r in remedies]
    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": f.to_dict()})
    log.close(1)
    events = load_events(log.id)
    md, doc = render(events, "md"), render(events, "html")
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host=HOST, findings=[f]), buf, verbose=True)
    buf.seek(0)
    terminal = buf.read()
    pytest.importorskip("textual")
    sys.path.insert(0, str(REPO))
    from screens.docview import step_doc, trial_text

    tui = [str(trial_text(item)) for item in step_doc([f]).findings[0].remedies]
    for w in wordings:
        assert w in terminal, w
        assert w in md.replace("\\", ""), w
        assert w in doc.replace("&#x27;", "'"), w
        assert any(w in t for t in tui), w
    for text in (terminal, md, doc):
        assert "verification failed" not in text and "verified: tried on this machine" not in text


# --- remedies as alternatives ---------------------------------------------------------------------

def test_remedies_are_options_each_with_its_own_script(state_home: Path):
    from zdoctor.report.terminal import print_report
    from zdoctor.walk.doctor import CheckReport

    f = Finding("libs.glibcxx", "fail", "libstdc++ lacks GLIBCXX_3.4.30", remedies=three_remedies())
    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": f.to_dict()})
    log.close(1)
    md = render(load_events(log.id), "md")
    assert "Run these in bash, in order" not in md and "in order, before the launch command:" in md
    assert "#### Options: pick one (the first is recommended)" in md
    assert "Recommended because it was tried and fixed the failing command." in md
    assert md.index("**Option 1 (recommended): Preload") < md.index("**Option 2: Drop") < md.index("**Option 3: ")
    assert md.count("```bash\n") == 3  # one script per option
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host=HOST, findings=[f]), buf)
    buf.seek(0)
    text = buf.read()
    assert "Options: pick one" in text and "Option 1 (recommended): Preload" in text and "Option 3: Upgrade" in text


# --- exports say what happened --------------------------------------------------------------------

def test_practice_session_export_says_what_happened(state_home: Path):
    installed_fixtures(state_home)
    md = render(load_events(PRACTICE), "md")
    assert "tried on this machine" not in md and "verified:" not in md
    assert "(tried on the recorded node: fixed — the command succeeded" in md
    path = md.split("## Path through the playbooks", 1)[1].split("## Findings", 1)[0]
    assert "fallback" not in path and "predicate" not in path
    assert "the failing libstdc++ came from an LD\\_LIBRARY\\_PATH entry" in path
    assert "practised: nothing was run" in md
    checked = render(load_events(CHECK), "md")
    assert "**Why:** reached the diagnosis: No usable NVIDIA driver" in checked
    assert "reached diagnosis diag-" not in checked and "predicate" not in checked.split("## Findings")[0]


def test_a_live_export_says_still_open_and_copies_are_recorded(state_home: Path):
    from zdoctor.report.export import export_session

    log = SessionLog.create("tui", ["tui"], HOST)
    r = three_remedies()[0]
    log.record("remedy_copied", {"playbook": "p", "node": "n", "finding_id": "libs.glibcxx", "remedy": r.to_dict()})
    md = export_session(log.id, "md", state_home, live=True).read_text()
    assert "- **Ended:** still open (exported during the session)" in md
    assert "copied to the clipboard: nothing was run by zdoctor" in md and "Preload the system libstdc++" in md
    assert "not recorded" in render(load_events(log.id), "md")  # read later, from outside: it cannot say


def test_versions_are_read_not_cut():
    from zdoctor.layers.libraries.check_libs import _gcc_of

    assert _gcc_of("GCC: (GNU) 13.3.1 20240611 (Red Hat 13.3.1-2)") == "13.3.1"
    assert _gcc_of("GCC: (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0") == "11.4.0"


# --- HTML -------------------------------------------------------------------------------------------

VOID = {"meta", "br", "hr", "img", "input", "link", "wbr"}


class Strict(HTMLParser):
    """Checks that every element is closed in order, and gathers ids, anchors and headings."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.hrefs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.append(a["id"])
        if tag == "a" and a.get("href", "").startswith("#"):
            self.hrefs.append(a["href"][1:])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def test_html_export_is_a_real_document(state_home: Path):
    installed_fixtures(state_home)
    for sid in (CHECK, PRACTICE, APPLIED, INTERRUPTED):
        doc = render(load_events(sid), "html")
        p = Strict()
        p.feed(doc)
        p.close()
        assert not p.errors and p.stack == [], (sid, p.errors[:3], p.stack)
        assert len(p.ids) == len(set(p.ids)), sid
        assert set(p.hrefs) <= set(p.ids), sid
        assert "#00ff00" not in doc.lower() and 'style="' not in doc
        assert "prefers-color-scheme: dark" in doc and "@media print" in doc
        assert doc.index('id="summary"') < doc.index('id="findings"')
        assert "<table>" in doc and "<th>" in doc
    doc = render(load_events(PRACTICE), "html")
    assert doc.count('<h4 id="step-zero3-launch-') == 8  # a heading per step of the walk


# --- terminal escapes -----------------------------------------------------------------------------

def test_a_hostile_replay_sends_no_escape_through_any_renderer(tmp_path: Path, state_home: Path):
    """An nvme_path holding a clear-screen and an OSC title: the remedies' mkdir/chown lines carry it.
    Every renderer shows it as \\x1b; the JSON keeps the bytes exactly."""
    hostile = str(tmp_path / f"nvme{ESCAPES}" / "offload")
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": hostile},
        "offload_optimizer": {"device": "nvme", "nvme_path": hostile}}}))
    snap = tmp_path / "snap.json"
    env = {**os.environ, "NO_COLOR": "1"}

    def zd(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "zdoctor", *args], capture_output=True, env=env,
                              cwd=str(REPO), timeout=300, stdin=subprocess.DEVNULL)

    assert zd("snapshot", "-o", str(snap), "--ds-config", str(cfg)).returncode == 0
    report = zd("check", "--replay", str(snap), "-v")
    assert b"\x1b" not in report.stdout and b"\x07" not in report.stdout
    assert b"\\x1b[2J\\x1b]0;owned\\x07" in report.stdout and b"mkdir" in report.stdout
    as_json = json.loads(zd("check", "--replay", str(snap), "--json", "--no-log").stdout)
    commands = [c for f in as_json["findings"] for r in f["remedies"] for c in r["commands"]]
    assert any(ESCAPES in c and c.startswith("mkdir") for c in commands)  # the bytes, exactly
    sid = as_json_session = json.loads(zd("check", "--replay", str(snap), "--json").stdout)["session"]
    for fmt in ("md", "html"):
        out = zd("export", "--session", as_json_session, "--format", fmt)
        assert out.returncode == 0 and b"\x1b" not in out.stdout and b"\x07" not in out.stdout, fmt
        assert b"\\x1b[2J" in out.stdout.replace(b"\\\\", b"\\"), fmt
    exported = json.loads(zd("export", "--session", sid, "--format", "json").stdout)
    assert any(ESCAPES in c for f in exported["findings"] for r in f["remedies"] for c in r["commands"])


# --- sessions recorded by an earlier release ------------------------------------------------------

@pytest.mark.parametrize("sid", [CHECK, PRACTICE, APPLIED, INTERRUPTED])
def test_a_session_recorded_by_an_earlier_release_still_exports(state_home: Path, sid: str):
    installed_fixtures(state_home)
    events = load_events(sid)
    md = render(events, "md")
    assert md.startswith(f"# zdoctor session `{sid}`")
    doc = json.loads(render(events, "json"))
    assert doc["events"] == list(events) and doc["session"] == sid
    assert render(events, "html").startswith("<!DOCTYPE html>")
    if sid == APPLIED:
        assert "Remove the stale lock of op cpu\\_adam (applied)" in md
    if sid == CHECK:
        assert doc["summary"]["total"] == 40


def test_a_session_recorded_by_an_earlier_release_still_resumes(state_home: Path):
    from zdoctor.walk.resume import find_point, rebuild_host, resume_walk

    installed_fixtures(state_home)
    point = find_point(INTERRUPTED)
    assert point.resumable and point.node == "layers"
    walk = resume_walk(point, rebuild_host(point.host_info), record=None)
    assert walk.path == ["symptom", "loaded", "needs", "layers"]
    result = walk.run()
    assert result.diagnosis == "diag-ld-library-path"


# --- the typed session record ---------------------------------------------------------------------

def test_every_recorded_event_reads_back_as_its_kind_and_writes_the_same_data(state_home: Path):
    from zdoctor.walk.events import ENVELOPE, KINDS, Unknown, parse

    installed_fixtures(state_home)
    seen = set()
    for sid in (CHECK, PRACTICE, APPLIED, INTERRUPTED):
        for ev in load_events(sid):
            typed = parse(ev)
            assert not isinstance(typed, Unknown), ev["type"]
            assert type(typed) is KINDS[ev["type"]] and typed.seq == ev["seq"]
            assert typed.to_dict() == {k: v for k, v in ev.items() if k not in ENVELOPE}, ev["type"]
            seen.add(ev["type"])
    assert {"session_start", "session_end", "playbook_start", "node_enter", "edge", "diagnosis", "playbook_end",
            "probe_result", "finding", "summary", "remedy_applied", "remedy_declined", "remedy_practised"} <= seen
    assert isinstance(parse({"type": "gpu_topology_seen", "seq": 3, "links": "NV18"}), Unknown)
    fleet = [{"type": "fleet_start", "seq": 2, "launcher": "ssh", "source": "hostfile", "hosts": ["a"], "slots": {},
              "remote": ["zdoctor", "snapshot"], "timeout": 180.0, "parallel": 32},
             {"type": "fleet_node", "seq": 3, "node": {"host": "a"}},
             {"type": "finding", "seq": 4, "finding": {"id": "x@a"}, "node": "a"},
             {"type": "fleet_result", "seq": 5, "report": {"nodes": []}}]
    for ev in fleet:
        assert parse(ev).to_dict() == {k: v for k, v in ev.items() if k not in ENVELOPE}, ev["type"]
    assert parse({"type": "node_enter", "node": 7}).node == ""  # a field of the wrong type: its default


def test_one_fold_serves_export_resume_and_the_walk(state_home: Path):
    from zdoctor.walk.engine import Walk
    from zdoctor.walk.playbook import load_all
    from zdoctor.walk.practice import get_scenario
    from zdoctor.walk.resume import read_point
    from zdoctor.walk.session import read_session

    installed_fixtures(state_home)
    view = read_session(INTERRUPTED)
    walk = view.last_walk()
    assert walk is not None and walk.nodes == ["symptom", "loaded", "needs", "layers"] and not walk.ended
    assert not view.closed and view.mode == "demo"
    assert read_point(INTERRUPTED).nodes == walk.nodes
    resumed = Walk.resume(load_all()["zero3-launch"], get_scenario("conda-ld-library-path").host(), view.events)
    assert resumed.path == walk.nodes and resumed.current == "layers"
    assert set(view.results()) >= {"libs", "livetrace"}


def test_the_session_log_writes_each_probe_result_once(state_home: Path):
    from zdoctor.core.model import ProbeResult

    log = SessionLog.create("check", ["check"], HOST)
    res = ProbeResult(probe="libs", started=12.5).to_dict()
    for _ in range(3):
        log.record("probe_result", {"result": res})
    log.close(0)
    again = SessionLog.reopen(log.id)
    again.record("probe_result", {"playbook": "p", "node": "n", "result": res})  # held before the resume
    again.record("probe_result", {"result": {**res, "started": 13.0}})  # a new run of the probe
    again.close(0)
    starts = [e["result"]["started"] for e in load_events(log.id) if e["type"] == "probe_result"]
    assert starts == [12.5, 13.0]


def test_the_guide_shows_a_hostile_remedy_without_its_escapes(tmp_path: Path, state_home: Path):
    """The fix screen of a remedy whose lines hold a clear-screen and an OSC title: what reaches the screen
    carries no control character (the guide's line filter), the copy keeps the real bytes."""
    import asyncio

    pytest.importorskip("textual")
    from test_tui import make, name, screen_text, settle

    from zdoctor.host import ReplayHost

    hostile = str(tmp_path / f"nvme{ESCAPES}" / "offload")
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": hostile}}}))
    snap = tmp_path / "snap.json"
    made = subprocess.run([sys.executable, "-m", "zdoctor", "snapshot", "-o", str(snap), "--ds-config", str(cfg)],
                          capture_output=True, cwd=str(REPO), timeout=300, stdin=subprocess.DEVNULL)
    assert made.returncode == 0, made.stderr
    doc = json.loads(snap.read_text())

    async def scenario() -> None:
        from screens.remedy import RemedyScreen
        from zdoctor.layers import run_checks

        host = ReplayHost(doc, source="hostile")
        _facts, findings = run_checks(host)
        pairs = [(f, r) for f in findings for r in f.remedies if any(ESCAPES in c for c in r.commands)]
        assert pairs, "the hostile path reached no remedy"
        app = make(host=host, argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen")
            app.push_screen(RemedyScreen(app.ctx, "offload-bottleneck", "storage", pairs))
            await settle(pilot, lambda: name(app) == "RemedyScreen")
            await pilot.pause(0.2)
            shown = screen_text(app)
            assert "\x1b" not in shown and "\x07" not in shown
            assert "0;owned" in shown  # the rest of the path is shown
            await pilot.press("y")
            assert ESCAPES in app.clipboard  # the copy is the real command

    asyncio.run(scenario())


def test_terminal_scripts_are_printed_whole_and_unpadded_at_80_columns():
    """A shell line longer than the 72 columns left after the indent is neither cut nor padded: the
    memlock drop-in once printed as ``.../90-memlock.con`` (a file pam_limits never reads)."""
    from zdoctor.report.terminal import print_report
    from zdoctor.walk.doctor import CheckReport

    line = "echo '* - memlock unlimited' | tee /etc/security/limits.d/90-memlock.conf"
    f = Finding("gpu.limits.memlock", "warn", "ulimit -l is 8192 KiB",
                remedies=[Remedy("Raise memlock", [line, "export NCCL_DEBUG=INFO",
                                                   "cat > /tmp/ds.json <<'ZD'\n{\"a\": 1}\nZD"], requires_root=True)])
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host=HOST, findings=[f]), buf, verbose=True)
    buf.seek(0)
    lines = buf.read().splitlines()
    assert f"        {line} &&" in lines  # the printed block is one && chain (it stops at a failing line)
    assert "        export NCCL_DEBUG=INFO &&" in lines
    # A here-document pastes as written: its body and terminator stay at column 0, not indented.
    at = lines.index("        cat > /tmp/ds.json <<'ZD'")
    assert lines[at + 1:at + 3] == ['{"a": 1}', "ZD"]


def test_before_the_launch_command_only_above_scripts_that_change_the_launching_shell(state_home: Path):
    """A memlock drop-in acts on new logins, an install whenever it runs: "before the launch command" is
    said only above scripts of ``export``/``unset``/``VAR=`` lines, in the Markdown, HTML and TUI alike."""
    from zdoctor.core.present import script_label

    env = Remedy("Preload the system libstdc++", ["export LD_PRELOAD=/lib/libstdc++.so.6", "unset LD_LIBRARY_PATH"])
    drop_in = Remedy("Raise memlock", ["echo '* - memlock unlimited' | tee /etc/security/limits.d/90-memlock.conf"],
                     requires_root=True)
    assert script_label(env.commands).startswith("Run in bash, in order, before the launch command (")
    assert script_label(drop_in.commands) == "Run in bash, in order"
    f = Finding("gpu.limits.memlock", "warn", "ulimit -l is 8192 KiB", remedies=[env, drop_in])
    log = SessionLog.create("check", ["check"], HOST)
    log.record("finding", {"finding": f.to_dict()})
    log.close(0)
    events = load_events(log.id)
    md, doc = render(events, "md"), render(events, "html")
    option2 = md.split("**Option 2:", 1)[1]
    assert "before the launch command" not in option2 and "Run in bash, in order:" in option2
    assert "before the launch command (" in md.split("**Option 2:", 1)[0]
    assert doc.count("before the launch command") == 1 and "<p>Run in bash, in order:</p>" in doc


def test_terminal_playbook_lines_name_the_diagnosis_in_words():
    """`zdoctor check` ends each walk with its diagnosis's title (the node id after it), not the id alone."""
    from zdoctor.report.terminal import print_report
    from zdoctor.walk.doctor import CheckReport, PlaybookRun

    runs = [PlaybookRun("zero3-launch", "ZeRO-3", ["symptom", "diag-not-checked"], "diag-not-checked",
                        "reached diagnosis diag-not-checked: Not checked", "Not checked: torch is not in this "
                        "interpreter"),
            PlaybookRun("toolchain", "Toolchain", ["interpreter"], None, "predicate interpreter_found is false")]
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    print_report(CheckReport(host=HOST, findings=[], playbooks=runs), buf)
    buf.seek(0)
    text = buf.read()
    assert ("playbook zero3-launch: symptom -> diag-not-checked => Not checked: torch is not in this interpreter "
            "(diag-not-checked)") in text
    assert "=> no diagnosis: not: " in text and "predicate" not in text


def test_readme_and_help_speak_the_three_states_of_a_remedy():
    """The README and `--help` say "tried" / "not tried, because", not the older "verified" for a remedy."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for stale in ("each is verified by re-running", "marked unverified", "whether each was verified"):
        assert stale not in readme, stale
    help_text = subprocess.run([sys.executable, "-m", "zdoctor", "check", "--help"], capture_output=True,
                               text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "and to try remedies" in help_text and "to verify remedies" not in help_text


def test_the_start_screens_next_line_names_the_finding_by_its_title():
    """"Next: walk gpu-stack ...: gpu.limits.memlock warns" put a check id where a sentence belongs."""
    from zdoctor.walk.guide import next_step

    pyenv = {"target": {"explicit": True, "resolved": "/env/bin/python"}, "torch": {"installed": True}}
    warn = Finding("gpu.limits.memlock", "warn", "ulimit -l (locked memory) is 8192 KiB in the training shell")
    line = next_step([Finding("gpu.env.nccl-debug", "ok", "NCCL_DEBUG not set"), warn], pyenv)
    assert line == ("Next: walk gpu-stack (select it below), for a warning: ulimit -l (locked memory) is 8192 KiB "
                    "in the training shell")
    fail = Finding("libs.glibcxx", "fail", "cpu_adam.so needs GLIBCXX_3.4.30")
    assert next_step([warn, fail], pyenv).endswith("for a failure: cpu_adam.so needs GLIBCXX_3.4.30")


def test_a_session_whose_fixes_were_declined_or_practised_does_not_say_applied(state_home: Path):
    """The practice session declined one fix and practised another: nothing was applied, and the heading
    over them says what was done with the fixes; a session that applied one keeps "What was applied"."""
    installed_fixtures(state_home)
    md, doc = render(load_events(PRACTICE), "md"), render(load_events(PRACTICE), "html")
    assert "## What was applied" not in md and "## What was done with the fixes" in md
    assert "What was applied" not in doc and "<h2>What was done with the fixes</h2>" in doc
    assert "## What was applied" in render(load_events(APPLIED), "md")


def test_the_start_screen_suggests_only_a_walk_that_reaches_its_finding():
    """On the part 2 node (no GPU recorded) the gpu-stack walk ends at the driver step: the memlock warning is
    never on its path, so the start screen may not send the user there "for a warning"; every walk it does
    suggest, for every practice node, shows the finding it names."""
    from zdoctor.core.registry import load_vocabulary
    from zdoctor.host import ReplayHost
    from zdoctor.walk.doctor import run_checks
    from zdoctor.walk.guide import findings_on_walk, next_step
    from zdoctor.walk.playbook import load_all
    from zdoctor.walk.practice import load_scenarios

    load_vocabulary()
    books = load_all()
    for s in load_scenarios():
        host = ReplayHost.load(str(s.snapshot))
        _facts, found = run_checks(host)
        for f in [x for x in found if x.status in ("fail", "warn")]:
            line = next_step([f], None, replay=True, host=host, books=books)
            m = re.match(r"Next: walk (\S+) \(select it below\), for a (?:warning|failure): (.*)$", line)
            if m:
                assert m.group(2) == f.title and f.id in findings_on_walk(books[m.group(1)], host), (s.id, line)
            else:
                assert line.startswith("Next: read the ") and "no walk reaches it" in line, line
                assert all(f.id not in findings_on_walk(b, host) for b in books.values()), (s.id, f.id)
    part2 = ReplayHost.load(str(next(s for s in load_scenarios() if s.part == 2).snapshot))
    _facts, found = run_checks(part2)
    memlock = [f for f in found if f.id == "gpu.limits.memlock"]
    assert memlock and memlock[0].status == "warn"
    line = next_step(memlock, None, replay=True, host=part2, books=books)
    assert "walk gpu-stack" not in line and memlock[0].title in line


def test_counted_nouns_agree_with_their_number():
    """"(1 rows)", "1 NVMe drive(s)", "process(es)": every finding of every practice node says "1 row" /
    "2 rows"; a copy that lacks a needed version is no check mark."""
    from zdoctor.core.plural import count_of
    from zdoctor.host import ReplayHost
    from zdoctor.walk.doctor import check
    from zdoctor.walk.practice import load_scenarios

    assert [count_of(1, "row"), count_of(2, "row"), count_of(1, "process"), count_of(3, "process"),
            count_of(2, "copy")] == ["1 row", "2 rows", "1 process", "3 processes", "2 copies"]
    for s in load_scenarios():
        report = check(ReplayHost.load(str(s.snapshot)))
        for f in report.findings:
            for text in (f.title, f.detail or ""):
                assert not re.search(r"\w\((?:s|es)\)", text), (s.id, f.id, text[:200])
            if f.status == "ok":
                assert not re.search(r"\black(s)?\b|\bmissing\b|\bnot found\b", f.title), (s.id, f.id, f.title)
        by_id = {f.id: f for f in report.findings}
        if s.part == 2:
            assert by_id["storage.unmounted-nvme"].title.startswith("1 NVMe drive present but not mounted")
            assert "Job: 1 node x 8 GPUs" in by_id["offload.capacity"].detail
