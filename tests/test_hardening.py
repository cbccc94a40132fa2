"""Hostile inputs, tried as real zdoctor processes: bounded memory and time, nothing written through a
link it should not follow, secrets in command lines redacted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from envkit import system_libstdcxx
from hostilekit import RSS_BUDGET_MB, craft_looping_verneed, run_measured

from zdoctor.readers.elf import read_elf

# -- 1. bounded memory and time ---------------------------------------------------------------------


def _check_json(m) -> dict:
    assert not m.killed, f"ran past its wall limit ({m.wall_s:.1f}s): {m.stderr[-500:]}"
    assert m.peak_rss_mb < RSS_BUDGET_MB, f"peak RSS {m.peak_rss_mb:.0f} MB"
    assert "Traceback" not in m.stderr
    return json.loads(m.stdout)


def test_an_endless_printer_costs_bounded_memory(tmp_path: Path):
    """`--command yes` printed 3 GB into memory in 10 s: only the head and tail are kept while reading."""
    m = run_measured(["check", "--json", "--no-log", "--command", "yes", "--timeout", "5"], wall_limit=60)
    doc = _check_json(m)
    assert m.wall_s < 40
    live = next(f for f in doc["findings"] if any((e.get("label") or "").startswith("live trace")
                                                  for e in f["evidence"]))
    ev = next(e for e in live["evidence"] if (e.get("label") or "").startswith("live trace"))
    assert ev["truncated"] and "bytes cut" in ev["stdout"] and ev["stdout"].startswith("y\ny\n")
    assert len(ev["stdout"]) <= 64 * 1024 + 100


def test_a_looping_version_section_is_a_damaged_file_not_a_hang(tmp_path: Path):
    crafted = craft_looping_verneed(system_libstdcxx(), tmp_path / "libhostile.so")
    info = read_elf(str(crafted))
    assert info.kind == "corrupt" and ".gnu.version_r claims 4294967295 entries" in info.error
    m = run_measured(["check", "--json", "--no-log", "--ext", str(crafted)], wall_limit=90)
    doc = _check_json(m)
    text = json.dumps(doc["findings"])
    assert "corrupt ELF: .gnu.version_r claims 4294967295 entries" in text


def test_a_looping_libstdcxx_on_ld_library_path_is_reported_damaged(tmp_path: Path):
    lib = tmp_path / "lib"
    lib.mkdir()
    craft_looping_verneed(system_libstdcxx(), lib / "libstdc++.so.6")
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib)}
    doc = _check_json(run_measured(["check", "--json", "--no-log"], env=env, wall_limit=90))
    inv = next(f for f in doc["findings"] if f["id"] == "libs.inventory")
    assert inv["status"] == "warn" and "1 damaged" in inv["title"]
    assert f"{lib}/libstdc++.so.6: damaged, corrupt ELF" in inv["detail"]


@pytest.mark.parametrize("flag, what", [
    ("--ds-config", "ds_config"), ("--model-config", "model config"), ("--log", "training log"),
])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_fifos_and_devices_are_refused_before_opening(tmp_path: Path, flag: str, what: str, special: str):
    target = special
    if special == "fifo":
        target = str(tmp_path / "pipe")
        os.mkfifo(target)
    m = run_measured(["check", "--json", "--no-log", flag, target], wall_limit=60)
    doc = _check_json(m)
    assert m.wall_s < 40
    kind = "a FIFO (named pipe)" if special == "fifo" else "a character device"
    assert f"{target}: is {kind}, not a regular file; only regular files are read as a {what}" in json.dumps(doc)


@pytest.mark.parametrize("args", [["check", "--replay", "{}"], ["fleet", "--hostfile", "{}"],
                                  ["playbooks", "lint", "{}"]])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_named_inputs_that_are_not_regular_files_are_one_line_errors(tmp_path: Path, args: list[str],
                                                                     special: str):
    target = special
    if special == "fifo":
        target = str(tmp_path / "pipe")
        os.mkfifo(target)
    m = run_measured([a.replace("{}", target) for a in args], wall_limit=30)
    assert not m.killed and m.peak_rss_mb < RSS_BUDGET_MB
    lint = args[0] == "playbooks"  # a lint error: on standard output, exit code 1
    assert m.returncode == (1 if lint else 2)
    assert "only regular files are read" in (m.stdout if lint else m.stderr) and "Traceback" not in m.stderr


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_an_extension_that_is_not_a_regular_file_is_refused(tmp_path: Path, special: str):
    """The import probe would dlopen it: a FIFO as --ext blocked the check for its whole time limit."""
    target = special
    if special == "fifo":
        target = str(tmp_path / "pipe")
        os.mkfifo(target)
    m = run_measured(["check", "--json", "--no-log", "--ext", target], wall_limit=60)
    assert not m.killed and m.wall_s < 20 and m.returncode == 2
    assert f"--ext {target}: is a" in m.stderr and "only regular files are loaded as an extension" in m.stderr


def test_a_large_valid_config_is_read_in_bounded_memory(tmp_path: Path):
    """A 14 MB JSON array took 2.38 GB and 42 s: a position was kept for every element."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 3},
                               "x": list(range(1_700_000))}))
    assert cfg.stat().st_size > 14_000_000
    m = run_measured(["check", "--json", "--no-log", "--ds-config", str(cfg)], wall_limit=120)
    doc = _check_json(m)
    assert m.wall_s < 60
    assert not [f for f in doc["findings"] if f["status"] == "crash"]
    assert f"Read {cfg} as DeepSpeed" in json.dumps(doc)


