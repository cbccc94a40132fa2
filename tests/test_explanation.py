"""A cause zdoctor names explains the symptom the user saw: explanation is derived from the catalogue (the
checks an entry names as confirming it, the messages it wraps), never left to one check's hand wiring.

Every catalogue entry is walked; every recorded scenario is checked for a cause left beside an
"unexplained" symptom; and the real broken states users bring are run end to end: ninja unable to start
under an old libstdc++ (the loader's line, torch's message and DeepSpeed's wrapper of it), a launch hung on
a stale JIT lock, and a first-time build still compiling at the time limit.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from conftest import run_cli
from envkit import make_old_libstdcxx
from test_forensics_e2e import bash, env_with, findings

from zdoctor.core.model import Finding
from zdoctor.core.registry import CHECKS, load_vocabulary
from zdoctor.core.symptom import Symptom
from zdoctor.host import ReplayHost
from zdoctor.symptoms.catalogue import SIGNATURES, signature
from zdoctor.symptoms.extract import from_run, from_text
from zdoctor.symptoms.links import confirming_checks
from zdoctor.walk.doctor import check as run_check
from zdoctor.walk.ledger import build, unexplained_finding
from zdoctor.walk.practice import load_scenarios

LOAD_CPU_ADAM = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"


def left_unexplained_beside_its_cause(doc: dict) -> list[str]:
    """The symptoms of a report left unexplained while a failing finding of a check that confirms them (by
    the catalogue) stands in the same report: what a user reads as "the cause is named, yet my error is
    unexplained"."""
    load_vocabulary()
    from zdoctor.core.registry import owner_check

    failing = {owner_check(f["id"], CHECKS) for f in doc["findings"]
               if f["status"] in ("fail", "warn", "crash") and not f["id"].startswith("symptom.")}
    out = []
    for s in doc["symptoms"]:
        if s["explained_by"]:
            continue
        symptom = Symptom.from_dict({**s, "fields": {}})
        assert symptom is not None
        named = set(confirming_checks(symptom)) & failing
        if named:
            out.append(f"{s['id']} ({s['text']}) unexplained beside failing {sorted(named)}")
    return out


def symptom_of(sig_id: str, sid: str = "S1", source: str = "command") -> Symptom:
    sig = signature(sig_id)
    assert sig is not None
    return Symptom(id=sid, source=source, text=f"a line {sig_id} recognised", kind=sig.kind, signature=sig.id)


# -- every catalogue entry ------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNATURES, ids=lambda s: s.id)
def test_every_catalogue_entry_is_explained_by_a_failing_finding_of_each_check_that_confirms_it(sig):
    """A symptom an entry recognises is explained by a failing finding of any check the entry (or a message
    it wraps) names as confirming it, with no hand wiring in that check; an ``ok`` or a ``skip`` of the same
    check never explains it; an entry with no such check is left to the message only."""
    load_vocabulary()
    s = symptom_of(sig.id)
    names = confirming_checks(s)
    assert set(sig.confirm) <= set(names)
    for name in names:
        assert name in CHECKS, (sig.id, name)
        (entry,) = build([s], [Finding(id=f"{name}.something", status="fail", title="the cause")])
        assert entry.explained_by == [f"{name}.something"], (sig.id, name)
        for status in ("ok", "skip"):
            (entry,) = build([s], [Finding(id=name, status=status, title="looked")])
            assert not entry.explained, (sig.id, name, status)
    if not names:  # nothing on the node confirms it: the likely cause, named from the message only
        (entry,) = build([s], [])
        assert "Likely cause, from the message only" in unexplained_finding(entry, []).detail


def test_a_check_that_matched_another_symptom_of_the_kind_by_its_fields_does_not_explain_this_one():
    """libs.glibcxx names S1 (GLIBCXX_3.4.30 needed by ext.so); S2 (another version needed by another object)
    is not explained by it just because the catalogue names the check: it matched by fields and spoke of S1."""
    load_vocabulary()
    s1, s2 = symptom_of("loader.glibcxx-version", "S1"), symptom_of("loader.glibcxx-version", "S2")
    f = Finding(id="libs.glibcxx", status="fail", title="GLIBCXX_3.4.30 missing", explains=["S1"])
    e1, e2 = build([s1, s2], [f])
    assert e1.explained_by == ["libs.glibcxx"] and not e2.explained
    # a check with no field matching of this kind explains both
    other = Finding(id="libs.live", status="fail", title="the run failed under the loader")
    e1, e2 = build([s1, s2], [f, other])
    assert e2.explained_by == ["libs.live"] and e1.explained_by == ["libs.glibcxx", "libs.live"]


