"""Every subcommand and every exit code, through the real `python -m zdoctor` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO


def one_line_error(proc) -> str:
    """The process failed with exactly one line on stderr and no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_version(cli):
    proc = cli(["--version"])
    assert proc.returncode == 0
    assert proc.stdout.strip() == "zdoctor 0.1.0"


@pytest.mark.parametrize("args", [
    ["--bogus"], ["check", "--bogus"], ["nosuchcommand"], ["export", "--format", "md"],
    ["export", "--last", "--format", "pdf"], ["playbooks"], ["snapshot"],
])
def test_usage_errors_exit_2_with_one_line(cli, args):
    proc = cli(args)
    assert proc.returncode == 2
    assert one_line_error(proc).startswith("zdoctor")


def test_no_arguments_without_a_terminal_runs_the_check(cli):
    proc = cli([])
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert "findings:" in proc.stdout
    assert "toolchain" in proc.stdout


def test_a_bare_zdoctor_parses_as_the_whole_command_line_would():
    """``zdoctor`` alone builds only the parser's top level; what it parses is what the whole parser gives."""
    from zdoctor.front.cli import OPTION_KEYS, TARGET_DEFAULTS, build_parser, parse_args

    whole = vars(build_parser().parse_args([]))
    for key, value in {**TARGET_DEFAULTS, **{k: None for k in OPTION_KEYS}}.items():
        whole.setdefault(key, list(value) if isinstance(value, list) else value)
    assert vars(parse_args([])) == whole
    assert whole["command"] is None


FINISH = """import sys
from zdoctor.proc import scratch
from zdoctor.front.finish import finish
print(scratch.run_folder())
sys.stdout.write("x" * 200000)
finish(3)
"""


def test_the_process_ends_with_its_output_whole_and_its_exit_handlers_run(tmp_path):
    """zdoctor skips the interpreter's own shutdown: what it printed still arrives whole (a pipe's buffer
    flushed), the exit code is the command's, and the exit handlers still ran (the run's scratch folder is
    removed)."""
    proc = subprocess.run([sys.executable, "-c", FINISH], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TMPDIR=str(tmp_path)), cwd=str(tmp_path))
    assert proc.returncode == 3, proc.stderr
    folder, rest = proc.stdout.split("\n", 1)
    assert Path(folder).parent == tmp_path and not Path(folder).exists()
    assert rest == "x" * 200000