def test_a_huge_training_log_is_read_from_its_end_in_bounded_memory(tmp_path: Path):
    line = (b"[2026-01-01 00:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd_microstep: 101.5 | "
            b"bwd_microstep: 200.1 | step_microstep: 300.2\n")
    log = tmp_path / "train.log"
    with open(log, "wb") as fh:  # 400 MB, mostly a hole: cheap to make, as large to read as a real one
        fh.write(line * 1000)
        fh.seek(400 * 1024 * 1024)
        fh.write(line * 1000)
    m = run_measured(["check", "--json", "--no-log", "--log", str(log)], wall_limit=120)
    doc = _check_json(m)
    assert not [f for f in doc["findings"] if f["status"] == "crash"]


HOSTILE_CONFIGS = {
    "digits.json": '{"train_batch_size": ' + "9" * 100_000 + "}",
    "deep.json": '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}",
    "latin1.json": b'{"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/tmp/caf\xe9"}}}',
    "binary.json": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("flag", ["--ds-config", "--model-config"])
@pytest.mark.parametrize("name", sorted(HOSTILE_CONFIGS))
def test_malformed_but_parseable_configs_are_findings_not_crashes(tmp_path: Path, flag: str, name: str):
    path = tmp_path / name
    data = HOSTILE_CONFIGS[name]
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    doc = _check_json(run_measured(["check", "--json", "--no-log", flag, str(path)], wall_limit=90))
    crashed = [f["id"] for f in doc["findings"] if f["status"] == "crash"]
    assert not crashed, crashed
    assert str(path) in json.dumps(doc)


# -- 2. nothing written through a link it should not follow --------------------------------------------


@pytest.fixture
def recorded_session(cli) -> None:
    r = cli(["check", "--json", "--playbook", "gpu-stack"])
    assert r.returncode in (0, 1, 3), r.stderr


def test_export_onto_a_link_to_a_fifo_is_refused(tmp_path: Path, recorded_session, cli):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "report.md"
    link.symlink_to(fifo)
    m = run_measured(["export", "--last", "--format", "md", "-o", str(link)], wall_limit=30)
    assert not m.killed, "hung on the FIFO behind the link"
    assert m.returncode == 2
    assert f"{link}: a symbolic link to a FIFO (named pipe) ({fifo}); refusing to write through it" in m.stderr
    assert link.is_symlink()


def test_snapshot_onto_a_link_to_a_block_device_is_refused(tmp_path: Path):
    if os.geteuid() != 0 or not shutil.which("losetup"):
        pytest.skip("attaching a loop device needs root and losetup")
    backing = tmp_path / "disk.img"
    backing.write_bytes(b"\0" * (1 << 20))
    attach = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True, text=True)
    if attach.returncode != 0:
        pytest.skip(f"no loop device: {attach.stderr.strip()}")
    dev = attach.stdout.strip()
    try:
        link = tmp_path / "snap.json"
        link.symlink_to(dev)
        m = run_measured(["snapshot", "-o", str(link), "--python", "/nonexistent/python"], wall_limit=90)
        assert m.returncode == 2, m.stderr
        assert f"{link}: a symbolic link to a block device ({dev}); refusing" in m.stderr
        with open(dev, "rb") as fh:
            assert fh.read(1 << 20) == b"\0" * (1 << 20), "the snapshot was written into the device"
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def test_devices_named_themselves_are_still_written(tmp_path: Path, recorded_session):
    m = run_measured(["export", "--last", "--format", "json", "-o", "/dev/stdout"], wall_limit=30)
    assert m.returncode == 0, m.stderr
    assert json.loads(m.stdout)
    assert run_measured(["export", "--last", "--format", "md", "-o", "/dev/null"], wall_limit=30).returncode == 0


