"""The symptom ledger: what the user saw is the root of the check. Real failing commands (the real loader on
a real old libstdc++, a real traceback, a real SIGKILL, a real hang on a FIFO), each symptom explained by a
finding that names its concrete content, or shown as unexplained, with the catalogue's likely cause "from
the message only" where it knows the message."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from envkit import build_extension, make_old_libstdcxx

from zdoctor.core.errors import InputError
from zdoctor.core.registry import load_vocabulary
from zdoctor.symptoms.catalogue import SIGNATURES
from zdoctor.symptoms.extract import from_run, from_text
from zdoctor.symptoms.view import ledger_entries
from zdoctor.walk.playbook import load_playbook
from zdoctor.walk.playbook_lint import lint_path

PY = os.path.realpath(sys.executable)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "TORCH_EXTENSIONS_DIR"))}
    env.update(extra)
    return env


def check(args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, dict]:
    proc = run_cli(["check", "--json", "--no-log", "--timeout", "60", *args], env=env or clean_env(), timeout=timeout)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def unexplained(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["id"].startswith("symptom.unexplained.")]


def ends(doc: dict) -> dict[str, str]:
    return {p["id"]: p["diagnosis"] for p in doc["playbooks"]}


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("symptom-kit")
    old = make_old_libstdcxx(root / "old").parent
    exts = root / "exts"
    build_extension(exts, "needsnew")
    return {"old": old, "exts": exts}


def import_cmd(exts: Path, module: str) -> str:
    return shlex.join([PY, "-c", f"import sys; sys.path.insert(0, {str(exts)!r}); import {module}"])


# -- extraction ---------------------------------------------------------------------------------------

def test_a_real_traceback_gives_its_final_line_and_the_loader_message_its_fields(broken):
    env = clean_env(LD_LIBRARY_PATH=str(broken["old"]))
    real = subprocess.run(["bash", "-c", import_cmd(broken["exts"], "needsnew")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert real.returncode == 1 and "Traceback (most recent call last):" in real.stderr
    (s,) = from_run(real.returncode, False, real.stdout, real.stderr)
    assert s.kind == "version-not-found" and s.signature == "loader.glibcxx-version"
    assert s.fields["version"] == "GLIBCXX_3.4.30"
    assert s.fields["object"].endswith("needsnew.so") and s.fields["library"] == f"{broken['old']}/libstdc++.so.6"
    assert s.text.startswith("ImportError: ") and s.source == "command"


def test_how_a_run_ended_is_a_symptom_when_no_line_says_more():
    killed = subprocess.run(["sh", "-c", "kill -9 $$"], capture_output=True, text=True)
    (s,) = from_run(killed.returncode, False, killed.stdout, killed.stderr)
    assert (s.kind, s.fields, s.text) == ("killed", {"signal": "9"}, "the command was ended by SIGKILL")
    quiet = subprocess.run(["sh", "-c", "exit 4"], capture_output=True, text=True)
    (s,) = from_run(quiet.returncode, False, quiet.stdout, quiet.stderr)
    assert (s.kind, s.fields) == ("exit-status", {"code": "4"})
    assert from_run(0, False, "all good\n", "") == []
    # a bash job line "Killed" and the exit by SIGKILL are one symptom, not two
    found = from_run(-9, False, "", "run.sh: line 3:  4242 Killed                  python train.py\n")
    assert [(s.kind, s.fields.get("signal")) for s in found] == [("killed", "9")]


def test_the_same_message_printed_twice_is_one_symptom_and_noise_is_dropped():
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "RuntimeError: Error building extension 'cpu_adam'\n\nDuring handling of the above exception, another "
            "exception occurred:\n\nTraceback (most recent call last):\n  File \"x.py\", line 3\n"
            "RuntimeError: Error building extension 'cpu_adam'\n")
    (s,) = from_text(text, "log", "train.log")
    assert s.kind == "build-failed" and s.fields == {"op": "cpu_adam"} and s.where == "train.log line 3"


def test_every_catalogue_entry_has_a_source_a_meaning_and_a_pattern_that_compiles():
    ids = [s.id for s in SIGNATURES]
    assert len(ids) == len(set(ids))
    for s in SIGNATURES:
        assert s.sources and all(src.strip() for src in s.sources), s.id
        assert s.meaning and s.read_next and s.layer and s.kind, s.id
        assert s.regex.groups == len(s.regex.groupindex), s.id  # every group is a named field
    load_vocabulary()
    from zdoctor.core.registry import CHECKS

    for s in SIGNATURES:
        assert all(c in CHECKS for c in s.confirm), (s.id, s.confirm)


# -- the ledger end to end -----------------------------------------------------------------------------

def test_a_real_glibcxx_failure_is_explained_by_the_finding_with_that_version_and_object(broken):
    env = clean_env(LD_LIBRARY_PATH=str(broken["old"]))
    rc, doc = check(["--python", PY, "--command", import_cmd(broken["exts"], "needsnew"),
                     "--playbook", "zero3-launch"], env)
    assert rc == 1
    (s,) = doc["symptoms"]
    assert s["kind"] == "version-not-found" and "GLIBCXX_3.4.30" in s["text"]
    assert "libs.glibcxx" in s["explained_by"]
    (f,) = [f for f in doc["findings"] if f["id"] == "libs.glibcxx" and f["status"] == "fail"]
    assert f["explains"] == [s["id"]]
    assert unexplained(doc) == []
    assert ends(doc)["zero3-launch"] == "diag-ld-library-path"


def test_a_pasted_message_about_another_object_is_not_explained_by_this_one(broken):
    env = clean_env(LD_LIBRARY_PATH=str(broken["old"]))
    other = "ImportError: /opt/x/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /opt/other/op.so)"
    rc, doc = check(["--python", PY, "--command", import_cmd(broken["exts"], "needsnew"), "--symptom", other,
                     "--playbook", "zero3-launch"], env)
    by_text = {s["text"]: s for s in doc["symptoms"]}
    assert by_text[other]["source"] == "user" and by_text[other]["explained_by"] == []
    assert any("/opt/other/op.so" in f["title"] for f in unexplained(doc))
    assert rc == 1


def test_an_unknown_failure_ends_the_open_walks_in_unexplained_and_quotes_it():
    cmd = shlex.join([PY, "-c", "def f():\n    raise RuntimeError('frobnicator misaligned on rank 3')\nf()"])
    rc, doc = check(["--python", PY, "--command", cmd])
    assert rc == 1
    (s,) = doc["symptoms"]
    assert s["text"] == "RuntimeError: frobnicator misaligned on rank 3" and s["explained_by"] == []
    assert s["signature"] is None
    (f,) = unexplained(doc)
    assert f["status"] == "fail" and f["title"] == 'Unexplained: "RuntimeError: frobnicator misaligned on rank 3"'
    assert "Not examined:" in f["detail"] and "Likely cause" not in f["detail"]
    # the launch walk would have said "the cause is elsewhere": it names the unexplained symptom instead
    launch = next(p for p in doc["playbooks"] if p["id"] == "zero3-launch")
    assert launch["diagnosis"] == "diag-unexplained"
    assert not any(p["healthy"] for p in doc["playbooks"])


THREAD_LEFT_JOINABLE = """
#include <chrono>
#include <cstdio>
#include <thread>
int main() {
    std::thread worker([] { for (;;) std::this_thread::sleep_for(std::chrono::seconds(1)); });
    std::puts("training done");
    return 0;  // worker is still joinable: its destructor calls std::terminate
}
"""
UNCAUGHT = """
#include <stdexcept>
#include <thread>
int main() {
    std::thread([] { throw std::runtime_error("Connection closed by peer [127.0.0.1]:29500"); }).join();
}
"""


@pytest.mark.parametrize("source,signature,cause", [
    (THREAD_LEFT_JOINABLE, "cxx.terminate-no-exception", "std::terminate ran with no C++ exception in flight"),
    (UNCAUGHT, "cxx.terminate-uncaught", "a C++ exception of the named type escaped every handler"),
], ids=["joinable thread", "uncaught exception"])
def test_the_cxx_runtime_s_abort_is_named_from_its_real_message(tmp_path, source, signature, cause):
    """Real programs built with g++ abort through libstdc++'s verbose terminate handler, as a process whose
    gloo threads outlive it does: the line is named, and left unexplained (nothing on the node confirms it)."""
    (tmp_path / "t.cc").write_text(source)
    subprocess.run(["g++", "-pthread", "-o", str(tmp_path / "t"), str(tmp_path / "t.cc")], check=True)
    aborted = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True)
    assert aborted.returncode == -6  # SIGABRT
    rc, doc = check(["--python", PY, "--command", str(tmp_path / "t"), "--playbook", "zero3-launch"])
    assert rc == 1
    (s,) = [x for x in doc["symptoms"] if x["signature"] == signature]
    assert s["text"].startswith("terminate called") and s["explained_by"] == []
    (f,) = [u for u in unexplained(doc) if s["id"] in u["id"]]
    assert f"Likely cause, from the message only, not confirmed on this node: {cause}" in f["detail"]
    assert ("The training environment (python-env): no check of zdoctor confirms this message on this node"
            in f["detail"])
    if signature == "cxx.terminate-uncaught":
        assert s["text"] == "terminate called after throwing an instance of 'std::runtime_error'"
    else:
        assert "destroy_process_group()" in f["detail"]
    assert not any(p["healthy"] for p in doc["playbooks"])


def test_a_catalogued_message_names_its_likely_cause_from_the_message_only():
    line = "node7:1234:1234 [0] NCCL WARN NET/Socket : No usable listening interface found"
    cmd = shlex.join([PY, "-c", f"import sys; print({line!r}, file=sys.stderr); sys.exit(1)"])
    rc, doc = check(["--python", PY, "--command", cmd, "--playbook", "zero3-launch"])
    assert rc == 1
    (s,) = doc["symptoms"]
    assert s["signature"] == "nccl.no-socket-interface" and s["explained_by"] == []
    (f,) = unexplained(doc)
    assert "Likely cause, from the message only, not confirmed on this node: no interface matches " \
           "NCCL_SOCKET_IFNAME" in f["detail"]
    # the layer's check looked (this node's NCCL interface is fine) and so does not explain it
    assert "Examined: The interface NCCL chooses: NCCL would use " in f["detail"]
    assert ends(doc)["zero3-launch"] == "diag-unexplained"


def test_the_same_text_pasted_twice_is_one_symptom():
    """A message pasted twice (as two --symptom, with other spacing), and a line of it pasted again inside a
    longer message, are one symptom each, numbered without gaps."""
    line = "RuntimeError: Ninja is required to load C++ extensions (pip install ninja to get it)"
    other = "OSError: frobnicator exploded"
    rc, doc = check(["--python", PY, "--playbook", "toolchain", "--symptom", line, "--symptom", f"  {line}\n",
                     "--symptom", f"Traceback (most recent call last):\n  File \"x\", line 1\n{line}\n{other}",
                     "--symptom", other])
    assert [(s["id"], s["text"]) for s in doc["symptoms"]] == [("S1", line), ("S2", other)]


def test_a_command_hung_on_a_fifo_is_a_symptom_naming_the_call_it_waits_in(tmp_path):
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    rc, doc = check(["--python", PY, "--command", f"cat {shlex.quote(str(fifo))}", "--timeout", "3",
                     "--playbook", "zero3-launch"])
    (s,) = [s for s in doc["symptoms"] if s["kind"] == "hang"]
    assert s["text"].startswith("the command did not finish within 3 s")
    assert str(fifo) in s["text"]  # strace saw the open that never returned
    assert "(cat): sleeping in " in s["text"]  # and /proc said where the process sleeps, just before the end
    assert rc == 1


def test_a_symptom_from_the_log_is_read_from_its_end(tmp_path):
    log = tmp_path / "train.log"
    with log.open("w") as fh:
        for i in range(20000):
            fh.write(f"step {i} loss 1.0\n")
        fh.write("[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=4711, OpType=_ALLGATHER_BASE, NumelIn=1, NumelOut=2, Timeout(ms)=1800000) ran "
                 "for 1800014 milliseconds before timing out.\n")
    rc, doc = check(["--python", PY, "--log", str(log), "--playbook", "offload-bottleneck"])
    (s,) = doc["symptoms"]
    assert s["source"] == "log" and s["signature"] == "nccl.watchdog-timeout"
    assert s["where"] == "train.log line 20001"
    assert rc in (1, 3)


# -- exit codes and the scope of healthy ends ---------------------------------------------------------

def test_check_with_an_interpreter_without_torch_exits_3():
    rc, doc = check(["--python", PY, "--playbook", "toolchain"])
    assert rc == 3 and doc["exit_code"] == 3
    assert doc["incomplete"].startswith(f"torch is not installed in {PY}")


def test_a_missing_interpreter_is_incomplete_too(tmp_path):
    rc, doc = check(["--python", str(tmp_path / "nope" / "python"), "--playbook", "toolchain"])
    assert rc == 3 and "could not be probed" in doc["incomplete"]


def test_every_healthy_end_carries_what_it_examined_and_what_it_did_not():
    import dsenv

    py = str(dsenv.ensure())
    rc, doc = check(["--python", py, "--playbook", "zero3-launch", "--playbook", "toolchain"])
    healthy = [p for p in doc["playbooks"] if p["healthy"]]
    assert healthy, doc["playbooks"]
    for p in healthy:
        assert p["not_examined"] and p["examined"], p
    assert doc["symptoms"] == []


def test_a_healthy_walk_gives_way_to_unexplained_while_a_symptom_stands():
    import dsenv

    py = str(dsenv.ensure())
    rc, doc = check(["--python", py, "--playbook", "toolchain", "--symptom",
                     "RuntimeError: the frobnicator is misaligned"])
    assert rc == 1
    (run,) = doc["playbooks"]
    assert run["diagnosis"] == "diag-unexplained" and not run["healthy"]
    assert 'S1 "RuntimeError: the frobnicator is misaligned"' in run["reason"]


def _write_book(path: Path, top: str, healthy_extra: str) -> Path:
    path.write_text(f'''id = "{path.stem}"
title = "A book"
summary = "A playbook that looks at one thing and ends."
start = "look"
not_checked = "nope"
{top}

[nodes.look]
kind = "probe"
title = "Look"
why = "Looking is the first step of every check."
explain = "It looks at the thing, and the next step depends on what it saw there, as always."
probes = ["pyenv"]

[[nodes.look.next]]
to = "fine"
label = "all good"

[nodes.fine]
kind = "diagnosis"
healthy = true
{healthy_extra}
title = "Fine"
why = "Nothing is wrong with the thing that was looked at."
explain = "The thing was looked at and it was fine; there is nothing more to do here at all."

[nodes.nope]
kind = "diagnosis"
title = "Not checked"
why = "The thing could not be looked at, so nothing is said of it."
explain = "The probe gave no facts; run again where it can look at the thing it needs to see."

[nodes.why]
kind = "diagnosis"
title = "Unexplained"
why = "What was seen is not explained by anything found here at all."
explain = "A symptom stands unexplained; the healthy end is not taken while it stands, as always."
''', encoding="utf-8")
    return path


def test_lint_demands_an_unexplained_end_and_a_scope_on_every_healthy_end(tmp_path):
    load_vocabulary()
    scope = 'examined = ["the thing"]\nnot_examined = ["the other thing"]'
    good = _write_book(tmp_path / "good.toml", 'unexplained = "why"', scope)
    assert lint_path(good) == []
    assert load_playbook(good).unexplained == "why"
    no_end = _write_book(tmp_path / "noend.toml", "", scope)
    assert any("needs 'unexplained'" in str(e) for e in lint_path(no_end))
    no_scope = _write_book(tmp_path / "noscope.toml", 'unexplained = "why"', 'examined = ["the thing"]')
    assert any("must list what it did not examine" in str(e) for e in lint_path(no_scope))
    with pytest.raises(InputError):
        load_playbook(no_scope)


def test_the_bundled_playbooks_all_have_an_unexplained_end():
    from zdoctor.walk.playbook import load_all

    for pb in load_all().values():
        assert pb.unexplained and pb.nodes[pb.unexplained].kind == "diagnosis", pb.id
        for node in pb.nodes.values():
            if node.healthy:
                assert node.not_examined and node.examined, (pb.id, node.id)


# -- exports ------------------------------------------------------------------------------------------

def test_exports_begin_with_the_symptoms_and_say_unexplained(tmp_path):
    cmd = shlex.join([PY, "-c", "raise SystemExit('fatal: the widget came loose')"])
    env = clean_env(XDG_STATE_HOME=str(tmp_path / "state"))
    proc = run_cli(["check", "--python", PY, "--command", cmd, "--playbook", "zero3-launch",
                    "--symptom", "AssertionError: rank 3 saw 0 parameters"], env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[1].startswith("What you saw: 2 symptoms you saw are not explained")
    md = run_cli(["export", "--last", "--format", "md"], env=env)
    sections = [line for line in md.stdout.splitlines() if line.startswith("## ")]
    assert sections[0] == "## What you saw"
    assert "`AssertionError: rank 3 saw 0 parameters` — **UNEXPLAINED**" in md.stdout
    html = run_cli(["export", "--last", "--format", "html"], env=env)
    assert html.stdout.index('id="symptoms"') < html.stdout.index('id="summary"')
    js = json.loads(run_cli(["export", "--last", "--format", "json"], env=env).stdout)
    assert [s["text"] for s in js["symptoms"]][0] == "AssertionError: rank 3 saw 0 parameters"


def test_a_session_recorded_before_symptoms_exports_with_none():
    fixtures = Path(__file__).parent / "fixtures" / "sessions"
    session = next(fixtures.glob("*.jsonl"))
    events = [json.loads(line) for line in session.read_text(encoding="utf-8").splitlines() if line.strip()]
    from zdoctor.report.export import render

    md = render(events, "md")
    assert "## What you saw" in md and "No symptom given" in md
    probes = [e for e in events if e.get("type") == "probe_result"]
    assert ledger_entries(probes, []) == []


# -- the guide ----------------------------------------------------------------------------------------

def test_the_guide_takes_a_pasted_error_at_80x24_and_the_walk_shows_it_unexplained(tmp_path):
    import asyncio

    import dsenv
    from test_tui import make, name, plain, screen_text, settle, walk_to_diagnosis

    from zdoctor.host import LiveHost

    py = str(dsenv.ensure())

    async def scenario() -> None:
        host = LiveHost(python=py, env=clean_env())
        app = make(host=host, argv=["tui"], export_dir=tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, lambda: name(app) == "StartScreen" and app.screen.findings is not None,
                         timeout=240, what="the first pass")
            assert "paste the error you saw" in screen_text(app)
            await pilot.press("s")
            await pilot.press(*"RuntimeError: the frobnicator is misaligned")
            await pilot.press("enter")
            start = app.screen
            await settle(pilot, lambda: bool(start.symptoms), timeout=120, what="the pasted symptom judged")
            first = plain(start.query_one("#pass-findings"))
            assert "S1" in first and "RuntimeError: the frobnicator is misaligned" in first and "UNEXPLAINED" in first
            menu = start.query_one("#start-menu")
            ids = [menu.get_option_at_index(i).id for i in range(menu.option_count)]
            while ids[menu.highlighted] != "pb:toolchain":
                await pilot.press("down")
            await pilot.press("enter")
            path = await walk_to_diagnosis(pilot, app)
            assert path[-1] == "diag-unexplained", path
            shown = plain(app.screen.query_one("#walk-symptoms"))
            assert "UNEXPLAINED" in shown and "frobnicator" in shown

    asyncio.run(scenario())


def test_too_many_open_files_is_explained_by_the_training_shells_low_limit():
    line = "OSError: [Errno 24] Too many open files: '/data/shard-00042.arrow'"
    env = clean_env(NO_COLOR="1")
    proc = subprocess.run(["prlimit", "--nofile=1024:4096", sys.executable, "-m", "zdoctor", "check", "--json",
                           "--no-log", "--python", PY, "--playbook", "gpu-stack", "--symptom", line],
                          capture_output=True, text=True, env=env, timeout=300, cwd=str(Path(__file__).parent.parent))
    doc = json.loads(proc.stdout)
    (s,) = doc["symptoms"]
    assert s["signature"] == "resource.too-many-open-files" and s["explained_by"] == ["gpu.limits.nofile"]
    nofile = next(f for f in doc["findings"] if f["id"] == "gpu.limits.nofile")
    assert nofile["status"] == "warn" and "1024" in nofile["title"] and nofile["explains"] == [s["id"]]
    assert unexplained(doc) == []


def test_the_start_screens_next_line_sends_you_to_the_unexplained_symptom_first():
    from zdoctor.core.model import Finding
    from zdoctor.walk.guide import next_step

    pyenv = {"target": {"explicit": True, "resolved": "/env/bin/python"}, "torch": {"installed": True}}
    restates = Finding("libs.live", "fail", "python train.py fails (exit code 1)")
    open_one = Finding("symptom.unexplained.S1", "fail",
                       'Unexplained: "NCCL WARN NET/Socket : No usable listening interface found" '
                       "(likely cause from the message only)")
    line = next_step([restates, open_one], pyenv)
    assert line.startswith("Next: what you saw (S1) is explained by nothing zdoctor examined")
    assert "from the message only" in line and "walk zero3-launch" not in line
    assert next_step([restates], pyenv).startswith("Next: walk zero3-launch")


BEFORE = Path(__file__).parent / "fixtures" / "sessions-before-symptoms"


def _install(state_home: Path) -> None:
    folder = state_home / "zdoctor" / "sessions"
    folder.mkdir(parents=True, exist_ok=True)
    for log in BEFORE.glob("*.jsonl"):
        (folder / log.name).write_bytes(log.read_bytes())


def test_sessions_recorded_before_the_symptom_ledger_and_the_new_shape_still_export(state_home):
    from zdoctor.report.export import render
    from zdoctor.walk.session import load_events

    _install(state_home)
    for log in sorted(BEFORE.glob("*.jsonl")):
        events = load_events(log.stem)
        md = render(events, "md")
        assert md.startswith(f"# zdoctor session `{log.stem}`") and "## What you saw" in md
        assert render(events, "html").startswith("<!DOCTYPE html>")
        doc = json.loads(render(events, "json"))
        assert doc["session"] == log.stem and doc["symptoms"] == []


def test_a_walk_recorded_before_the_symptom_ledger_still_resumes_to_its_diagnosis(state_home):
    from zdoctor.walk.resume import find_point, rebuild_host, resume_walk

    _install(state_home)
    (interrupted,) = [p.stem for p in BEFORE.glob("*.jsonl") if '"mode":"tui"' in p.read_text(encoding="utf-8")]
    point = find_point(interrupted)
    assert point.resumable and point.node == "layers"
    walk = resume_walk(point, rebuild_host(point.host_info), record=None)
    assert walk.run().diagnosis == "diag-ld-library-path"


def test_the_raised_open_files_limit_is_tried_on_the_failing_command_before_it_is_offered():
    """A real EMFILE: the command opens 2000 files under a soft limit of 1024; zdoctor re-runs it from a shell
    that first does what the remedy says (ulimit -n 4096, the hard limit), and it then runs to the end."""
    cmd = shlex.join([PY, "-c", "fs = [open('/dev/null') for _ in range(2000)]; print('opened', len(fs))"])
    proc = subprocess.run(["prlimit", "--nofile=1024:4096", sys.executable, "-m", "zdoctor", "check", "--json",
                           "--no-log", "--python", PY, "--command", cmd, "--playbook", "gpu-stack"],
                          capture_output=True, text=True, env=clean_env(), timeout=300,
                          cwd=str(Path(__file__).parent.parent))
    doc = json.loads(proc.stdout)
    (s,) = [s for s in doc["symptoms"] if s["kind"] == "nofile"]
    assert "Too many open files" in s["text"] and s["explained_by"] == ["gpu.limits.nofile"]
    nofile = next(f for f in doc["findings"] if f["id"] == "gpu.limits.nofile")
    first = nofile["remedies"][0]
    assert first["commands"] == ["ulimit -n 4096"] and first["verified"] is True
    assert first["verification"]["state"] == "fixed"
    assert "ran to the end with ulimit -n 4096" in first["verification"]["reason"]