def test_a_wrapper_is_explained_by_what_explains_the_message_it_wraps():
    """DeepSpeed's "Unable to JIT load ... ninja not being installed" wraps torch's "Ninja is required": it is
    explained by what explains torch's line; a launcher's exit line is explained by what explains the rank's
    error above it, and stays unexplained while that one does."""
    load_vocabulary()
    ninja = "RuntimeError: Ninja is required to load C++ extensions (pip install ninja to get it)"
    wrapper = "RuntimeError: Unable to JIT load the cpu_adam op due to ninja not being installed."
    s2, s3 = from_text(f"{ninja}\n\nThe above exception was the direct cause of the following exception:\n\n"
                       f"Traceback (most recent call last):\n  File \"x.py\", line 1\n{wrapper}", "command")
    assert (s2.signature, s3.signature) == ("build.ninja-required", "deepspeed.jit-ninja")
    cause = Finding(id="gpu.toolkit", status="fail", title="unrelated")  # confirms neither
    inner = Finding(id="x.ninja", status="fail", title="ninja cannot start", explains=[s2.id])
    e2, e3 = build([s2, s3], [cause, inner])
    assert e2.explained_by == ["x.ninja"] and e3.explained_by == ["x.ninja"]
    # alone (the inner line not seen), the wrapper is explained by the checks that confirm the inner one
    (alone,) = build([s3], [Finding(id="toolchain.jit-prereq.ninja", status="fail", title="ninja cannot start")])
    assert alone.explained_by == ["toolchain.jit-prereq.ninja"]

    text = ("Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: the rank's own error\n"
            "[2026-12-04 10:00:00,000] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python3', '-u', "
            "'train.py', '--local_rank=0'] exits with return code = 1\n")
    rank_err, exit_line = from_text(text, "command")
    assert exit_line.signature == "deepspeed.rank-exit" and rank_err.text == "ValueError: the rank's own error"
    e_rank, e_exit = build([rank_err, exit_line], [Finding(id="y", status="fail", title="t", explains=["S1"])])
    assert e_exit.explained_by == ["y"]
    _, e_exit = build([rank_err, exit_line], [])
    assert not e_exit.explained


def test_a_launchers_own_traceback_does_not_hide_the_ranks_error():
    """The last traceback of a launch is the launcher's (CalledProcessError): the rank's final line before
    it is still a symptom of its own."""
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
            "KeyError: 'optimizer'\nTraceback (most recent call last):\n  File \"launch.py\", line 9\n"
            "subprocess.CalledProcessError: Command '['/usr/bin/python3', '-u', 'train.py']' returned non-zero "
            "exit status 1.\n")
    found = from_text(text, "command")
    assert [s.text for s in found] == ["KeyError: 'optimizer'", found[1].text]
    assert found[1].signature == "launcher.called-process-error"


def test_a_run_ended_while_compilers_worked_is_still_compiling_not_a_hang():
    compiling = [{"pid": "7", "comm": "cc1plus", "state": "R", "wchan": "", "file": "/ds/csrc/cpu_adam.cpp",
                  "running_s": "23"}]
    (s,) = from_run(None, True, "", "", timeout=30, waiting_in=["pid 5 (python): sleeping in do_wait"],
                    compiling=compiling)
    assert s.kind == "still-compiling" and "cc1plus on cpu_adam.cpp (running 23 s)" in s.text
    assert "rerun with a longer --timeout" in s.text
    (h,) = from_run(None, True, "", "", timeout=30, waiting_in=["pid 5 (python): sleeping in hrtimer_nanosleep"])
    assert h.kind == "hang"
    assert "it was waiting in pid 5 (python): sleeping in hrtimer_nanosleep" in h.text
    # sampled on a CPU at the limit: still working, not a hang, and nothing says it waited
    (w,) = from_run(None, True, "", "", timeout=2, waiting_in=["pid 6 (sh): running"])
    assert w.kind == "still-working" and "waiting" not in w.text and "hung" not in w.text, w
    assert "still working when the run reached 2 s (every process sampled was on a CPU: pid 6 (sh): running)" \
        in w.text and "not a hang" in w.text and "--timeout" in w.text, w.text
    # not sampled at all: only the user's own limit is known, as before
    (n,) = from_run(None, True, "", "", timeout=2)
    assert n.kind == "hang" and n.text == "the command did not finish within 2 s"