def test_a_fifo_named_itself_without_a_reader_is_an_error_not_a_hang(tmp_path: Path, recorded_session):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    m = run_measured(["export", "--last", "--format", "md", "-o", str(fifo)], wall_limit=30)
    assert not m.killed and m.returncode == 2
    assert "no process read this FIFO within 10s" in m.stderr


def test_a_link_to_a_regular_file_is_replaced_not_followed(tmp_path: Path, recorded_session):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    link = tmp_path / "out.md"
    link.symlink_to(victim)
    m = run_measured(["export", "--last", "--format", "md", "-o", str(link)], wall_limit=30)
    assert m.returncode == 0, m.stderr
    assert victim.read_text() == "keep me\n" and not link.is_symlink()


def test_a_state_directory_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path, state_home: Path):
    target = tmp_path / "rootdir"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (state_home / "zdoctor").mkdir()
    (state_home / "zdoctor" / "sessions").symlink_to(target)
    m = run_measured(["check", "--json", "--playbook", "gpu-stack"], wall_limit=60)
    assert m.returncode in (0, 1, 3), m.stderr
    line = next(x for x in m.stderr.splitlines() if "session not recorded" in x)
    assert f"refusing session log directory {state_home}/zdoctor/sessions: it is a symbolic link" in line
    assert (target.stat().st_mode & 0o777) == 0o755 and not list(target.iterdir())


def test_a_state_directory_owned_by_another_user_is_refused(tmp_path: Path, state_home: Path):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    sessions = state_home / "zdoctor" / "sessions"
    sessions.mkdir(parents=True, mode=0o755)
    os.chown(sessions, 65534, 65534)
    os.chmod(sessions, 0o755)
    m = run_measured(["check", "--json", "--playbook", "gpu-stack"], wall_limit=60)
    assert m.returncode in (0, 1, 3), m.stderr
    assert f"refusing session log directory {sessions}: owned by uid 65534" in m.stderr
    assert (sessions.stat().st_mode & 0o777) == 0o755 and not list(sessions.iterdir())


# -- 3. secrets in command lines --------------------------------------------------------------------

SECRETS = ("hunter2", "tok123", "K3YVALUE", "pw55")
COMMAND = "python3 -c pass --password hunter2 --token=tok123 --api-key K3YVALUE https://usr:pw55@example.com/x"


def test_secrets_in_a_command_line_reach_no_output(tmp_path: Path, state_home: Path):
    check = run_measured(["check", "--json", "--command", COMMAND, "--timeout", "30"], wall_limit=90)
    assert check.returncode in (0, 1, 3), check.stderr
    verbose = run_measured(["check", "-v", "--no-log", "--command", COMMAND, "--timeout", "30"], wall_limit=90)
    snap = tmp_path / "snap.json"
    assert run_measured(["snapshot", "-o", str(snap), "--command", COMMAND, "--timeout", "30"],
                        wall_limit=90).returncode == 0
    sid = json.loads(check.stdout)["session"]
    outputs = {"check --json": check.stdout, "check -v": verbose.stdout, "snapshot": snap.read_text()}
    for fmt in ("md", "html", "json"):
        outputs[f"export {fmt}"] = run_measured(["export", "--session", sid, "--format", fmt]).stdout
    logs = list((state_home / "zdoctor" / "sessions").glob("*.jsonl"))
    outputs.update({f"log {p.name}": p.read_text() for p in logs})
    for where, text in outputs.items():
        assert "redacted" in text, where
        leaked = [s for s in SECRETS if s in text]
        assert not leaked, f"{where} shows {leaked}"
    assert "--password <redacted> --token=<redacted> --api-key <redacted> https://usr:<redacted>@example.com" \
        in outputs["check --json"]


