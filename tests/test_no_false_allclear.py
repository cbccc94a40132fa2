"""No all-clear from what was not checked: a check whose subject is absent says skip with the reason, and a
playbook that could not check ends in a diagnosis that says so, never in a healthy one."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from test_gpu_facts import h200_all

from zdoctor.core.model import ProbeResult
from zdoctor.core.registry import CHECKS, PROBES, Facts, load_vocabulary
from zdoctor.host import ReplayHost
from zdoctor.layers import evaluate_check
from zdoctor.walk.engine import Walk
from zdoctor.walk.playbook import load_all
from zdoctor.walk.playbook_lint import lint_path

#: Words that make a statement about torch, DeepSpeed or their ops.
ABOUT_TORCH = re.compile(r"torch|deepspeed|\bops?\b|JIT|extension|import probe|load(s|ed)? cleanly", re.I)


def torchless_pythons(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    out = []
    system = "/usr/bin/python3"
    if os.path.exists(system) and subprocess.run([system, "-c", "import torch"],
                                                 capture_output=True).returncode != 0:
        out.append(system)  # the machine's own python3, as a new user runs zdoctor
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    out.append(str(venv / "bin" / "python"))
    return out


@pytest.fixture(scope="module")
def pythons(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return torchless_pythons(tmp_path_factory)


def healthy_diagnoses() -> set[tuple[str, str]]:
    return {(pid, n.id) for pid, pb in load_all().items() for n in pb.nodes.values() if n.healthy}


def test_check_with_a_python_without_torch_says_nothing_ok_about_torch(pythons: list[str], tmp_path: Path):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "no-ops-here"))
    for py in pythons:
        proc = run_cli(["check", "--json", "--no-log", "--python", py], env=env, timeout=300)
        assert proc.returncode == 3, proc.stderr  # incomplete: no torch to examine
        doc = json.loads(proc.stdout)
        oks = [f["title"] for f in doc["findings"] if f["status"] == "ok" and ABOUT_TORCH.search(f["title"])]
        assert oks == [], (py, oks)
        (live,) = [f for f in doc["findings"] if f["id"] == "libs.live"]
        assert live["status"] == "skip" and f"torch is not installed in {py}" in live["title"]
        assert "--python" in live["title"]
        walks = {p["id"]: p for p in doc["playbooks"]}
        assert walks["zero3-launch"]["diagnosis"] == "diag-not-checked"
        assert walks["offload-bottleneck"]["diagnosis"] == "diag-not-measured"
        # NCCL's network (the multinode walk) is examined without the training interpreter
        ended = {(pid, w["diagnosis"]) for pid, w in walks.items() if pid != "multinode"}
        assert not ended & healthy_diagnoses(), ended
        # The not-checked diagnosis names the way out in its title and why.
        pb = load_all()["zero3-launch"]
        node = pb.nodes["diag-not-checked"]
        assert "torch is not in this interpreter" in node.title and "--python" in node.why


def test_the_terminal_report_has_no_checkmark_about_torch(pythons: list[str], tmp_path: Path):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "none"))
    proc = run_cli(["check", "--no-log", "--python", pythons[0]], env=env, timeout=300)
    marked = [line.rsplit("  (", 1)[0] for line in proc.stdout.splitlines() if line.strip().startswith("✓")]
    assert marked and not [line for line in marked if ABOUT_TORCH.search(line)], marked  # titles, not ids
    assert "zero3-launch" in proc.stdout and "=> Not checked: torch is not in this interpreter (diag-not-checked)" \
        in proc.stdout


# -- every check family: no ok from probes that gave no facts ------------------------------------------------

def _facts(mode: str) -> Facts:
    load_vocabulary()
    out: dict[str, ProbeResult] = {}
    for p in PROBES:
        if mode == "skip":
            out[p] = ProbeResult(probe=p, status="skip", facts={"skipped": "not on this machine"},
                                 error="not on this machine")
        elif mode == "crash":
            out[p] = ProbeResult(probe=p, status="crash", error="RuntimeError: boom")
        elif mode == "timeout":
            out[p] = ProbeResult(probe=p, status="timeout", error="ran past its budget")
    return Facts(out)


def _families() -> list[str]:
    load_vocabulary()
    return sorted({name.split(".")[0] for name in CHECKS})


@pytest.mark.parametrize("family", _families())
@pytest.mark.parametrize("mode", ["skip", "crash", "timeout", "absent"])
def test_no_check_says_ok_from_a_probe_that_gave_no_facts(family: str, mode: str):
    facts = _facts(mode)
    names = [n for n in CHECKS if n.split(".")[0] == family]
    assert names
    for name in names:
        for f in evaluate_check(name, facts):
            assert f.status != "ok", (name, mode, f.title)


def test_every_family_is_covered():
    assert set(_families()) >= {"gpu", "hangs", "jit", "libs", "offload", "pyenv", "storage", "toolchain"}


# -- per family: a probe that ran but found no subject says skip, not ok --------------------------------------

def _ok(probe: str, facts: dict[str, Any]) -> ProbeResult:
    return ProbeResult(probe=probe, status="ok", facts=facts)


def test_libs_live_with_nothing_loaded_is_skip_and_with_an_extension_is_ok():
    load_vocabulary()
    steps = [{"step": "import torch", "ok": None, "error": None, "skipped": "not installed"},
             {"step": "import deepspeed", "ok": None, "error": None, "skipped": "not installed"}]
    live = {"argv": ["/usr/bin/python3", "-c", "..."], "source": "default probe", "command": None, "ok": True,
            "exit_code": 0, "timed_out": False, "libstdcxx": [], "version_errors": [], "steps": steps}
    facts = Facts({"livetrace": _ok("livetrace", live), "libs": _ok("libs", {"targets": []})})
    (f,) = evaluate_check("libs.live", facts)
    assert f.status == "skip" and "torch is not installed in /usr/bin/python3" in f.title
    from zdoctor.core.registry import PREDICATES
    assert PREDICATES["live_run_checked_nothing"].func(facts)
    loaded = dict(live, steps=[{"step": "load needsnew", "ok": True, "error": None}, *steps])
    facts = Facts({"livetrace": _ok("livetrace", loaded), "libs": _ok("libs", {"targets": []})})
    (f,) = evaluate_check("libs.live", facts)
    assert f.status == "ok" and "needsnew" in f.title and "not loaded: torch (not installed)" in f.title
    assert not PREDICATES["live_run_checked_nothing"].func(facts)


def test_libs_glibcxx_without_any_library_is_skip():
    load_vocabulary()
    facts = Facts({"libs": _ok("libs", {"targets": [], "needs": [], "inventory": []}),
                   "livetrace": _ok("livetrace", {}), "libfix": _ok("libfix", {})})
    (f,) = evaluate_check("libs.glibcxx", facts)
    assert f.status == "skip" and "--python" in f.detail
    # the audit found no library: that says nothing of whether torch is installed (pyenv says that)
    assert "not installed" not in f.title
    for name in ("libs.broken-files", "libs.ext-compilers", "libs.env-source"):
        found = evaluate_check(name, Facts({**facts, "toolchain": _ok("toolchain", {}),
                                            "shellinit": _ok("shellinit", {"lines": []})}))
        assert found and all(x.status == "skip" for x in found), (name, found)


def test_jit_checks_with_no_extension_directory_are_skip(tmp_path: Path):
    load_vocabulary()
    jit = {"base": str(tmp_path / "absent"), "source": "TORCH_EXTENSIONS_DIR", "ops": [], "locks": [],
           "roots": [{"path": str(tmp_path / "absent"), "exists": False}]}
    tool = {"jit": {"path": "/usr/bin/c++", "realpath": "/usr/bin/g++-12", "family": "gcc", "version": "12.2.0"}}
    facts = Facts({"jitcache": _ok("jitcache", jit), "processes": _ok("processes", {"locks": [], "processes": []}),
                   "toolchain": _ok("toolchain", tool), "locktrial": _ok("locktrial", {})})
    for name in ("hangs.stale-lock", "jit.corrupt-ops", "jit.foreign-toolchain"):
        (f,) = evaluate_check(name, facts)
        assert f.status == "skip" and "nothing to check" in f.title, (name, f.title)
    # The directory exists and holds no lock: that was looked at, so it is ok. A probe result is never
    # changed once recorded (checks are evaluated once per result), so the new state is a new result.
    (tmp_path / "absent").mkdir()
    jit = copy.deepcopy(jit)
    jit["roots"][0]["exists"] = True
    facts = Facts({**facts, "jitcache": _ok("jitcache", jit)})
    (f,) = evaluate_check("hangs.stale-lock", facts)
    assert f.status == "ok" and f.title == "No JIT build locks"


def test_toolchain_jit_compiler_without_torch_is_skip():
    load_vocabulary()
    from test_toolchain import collect

    _facts_, _ev, facts = collect({"PATH": os.environ["PATH"]}, {"error": None, "python": {"sysconfig": {}},
                                                                 "torch": {"installed": False},
                                                                 "deepspeed": {"installed": False}})
    (f,) = evaluate_check("toolchain.jit-compiler", facts)
    assert f.status == "skip" and "torch is not installed" in f.title and shutil.which("c++") in f.title


# -- every playbook: no healthy diagnosis from missing data --------------------------------------------------

def _walk(pid: str, probes: dict[str, dict[str, Any]]) -> Any:
    doc = {"format": "zdoctor-snapshot", "version": 1, "probes": {
        n: {"probe": n, "status": "skip" if f.get("skipped") else "ok", "facts": f, "error": f.get("skipped")}
        for n, f in probes.items()}}
    return Walk(load_all()[pid], ReplayHost(json.loads(json.dumps(doc)))).run()


def test_every_playbook_has_a_healthy_end_and_a_not_checked_end():
    load_vocabulary()
    for pid, pb in load_all().items():
        healthy = [n for n in pb.nodes.values() if n.healthy]
        assert healthy, pid
        assert pb.not_checked and not pb.nodes[pb.not_checked].healthy, pid
        assert lint_path(pb.path) == []


@pytest.mark.parametrize("pid", sorted(load_all()))
def test_no_playbook_ends_healthy_on_a_node_that_answered_nothing(pid: str):
    load_vocabulary()
    res = _walk(pid, {})
    assert not load_all()[pid].nodes[res.diagnosis].healthy, res.path


def test_zero3_launch_without_a_live_trace_ends_not_checked_naming_the_probe():
    load_vocabulary()
    res = _walk("zero3-launch", {"livetrace": {"skipped": "the training interpreter was not found"},
                                 "jitcache": {"ops": [], "roots": [], "base": "/x", "source": "HOME"},
                                 "processes": {"processes": [], "locks": []},
                                 "libs": {"targets": [], "needs": [], "inventory": []}})
    assert res.path[-1] == "diag-incomplete", res.path
    assert "livetrace (the training interpreter was not found)" in res.outcomes[-2].reason


def test_the_toolchain_is_in_place_only_with_its_jit_prerequisites_recorded():
    load_vocabulary()
    doc = json.loads((Path(__file__).parent / "fixtures" / "snapshots" / "healthy.json").read_text())
    res = Walk(load_all()["toolchain"], ReplayHost(copy.deepcopy(doc))).run()
    assert res.path[-2:] == ["layers", "diag-layers"], res.path
    del doc["probes"]["jitprereq"]
    res = Walk(load_all()["toolchain"], ReplayHost(doc)).run()
    assert res.path[-1] == "diag-not-checked" and "jitprereq" in res.outcomes[-2].reason, res.path


@pytest.mark.parametrize("drop", ["pyenv", "toolchain", "cuda_stack", "nccl", "gpu_env", "host_limits"])
def test_the_gpu_stack_is_not_healthy_when_one_layer_gave_no_facts(drop: str):
    load_vocabulary()
    probes = copy.deepcopy(h200_all())
    assert _walk("gpu-stack", probes).diagnosis == "diag-healthy"  # all there: healthy
    probes[drop] = {"skipped": f"the {drop} probe could not run"}
    res = _walk("gpu-stack", probes)
    assert res.diagnosis == "diag-not-checked", res.path
    edge_reason = res.outcomes[-2].reason
    assert drop in edge_reason and "could not run" in edge_reason
    from zdoctor.walk.guide import graph_text

    picture = graph_text(load_all()["gpu-stack"], res.path)
    assert "⇒ diag-not-checked" in picture and "if a probe gave no facts" in picture


def test_a_healthy_diagnosis_without_not_checked_is_a_lint_error(tmp_path: Path):
    book = tmp_path / "tiny.toml"
    book.write_text('''id = "tiny"
title = "Tiny"
summary = "A tiny playbook."
start = "look"

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
title = "Fine"
why = "Nothing is wrong with the thing that was looked at."
explain = "The thing was looked at and it was fine; there is nothing more to do here at all."
''', encoding="utf-8")
    load_vocabulary()
    errors = [str(e) for e in lint_path(book)]
    assert any("not_checked" in e for e in errors), errors


def test_no_undefined_symbol_is_not_said_of_a_live_run_that_loaded_nothing():
    load_vocabulary()
    steps = [{"step": "import torch", "ok": None, "error": None, "skipped": "not installed"}]
    live = {"argv": ["/usr/bin/python3", "-c", "..."], "source": "default probe", "command": None, "ok": True,
            "exit_code": 0, "timed_out": False, "libstdcxx": [], "version_errors": [], "steps": steps}
    facts = Facts({"symbols": _ok("symbols", {"errors": [], "loaded_count": 0}), "livetrace": _ok("livetrace", live)})
    (f,) = evaluate_check("libs.symbols", facts)
    assert f.status == "skip" and "torch is not installed" in f.detail
    loaded = dict(live, steps=[{"step": "import torch", "ok": True, "error": None}])
    facts = Facts({"symbols": _ok("symbols", {"errors": [], "loaded_count": 9}),
                   "livetrace": _ok("livetrace", loaded)})
    (f,) = evaluate_check("libs.symbols", facts)
    assert f.status == "ok"


def test_triton_caches_not_created_yet_are_said_to_be_so(tmp_path: Path):
    load_vocabulary()
    caches = [{"name": "Triton's kernel cache", "path": str(tmp_path / "none"), "source": "HOME", "exists": False,
               "mount": {"fstype": "ext4", "point": "/"}, "network": False, "locks": []}]
    (f,) = evaluate_check("jit.other-caches", Facts({"other_caches": _ok("other_caches", {"caches": caches})}))
    assert f.status == "ok" and "none created yet" in f.title