def test_a_command_still_working_at_its_time_limit_is_explained_not_called_a_hang(tmp_path):
    """A real busy loop given 2 s: the symptom is what was seen (still working at the limit, not a hang), the
    live run's finding explains it with what to do (a longer --timeout), nothing calls the run hung, and the
    symptom is not left unexplained."""
    rc, doc = run_check_json(["--command", "sh -c 'while :; do :; done'", "--timeout", "2",
                              "--playbook", "zero3-launch"], env_with())
    (s,) = [s for s in doc["symptoms"] if s["source"] == "process"]
    assert s["kind"] == "still-working" and "on a CPU" in s["text"], s
    (live,) = findings(doc, "libs.live")
    assert live["status"] == "warn" and "still working when the time limit (2 s) came: not a hang" in live["title"]
    assert s["explained_by"] == ["libs.live"] and live["explains"] == [s["id"]]
    (rerun,) = live["remedies"]
    assert "--timeout 600" in rerun["explanation"] and rerun["verification"]["state"] == "not_tried"
    assert "not known: it was still working at 2 s" in rerun["verification"]["reason"]
    assert not any(f["id"].startswith("symptom.unexplained.") for f in doc["findings"])
    assert "hung" not in json.dumps([f for f in doc["findings"] if f["id"] in ("libs.live", "ranks.waits")])
    (walk,) = [p for p in doc["playbooks"] if p["id"] == "zero3-launch"]
    assert walk["path"][-1] == "diag-live-late"
    assert rc == 0, rc  # nothing failed, and what was seen is explained


# -- every recorded scenario -----------------------------------------------------------------------------


def recorded_hosts() -> list[tuple[str, ReplayHost]]:
    fixtures = Path(__file__).parent / "fixtures"
    hosts = [(sc.id, sc.host()) for sc in load_scenarios()]
    hosts += [(p.name, ReplayHost.load(str(p))) for p in sorted((fixtures / "snapshots").glob("*.json"))]
    return hosts