# -- 7. a field named key -----------------------------------------------------------------------------


def test_a_setting_path_field_named_key_survives_redaction_in_a_replay(tmp_path: Path):
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(nvme)}}}))
    snap = tmp_path / "snap.json"
    assert run_measured(["snapshot", "-o", str(snap), "--ds-config", str(cfg)], wall_limit=90).returncode == 0
    replay = run_measured(["check", "-v", "--no-log", "--replay", str(snap)], wall_limit=60)
    assert "<redacted>:" not in replay.stdout
    assert "zero_optimization.offload_param.nvme_path" in snap.read_text()


# -- 5. one bad line never loses a session ------------------------------------------------------------


def _recorded(cli, state_home: Path) -> Path:
    r = cli(["check", "--json", "--playbook", "gpu-stack"])
    assert r.returncode in (0, 1, 3), r.stderr
    [log] = (state_home / "zdoctor" / "sessions").glob("*.jsonl")
    return log


def test_a_corrupted_middle_line_is_skipped_by_export_and_resume(cli, state_home: Path):
    from zdoctor.walk.session import SessionLog, load_events

    log = _recorded(cli, state_home)
    lines = log.read_bytes().split(b"\n")
    lines[3] = lines[3][: len(lines[3]) // 2] + b"\xff\xfe garbage"
    log.write_bytes(b"\n".join(lines))
    r = cli(["export", "--last", "--format", "json"])
    assert r.returncode == 0, r.stderr
    assert f"zdoctor: warning: {log}: 1 unreadable line skipped (line 4: malformed event" in r.stderr
    assert json.loads(r.stdout)["findings"]
    resumed = SessionLog.reopen(log.name[:-6])
    resumed.close(0)
    events = load_events(log)
    assert events[-2]["type"] == "session_resume" and events[-2]["skipped_lines"] == [4]
    seqs = [e["seq"] for e in events]
    assert len(seqs) == len(set(seqs))


def test_a_log_whose_head_was_zeroed_by_copytruncate_still_exports(cli, state_home: Path):
    log = _recorded(cli, state_home)
    log.write_bytes(b"\0" * 65536 + log.read_bytes())
    r = cli(["export", "--last", "--format", "md"])
    assert r.returncode == 0, r.stderr
    assert "65536 NUL bytes skipped" in r.stderr and "## Summary" in r.stdout


def test_two_processes_writing_one_session_get_distinct_seq_numbers(state_home: Path):
    from zdoctor.walk.session import SessionLog, load_events

    first = SessionLog.create("check", [], {"hostname": "h"})
    first.close(0)
    code = ("import sys\nfrom zdoctor.walk.session import SessionLog\nlog = SessionLog.reopen(sys.argv[1])\n"
            "for i in range(60):\n    log.record('note', {'i': i, 'who': sys.argv[2]})\nlog.close(0)\n")

    procs = [subprocess.Popen([sys.executable, "-c", code, first.id, who]) for who in ("a", "b")]
    assert [p.wait(60) for p in procs] == [0, 0]
    events = load_events(first.id)
    seqs = [e["seq"] for e in events]
    assert len(events) == 2 + 2 * 62 and not events.skipped
    assert len(seqs) == len(set(seqs)), "two events share a seq number"
    assert seqs == sorted(seqs)


def test_sigint_records_a_session_end(state_home: Path):
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "zdoctor", "check", "--command", "sleep 30", "--timeout", "60"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    sessions = state_home / "zdoctor" / "sessions"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not list(sessions.glob("*.jsonl")):
        time.sleep(0.1)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"interrupted" in err
    [log] = sessions.glob("*.jsonl")
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["type"] == "session_end" and last["exit_code"] == 130


# -- 6. zdoctor's own interpreter is not open to the caller's PYTHONPATH ---------------------------------

SITECUSTOMIZE = """import os, sys
print("GARBAGE FROM SITECUSTOMIZE")
with open({log!r}, "a") as fh:
    fh.write("sitecustomize %d %s\\n" % (os.getpid(), " ".join(sys.argv)))
"""
FAKE_PSUTIL = """with open({log!r}, "a") as fh:
    fh.write("fake psutil imported\\n")
raise ImportError("a module planted on PYTHONPATH")
"""


@pytest.fixture
def hostile_pythonpath(tmp_path: Path) -> tuple[dict[str, str], Path]:
    d = tmp_path / "pp"
    d.mkdir()
    log = tmp_path / "ran.log"
    (d / "sitecustomize.py").write_text(SITECUSTOMIZE.format(log=str(log)))
    (d / "psutil.py").write_text(FAKE_PSUTIL.format(log=str(log)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(d)
    return env, log


def _zdoctor_lines(log: Path) -> list[str]:
    """What ran inside zdoctor's own processes (the probes run the training interpreter, which keeps
    its PYTHONPATH on purpose)."""
    text = log.read_text() if log.exists() else ""
    return [x for x in text.splitlines() if "probe_script" not in x and not x.endswith(" -c")]


@pytest.mark.parametrize("how", ["module", "console"])
def test_pythonpath_reaches_neither_imports_nor_json_output(hostile_pythonpath, how: str):
    env, log = hostile_pythonpath
    if how == "console":
        script = Path(os.path.dirname(os.path.abspath(sys.executable))) / "zdoctor"
        if not script.exists():
            pytest.skip("zdoctor's console script is not installed next to this interpreter")
        r = subprocess.run([str(script), "check", "--json", "--no-log", "--playbook", "gpu-stack"],
                           capture_output=True, text=True, env=env, timeout=120, cwd=str(log.parent))
    else:
        r = subprocess.run([sys.executable, "-m", "zdoctor", "check", "--json", "--no-log", "--playbook",
                            "gpu-stack"], capture_output=True, text=True, env=env, timeout=120,
                           cwd=str(Path(__file__).resolve().parent.parent))
    assert r.returncode in (0, 1, 3), r.stderr
    doc = json.loads(r.stdout)  # one clean document: the start-up's buffered print was dropped
    assert doc["summary"]["total"] > 0
    ran = _zdoctor_lines(log)
    assert "fake psutil imported" not in ran
    # the interpreter that started zdoctor ran sitecustomize once before zdoctor's first line; the
    # isolated one that did the work did not
    assert len([x for x in ran if x.startswith("sitecustomize")]) <= 1


IN_PLACE = """import sys
from zdoctor.front.isolate import restart_isolated
restart_isolated(["--version"])
print("in place")
print(repr(sys.path))
import psutil
print(psutil.__file__)
"""


def test_a_pythonpath_that_loaded_nothing_is_dropped_in_place(hostile_pythonpath, tmp_path: Path):
    """PYTHONPATH alone, with nothing imported from it yet (no sitecustomize): its folders leave sys.path in
    this process, so a module planted there is not imported, and no second interpreter starts."""
    env, log = hostile_pythonpath
    planted = Path(env["PYTHONPATH"])
    (planted / "sitecustomize.py").unlink()
    env["HOME"] = str(tmp_path / "home")  # no user site directory
    r = subprocess.run([sys.executable, "-c", IN_PLACE], capture_output=True, text=True, env=env, timeout=60,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    said = r.stdout.splitlines()
    assert said[0] == "in place"  # a re-exec would have printed zdoctor's version instead
    assert str(planted) not in said[1]
    assert not said[2].startswith(str(planted)) and "fake psutil imported" not in (log.read_text()
                                                                                  if log.exists() else "")


def test_a_pythonpath_that_already_loaded_something_still_restarts_isolated(hostile_pythonpath, tmp_path: Path):
    """A sitecustomize on PYTHONPATH ran before zdoctor's first line: only a fresh ``python -I`` keeps what
    it set up (or shadowed) out, so the console path still re-executes."""
    env, log = hostile_pythonpath
    r = subprocess.run([sys.executable, "-c", IN_PLACE], capture_output=True, text=True, env=env, timeout=60,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "in place" not in r.stdout and r.stdout.startswith("zdoctor ")
    assert len([x for x in log.read_text().splitlines() if x.startswith("sitecustomize")]) == 1  # not in -I


def test_a_user_site_directory_on_sys_path_still_restarts_isolated(hostile_pythonpath, tmp_path: Path):
    """sudo that keeps HOME puts the training user's site directory on root's sys.path: only ``python -I``
    leaves it out, so the console path re-executes even though nothing was loaded from PYTHONPATH."""
    env, _log = hostile_pythonpath
    (Path(env["PYTHONPATH"]) / "sitecustomize.py").unlink()
    home = tmp_path / "home"
    user_site = subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"],
                               capture_output=True, text=True, env={**env, "HOME": str(home)}).stdout.strip()
    Path(user_site).mkdir(parents=True)
    r = subprocess.run([sys.executable, "-c", IN_PLACE], capture_output=True, text=True,
                       env={**env, "HOME": str(home)}, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "in place" not in r.stdout and r.stdout.startswith("zdoctor ")


def test_a_user_site_another_account_owns_restarts_isolated_without_pythonpath(tmp_path: Path):
    """Root started with the training user's HOME (sudo keeping it): that user's site directory is on
    sys.path, and a module planted there would run as root; the console path re-executes ``python -I``."""
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONUNBUFFERED")}
    env["HOME"] = str(tmp_path / "home")
    user_site = Path(subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"],
                                    capture_output=True, text=True, env=env).stdout.strip())
    user_site.mkdir(parents=True)
    log = tmp_path / "ran.log"
    (user_site / "psutil.py").write_text(FAKE_PSUTIL.format(log=str(log)))
    mine = subprocess.run([sys.executable, "-c", IN_PLACE], capture_output=True, text=True, env=env, timeout=60,
                          cwd=str(tmp_path))
    assert mine.stdout.startswith("in place")  # root's own user site: nothing to leave out (its psutil ran)
    log.unlink()
    os.chown(user_site, 65534, 65534)
    r = subprocess.run([sys.executable, "-c", IN_PLACE], capture_output=True, text=True, env=env, timeout=60,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "in place" not in r.stdout and r.stdout.startswith("zdoctor ")
    assert not log.exists()


def test_console_with_a_planted_module_on_pythonpath_imports_the_real_one(hostile_pythonpath):
    env, log = hostile_pythonpath
    (Path(env["PYTHONPATH"]) / "sitecustomize.py").unlink()
    script = Path(os.path.dirname(os.path.abspath(sys.executable))) / "zdoctor"
    if not script.exists():
        pytest.skip("zdoctor's console script is not installed next to this interpreter")
    r = subprocess.run([str(script), "check", "--json", "--no-log", "--playbook", "gpu-stack"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=str(log.parent))
    assert r.returncode in (0, 1, 3), r.stderr
    assert json.loads(r.stdout)["summary"]["total"] > 0
    assert "fake psutil imported" not in _zdoctor_lines(log)


def test_started_isolated_nothing_from_pythonpath_runs(hostile_pythonpath, tmp_path: Path):
    env, log = hostile_pythonpath
    r = subprocess.run([sys.executable, "-I", "-m", "zdoctor", "check", "--json", "--no-log", "--playbook",
                        "gpu-stack"], capture_output=True, text=True, env=env, timeout=120, cwd=str(tmp_path))
    if r.returncode not in (0, 1, 3) and "No module named zdoctor" in r.stderr:
        pytest.skip("zdoctor is not installed in this interpreter (only a checkout)")
    assert json.loads(r.stdout)["summary"]["total"] > 0
    assert _zdoctor_lines(log) == []


# -- 7. smaller ones ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loader_kit(tmp_path_factory) -> dict[str, Path]:
    from envkit import build_extension

    root = tmp_path_factory.mktemp("loaderkit")
    exts = root / "exts"
    build_extension(exts, "needsnew")
    return {"root": root, "exts": exts}


def _import_cmd(exts: Path) -> str:
    import shlex

    return shlex.join([os.path.realpath(sys.executable), "-c",
                       f"import sys; sys.path.insert(0, {str(exts)!r}); import needsnew"])


def _clean_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "TORCH_EXTENSIONS_DIR"))}
    env.update(changes)
    return env


def test_an_undecodable_byte_in_a_path_round_trips_through_the_undo_line(loader_kit, tmp_path: Path):
    from envkit import make_old_libstdcxx

    old = make_old_libstdcxx(tmp_path / "old").parent
    keep = os.fsdecode(bytes(tmp_path) + b"/keep\xff")
    os.mkdir(keep)
    value = f"{old}:{keep}"
    m = run_measured(["check", "--json", "--no-log", "--timeout", "60", "--python", os.path.realpath(sys.executable),
                      "--command", _import_cmd(loader_kit["exts"]), "--playbook", "zero3-launch"],
                     env=_clean_env(LD_LIBRARY_PATH=value), wall_limit=240)
    doc = json.loads(m.stdout)
    fix = next(r for f in doc["findings"] if f["id"] == "libs.glibcxx" for r in f["remedies"]
               if r["commands"] and r["commands"][0].startswith("export LD_LIBRARY_PATH="))
    [undo] = fix["undo"]
    assert "\udcff" not in undo and "\\udcff" not in json.dumps(undo)
    assert "\\xff" in undo
    for line, expected in ((fix["commands"][0], os.fsencode(keep)), (undo, os.fsencode(value))):
        out = subprocess.run(["bash", "-c", line + '\nprintf %s "$LD_LIBRARY_PATH"'], capture_output=True,
                             env=_clean_env(), timeout=30)
        assert out.stdout == expected, (line, out.stdout)


def test_a_newline_in_a_path_is_no_false_disagreement(loader_kit, tmp_path: Path):
    """A libstdc++ found in a folder whose name holds a newline: ld.so's LD_DEBUG line for it spans two
    lines, which read as a lookup that found nothing, and the check claimed the emulation was wrong."""
    odd = tmp_path / "good\nlib"
    odd.mkdir()
    shutil.copy2(system_libstdcxx(), odd / "libstdc++.so.6")
    [ext] = loader_kit["exts"].glob("needsnew*.so")
    m = run_measured(["check", "--json", "--no-log", "--timeout", "60", "--ext", str(ext),
                      "--command", _import_cmd(loader_kit["exts"]), "--playbook", "zero3-launch"],
                     env=_clean_env(LD_LIBRARY_PATH=str(odd)), wall_limit=240)
    doc = json.loads(m.stdout)
    assert not [f for f in doc["findings"] if f["id"] == "libs.prediction"], "false disagreement"
    live = next(f for f in doc["findings"] if f["id"] == "libs.live")
    assert live["status"] == "ok"
    assert f"it loaded {odd}/libstdc++.so.6 [LD_LIBRARY_PATH]" in live["detail"]


def test_a_python_wrapper_that_leaves_a_child_running_is_reported_as_such(tmp_path: Path):
    wrapper = tmp_path / "python-wrapper"
    marker = tmp_path / "daemon.pid"
    wrapper.write_text("#!/bin/sh\n# starts a helper that keeps our output open, then runs python\n"
                       f"( sleep 120 & echo $! > {marker} )\n"
                       f"exec {os.path.realpath(sys.executable)} \"$@\"\n")
    wrapper.chmod(0o755)
    m = run_measured(["check", "--json", "--no-log", "--python", str(wrapper), "--timeout", "30"], wall_limit=120)
    doc = json.loads(m.stdout)
    assert m.wall_s < 30, "waited for the helper as if the interpreter hung"
    text = json.dumps(doc["findings"])
    assert "hang?" not in text and "did not start" not in text
    pyenv = [f for f in doc["findings"] if f["id"].startswith("pyenv.")]
    assert pyenv and not [f for f in pyenv if f["status"] == "crash"]
    if marker.exists():  # the helper is ended as soon as the interpreter that left it exits
        pid = int(marker.read_text())
        with pytest.raises(ProcessLookupError):
            for _ in range(50):
                os.kill(pid, 0)
                import time

                time.sleep(0.1)


def test_trace_folders_of_a_killed_zdoctor_are_swept_by_the_next_run(tmp_path: Path):
    import signal
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "zdoctor", "check", "--no-log", "--command", "sleep 20",
                             "--timeout", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(tmp.glob("zdoctor-trace-*")):
        time.sleep(0.1)
    left = list(tmp.glob("zdoctor-trace-*"))
    assert left, "no trace folder appeared"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert all(p.exists() for p in left)  # nothing can clean up after SIGKILL ...
    foreign = tmp / "zdoctor-trace-1-keepme"  # ... and a live process's folder is never touched
    foreign.mkdir()
    r = subprocess.run([sys.executable, "-m", "zdoctor", "check", "--json", "--no-log", "--command", "true",
                        "--timeout", "30"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode in (0, 1, 3), r.stderr
    assert not [p for p in left if p.exists()], "the killed run's trace folder was left behind"
    assert foreign.exists() and not [p for p in tmp.glob("zdoctor-trace-*") if p != foreign]