def test_a_check_through_the_module_entry_prints_one_whole_document(cli, tmp_path):
    proc = cli(["check", "--json", "--no-log"], env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == proc.returncode
    assert not list(tmp_path.glob("zdoctor-run-*"))


def _snapshot(name: str) -> str:
    if name == "healthy":
        return str(FIXTURES / "snapshots" / "healthy.json")
    from zdoctor.walk.practice import get_scenario

    return str(get_scenario(name).snapshot)


@pytest.mark.parametrize("fmt", [[], ["--json"]], ids=["text", "json"])
def test_a_reader_that_went_away_leaves_the_checks_verdict_as_its_exit_code(cli, fmt):
    """`zdoctor check | head`: the reader is gone before the report is written. The exit code is still the
    check's verdict (what it is with the report read whole): not 1 for "a check failed" (rich's own exit on a
    broken pipe), not 0 for "nothing failed", and no traceback."""
    verdicts = {}
    for name in ("healthy", "conda-ld-library-path"):
        args = ["check", "--no-log", *fmt, "--replay", _snapshot(name)]
        whole = cli(args)
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            gone = subprocess.run([sys.executable, "-m", "zdoctor", *args], stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, timeout=120, cwd=str(REPO),
                                  stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
        finally:
            os.close(write_end)
        assert gone.returncode == whole.returncode, gone.stderr
        assert "Traceback" not in gone.stderr and "Exception ignored" not in gone.stderr, gone.stderr
        verdicts[name] = whole.returncode
    assert verdicts == {"healthy": 0, "conda-ld-library-path": 1}


FLEET_TO_A_GONE_READER = """import sys
sys.path.insert(0, {tests!r})
from fleetkit import h200_report
from zdoctor.front.finish import finish
from zdoctor.report.console import print_whatever_is_read
from zdoctor.report.fleettext import print_fleet
report = h200_report()
print_whatever_is_read(lambda: print_fleet(report))
sys.stderr.write("the command goes on with verdict %d\\n" % report.exit_code)
finish(7)
"""


def test_a_fleet_report_to_a_reader_that_went_away_returns_to_the_command(tmp_path):
    """`zdoctor fleet` prints through the same helper as `check`: a reader that went away ends the printing,
    not the process (rich's own exit would give 1 here), so the command still returns its verdict."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        gone = subprocess.run([sys.executable, "-c", FLEET_TO_A_GONE_READER.format(tests=str(REPO / "tests"))],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, cwd=str(tmp_path),
                              env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)})
    finally:
        os.close(write_end)
    assert gone.returncode == 7 and "Traceback" not in gone.stderr, gone.stderr
    assert "the command goes on with verdict 1" in gone.stderr


def test_check_json_document(cli):
    proc = cli(["check", "--json"])
    doc = json.loads(proc.stdout)
    assert set(doc) >= {"version", "host", "findings", "summary", "playbooks", "session"}
    failing = [f for f in doc["findings"] if f["status"] in ("fail", "crash")]
    unexplained = [s for s in doc["symptoms"] if not s["explained_by"]]
    only_env = all(f["id"].startswith("pyenv.") for f in failing)
    expected = 3 if doc["incomplete"] and not unexplained and only_env else 1 if failing or unexplained else 0
    assert proc.returncode == doc["exit_code"] == expected
    for f in doc["findings"]:
        assert set(f) >= {"id", "status", "title", "detail", "evidence", "remedies"}
        assert f["status"] in ("ok", "warn", "fail", "skip", "crash")
        for r in f["remedies"]:
            assert set(r) >= {"title", "commands", "verified", "requires_root", "undo"}
    assert doc["summary"]["total"] == len(doc["findings"])
    ids = {f["id"] for f in doc["findings"]}
    assert any(i.startswith("toolchain.") for i in ids)
    assert any(i.startswith("pyenv.") for i in ids)


def test_check_with_a_missing_interpreter_is_incomplete_with_exit_3_and_fails_it(cli, tmp_path):
    missing = tmp_path / "no such env" / "bin" / "python"
    proc = cli(["check", "--json", "--python", str(missing)])
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    failing = [f for f in doc["findings"] if f["status"] == "fail"]
    assert any(str(missing) in f["title"] + f["detail"] for f in failing)


def test_check_passes_with_exit_0_on_a_healthy_replay(cli):
    proc = cli(["check", "--json", "--replay", str(FIXTURES / "snapshots" / "healthy.json")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["host"]["kind"] == "replay"
    assert not [f for f in doc["findings"] if f["status"] in ("fail", "crash")]


def test_text_report_marks_and_count(cli):
    proc = cli(["check", "--replay", str(FIXTURES / "snapshots" / "healthy.json")])
    assert proc.returncode == 0
    assert "✓" in proc.stdout
    assert "findings:" in proc.stdout.splitlines()[-2] + proc.stdout.splitlines()[-1]


@pytest.mark.parametrize("content, needle", [
    ("{not json", "malformed JSON"), ('{"format": "other"}', "not a zdoctor snapshot"), ("", "malformed JSON"),
])
def test_check_replay_bad_input(cli, tmp_path, content, needle):
    snap = tmp_path / "snap.json"
    snap.write_text(content)
    proc = cli(["check", "--replay", str(snap)])
    assert proc.returncode == 2
    assert needle in one_line_error(proc)


def test_check_replay_missing_and_unreadable(cli, tmp_path):
    proc = cli(["check", "--replay", str(tmp_path / "nope.json")])
    assert proc.returncode == 2 and "no such file" in one_line_error(proc)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    proc = cli(["check", "--replay", str(binary)])
    assert proc.returncode == 2
    one_line_error(proc)


def test_check_replay_and_python_exclude_each_other(cli, tmp_path):
    for extra in (["--python", "python3"], ["--command", "true"], ["--ds-config", "x.json"], ["--nodes", "2"]):
        proc = cli(["check", "--replay", "x.json", *extra])
        assert proc.returncode == 2 and "exclude" in one_line_error(proc)


def test_check_unknown_playbook(cli, state_home):
    proc = cli(["check", "--playbook", "no-such-playbook"])
    assert proc.returncode == 2 and "no-such-playbook" in one_line_error(proc)
    assert not list(state_home.rglob("*.jsonl")), "a refused command records no session"


def test_snapshot_then_replay_gives_the_same_findings(cli, tmp_path):
    snap = tmp_path / "node.json"
    proc = cli(["snapshot", "-o", str(snap)])
    assert proc.returncode == 0, proc.stderr
    assert oct(snap.stat().st_mode & 0o777) == "0o600"
    doc = json.loads(snap.read_text())
    assert doc["format"] == "zdoctor-snapshot"
    assert {"system", "pyenv", "toolchain"} <= set(doc["probes"])
    live = json.loads(cli(["check", "--json"]).stdout)
    replay = json.loads(cli(["check", "--json", "--replay", str(snap)]).stdout)
    again = json.loads(cli(["check", "--json", "--replay", str(snap)]).stdout)
    assert replay["findings"] == again["findings"]

    def key(doc):
        # The processes running on the machine change between two runs; everything else must not.
        return [(f["id"], f["status"], f["title"], f["detail"], f["remedies"]) for f in doc["findings"]
                if not f["id"].startswith("hangs.processes")]

    assert key(replay) == key(live)
    assert [p["path"] for p in replay["playbooks"]] == [p["path"] for p in live["playbooks"]]


def test_snapshot_to_an_unwritable_place(cli, tmp_path):
    proc = cli(["snapshot", "-o", str(tmp_path / "missing-dir" / "s.json")])
    assert proc.returncode == 2
    assert "does not exist" in one_line_error(proc)
    proc = cli(["snapshot", "-o", str(tmp_path)])
    assert proc.returncode == 2 and "is a directory" in one_line_error(proc)


def test_session_is_logged_and_exported(cli, tmp_path, state_home):
    proc = cli(["check", "--json", "--replay", str(FIXTURES / "snapshots" / "healthy.json")])
    sid = json.loads(proc.stdout)["session"]
    log = state_home / "zdoctor" / "sessions" / f"{sid}.jsonl"
    assert log.exists() and oct(log.stat().st_mode & 0o777) == "0o600"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "session_start" and types[-1] == "session_end"
    probed = [e["result"]["probe"] for e in events if e["type"] == "probe_result"]
    assert sorted(probed) == sorted(set(probed)), "each probe result is logged once"
    assert {"probe_result", "finding", "summary", "edge", "playbook_end"} <= set(types)

    md = cli(["export", "--last", "--format", "md"])
    assert md.returncode == 0 and sid in md.stdout and "toolchain" in md.stdout
    html = cli(["export", "--session", sid, "--format", "html"])
    assert html.returncode == 0 and "<html" in html.stdout.lower()
    out = tmp_path / "s.json"
    js = cli(["export", "--session", sid, "--format", "json", "-o", str(out)])
    assert js.returncode == 0
    assert len(json.loads(out.read_text())["events"]) == len(types)


def test_check_no_log_writes_nothing(cli, state_home):
    proc = cli(["check", "--json", "--no-log", "--replay", str(FIXTURES / "snapshots" / "healthy.json")])
    assert json.loads(proc.stdout)["session"] is None
    assert not list(state_home.rglob("*.jsonl"))


def test_check_still_runs_when_the_state_dir_is_unwritable(cli, tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    env = dict(os.environ, XDG_STATE_HOME=str(blocked))
    proc = cli(["check", "--json", "--replay", str(FIXTURES / "snapshots" / "healthy.json")], env=env)
    assert proc.returncode == 0
    assert "session not recorded" in one_line_error(proc)


def test_export_errors(cli):
    proc = cli(["export", "--last", "--format", "md"])
    assert proc.returncode == 2 and "no recorded sessions" in one_line_error(proc)
    proc = cli(["export", "--session", "../../etc/passwd", "--format", "md"])
    assert proc.returncode == 2
    one_line_error(proc)
    proc = cli(["export", "--session", "20200101T000000-abcd", "--format", "md"])
    assert proc.returncode == 2
    one_line_error(proc)


def test_playbooks_list_show_lint(cli):
    proc = cli(["playbooks", "list"])
    assert proc.returncode == 0 and "toolchain" in proc.stdout
    proc = cli(["playbooks", "show", "toolchain"])
    assert proc.returncode == 0 and "toolchain" in proc.stdout
    proc = cli(["playbooks", "show", "nope"])
    assert proc.returncode == 2 and "nope" in one_line_error(proc)
    proc = cli(["playbooks", "lint"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_playbooks_lint_reports_broken_files(cli, tmp_path):
    bad = tmp_path / "broken.toml"
    bad.write_text('id = "broken"\ntitle = "t"\nsummary = "s"\nstart = "a"\n'
                   '[nodes.a]\nkind = "probe"\ntitle = "A"\nwhy = "w"\nexplain = "e"\nprobes = ["no_such_probe"]\n'
                   '[[nodes.a.next]]\nto = "b"\n'
                   '[nodes.b]\nkind = "diagnosis"\ntitle = "B"\nwhy = "w"\nexplain = "e"\n'
                   '[nodes.orphan]\nkind = "diagnosis"\ntitle = "O"\nwhy = "w"\nexplain = ""\n')
    proc = cli(["playbooks", "lint", str(bad)])
    assert proc.returncode == 1
    out = proc.stdout
    assert f"{bad}:a:" in out and "no_such_probe" in out
    assert f"{bad}:orphan:" in out
    malformed = tmp_path / "malformed.toml"
    malformed.write_text('id = "malformed"\n[nodes.a\n')
    proc = cli(["playbooks", "lint", str(malformed)])
    assert proc.returncode == 1 and f"{malformed}" in proc.stdout and "Traceback" not in proc.stderr
    proc = cli(["playbooks", "lint", str(tmp_path / "missing.toml")])
    assert proc.returncode == 2 and "no such file" in one_line_error(proc)


def test_hostile_path_names_stay_inert(cli, tmp_path):
    hostile = tmp_path / "a b $(touch pwned); `touch pwned2`"
    hostile.mkdir()
    proc = cli(["check", "--json", "--python", str(hostile / "python")], cwd=str(tmp_path))
    assert proc.returncode == 3  # the interpreter is not there: incomplete
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    assert not Path("pwned").exists()


def test_tui_subcommand_without_a_terminal_runs_the_check(cli):
    proc = cli(["tui", "--python", "python3"])
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert "findings:" in proc.stdout


def test_an_internal_error_is_one_line(monkeypatch, capsys):
    from zdoctor.front import cli as cli_mod
    from zdoctor.walk import doctor

    def broken(*_a, **_k):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(doctor, "check", broken)
    monkeypatch.delenv("ZDOCTOR_DEBUG", raising=False)
    assert cli_mod.main(["check", "--no-log"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["zdoctor: internal error: RuntimeError: simulated bug (ZDOCTOR_DEBUG=1 shows the traceback)"]
    monkeypatch.setenv("ZDOCTOR_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli_mod.main(["check", "--no-log"])


def test_bad_job_options_are_one_line_errors_before_probing(cli):
    for args, needle in ((["--model-params", "abc"], "not a count"), (["--io-size", "lots"], "expected a size"),
                         (["--nodes", "0"], "at least 1"), (["--ds-config", "/no/such.json"], "no such file"),
                         (["--log", "/no/such.log"], "no such file")):
        proc = cli(["check", "--no-log", *args])
        assert proc.returncode == 2 and needle in one_line_error(proc)


def test_job_options_work_without_a_command(cli, tmp_path):
    """`zdoctor --ds-config f` (no `check`, no `tui`) runs like `zdoctor check --ds-config f` off a terminal,
    and an option given before the command is not lost."""
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}', encoding="utf-8")
    for args in (["--ds-config", str(cfg)], ["--ds-config", str(cfg), "check"], ["check", "--ds-config", str(cfg)]):
        proc = cli([*args, "--playbook", "offload-bottleneck"] if "check" in args else args, timeout=300)
        assert "invalid choice" not in proc.stderr and proc.returncode in (0, 1, 3), (args, proc.stderr)
        line = next(x for x in proc.stdout.splitlines() if x.rstrip().endswith("(offload.config)"))
        assert "stage 3" in line and "offload_optimizer cpu" in line, (args, line)
    proc = cli(["--ds-config", str(tmp_path / "missing.json")])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "missing.json: no such file" in proc.stderr
    proc = cli(["--model-params", "lots"])
    assert proc.returncode == 2 and "not a count" in proc.stderr


def test_python_is_one_option_wherever_it_is_given():
    from zdoctor.front.cli import parse_args

    assert parse_args(["--python", "/a/python", "check"]).python == "/a/python"
    assert parse_args(["check", "--python", "/b/python"]).python == "/b/python"
    assert parse_args(["--python", "/a/python", "snapshot", "-o", "-", "--python", "/b/python"]).python == "/b/python"
    assert parse_args(["tui"]).python is None
    # the fleet's --python is another thing: the interpreter on the nodes, not this machine's training
    args = parse_args(["--python", "/a/python", "fleet", "--python", "/nodes/python"])
    assert args.python == "/a/python" and args.sub_python == "/nodes/python"