@pytest.mark.parametrize("name,host", recorded_hosts(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_recorded_scenario_names_a_cause_beside_an_unexplained_symptom(name, host):
    """The practice scenarios and the recorded snapshots, walked through every playbook: no symptom stays
    unexplained while a check the catalogue names for it fails, and a walk that ends at a cause never ends
    beside an unexplained symptom its diagnosis' checks explain."""
    report = run_check(host)
    doc = report.to_dict()
    assert left_unexplained_beside_its_cause(doc) == [], name
    explained = {fid for s in doc["symptoms"] for fid in s["explained_by"]}
    for f in doc["findings"]:
        assert set(f["explains"]) <= {s["id"] for s in doc["symptoms"]}, f["id"]
        for sid in f["explains"]:
            assert f["id"] in next(s["explained_by"] for s in doc["symptoms"] if s["id"] == sid)
    assert explained <= {f["id"] for f in doc["findings"]}


# -- real broken states ---------------------------------------------------------------------------------


def run_check_json(args: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, dict]:
    proc = run_cli(["check", "--json", "--no-log", *args], env=env, timeout=timeout)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.e2e
def test_ninja_unable_to_start_is_one_cause_for_the_loader_line_torchs_message_and_deepspeeds_wrapper(tmp_path):
    """The real DeepSpeed op load with a ninja (first on PATH) that the loader stops under an old libstdc++
    from LD_LIBRARY_PATH: ninja's loader line, torch's "Ninja is required" and DeepSpeed's "Unable to JIT load
    the cpu_adam op due to ninja not being installed" are all explained by the one ninja finding, which comes
    first; the remedy was tried on the failing command."""
    import dsenv
    from test_jitprereq import cxx_ninja

    python = dsenv.ensure()
    ninja = cxx_ninja(tmp_path / "bin")
    old = make_old_libstdcxx(tmp_path / "old").parent
    env = env_with(LD_LIBRARY_PATH=str(old), TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    env["PATH"] = f"{ninja.parent}:{python.parent}:{env['PATH']}"
    cmd = shlex.join([str(python), "-c", LOAD_CPU_ADAM])
    real = bash(cmd, env)
    assert real.returncode == 1
    assert "GLIBCXX_3.4.30' not found (required by" in real.stderr and "Ninja is required" in real.stderr
    assert "Unable to JIT load the cpu_adam op due to ninja not being installed" in real.stderr

    rc, doc = run_check_json(["--python", str(python), "--command", cmd, "--timeout", "240"], env)
    assert rc == 1
    by_sig = {s["signature"]: s for s in doc["symptoms"]}
    assert {"build.ninja-required", "deepspeed.jit-ninja"} <= set(by_sig), doc["symptoms"]
    (n,) = findings(doc, "toolchain.jit-prereq.ninja", "fail")
    for s in doc["symptoms"]:
        assert s["explained_by"], s
    assert n["id"] in by_sig["deepspeed.jit-ninja"]["explained_by"]
    assert n["id"] in by_sig["build.ninja-required"]["explained_by"]
    assert not [f for f in doc["findings"] if f["id"].startswith("symptom.unexplained.")]
    assert left_unexplained_beside_its_cause(doc) == []
    # the remedy was tried: ninja starts without the entry; the op load itself needs a build that a trial may
    # not make in the user's op cache, so it is "the tool starts", never called "fixed"
    (drop,) = [r for r in n["remedies"] if r["commands"] == ["unset LD_LIBRARY_PATH"]]
    assert drop["verification"]["state"] == "tool_starts", drop["verification"]
    assert "the failing command itself was not re-run" in drop["verification"]["reason"]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_launch_hung_on_a_stale_jit_lock_is_explained_by_that_lock(tmp_path):
    """The real DeepSpeed op load waits on a `lock` left in the op's dir by a dead build (torch's FileBaton
    found it taken): the hang is explained by the stale-lock finding, not "explained by nothing", and the
    walk ends at the stale lock."""
    import dsenv

    python = dsenv.ensure()
    op = tmp_path / "ext" / "cpu_adam"
    op.mkdir(parents=True)
    (op / "lock").write_text("")
    env = env_with(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    env["PATH"] = f"{python.parent}:{env['PATH']}"
    cmd = shlex.join([str(python), "-c", LOAD_CPU_ADAM])
    rc, doc = run_check_json(["--python", str(python), "--command", cmd, "--timeout", "45",
                              "--playbook", "zero3-launch"], env)
    assert rc == 1
    (hang,) = [s for s in doc["symptoms"] if s["kind"] == "hang"]
    (stale,) = findings(doc, "hangs.stale-lock.cpu_adam", "fail")
    assert hang["explained_by"] == [stale["id"]] or stale["id"] in hang["explained_by"]
    assert hang["id"] in stale["explains"]
    assert not [f for f in doc["findings"] if f["id"].startswith("symptom.unexplained.")]
    (walk,) = [p for p in doc["playbooks"] if p["id"] == "zero3-launch"]
    assert walk["path"][-1] == "diag-stale-lock"


@pytest.mark.slow
@pytest.mark.e2e
def test_a_first_build_still_compiling_at_the_time_limit_is_not_a_hang(tmp_path):
    """The real first build of cpu_adam, stopped by a time limit while g++ compiles: the symptom is "still
    compiling" with what compiled and for how long, explained by the live run's finding, and the walk ends
    at "still compiling", not "The launch hangs"."""
    import dsenv

    python = dsenv.ensure()
    env = env_with(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    env["PATH"] = f"{python.parent}:{env['PATH']}"
    cmd = shlex.join([str(python), "-c", LOAD_CPU_ADAM])
    rc, doc = run_check_json(["--python", str(python), "--command", cmd, "--timeout", "30",
                              "--playbook", "zero3-launch"], env)
    (s,) = [s for s in doc["symptoms"] if s["source"] == "process"]
    assert s["kind"] == "still-compiling", s
    assert "cpu_adam" in s["text"] and "running" in s["text"] and "--timeout" in s["text"]
    (live,) = findings(doc, "libs.live")
    assert live["status"] == "warn" and "still compiling" in live["title"] and "did not finish" not in live["title"]
    assert s["explained_by"] == ["libs.live"] and live["explains"] == [s["id"]]
    (walk,) = [p for p in doc["playbooks"] if p["id"] == "zero3-launch"]
    assert walk["path"][-1] == "diag-still-compiling"
    assert not any(f["id"].startswith("symptom.unexplained.") for f in doc["findings"])
