"""Torch is imported once per check: the interpreter probe reads its records from the live trace's run.

A real interpreter imports a torch package that counts its own imports in a file, so each test sees how
many processes really imported it, and what each probe made of that one run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_probe_script import FAKE_TORCH_OK, make_pkg

from zdoctor.core.registry import load_vocabulary
from zdoctor.host.live import LiveHost
from zdoctor.layers.libraries.importrun import ImportRun, shared_with_trace
from zdoctor.layers.libraries.live import default_probe_argv
from zdoctor.layers.python_env.probe_pyenv import build_facts, parse_records, read_shared
from zdoctor.scripts import RECORD_SENTINEL

COUNTING = '''
import os
with open(os.environ["TORCH_IMPORTS"], "a") as fh:
    fh.write("%d\\n" % os.getpid())
'''


@pytest.fixture(autouse=True)
def _probes():
    load_vocabulary()


def training_env(tmp_path: Path, torch_body: str) -> tuple[dict[str, str], Path]:
    site = tmp_path / "site"
    make_pkg(site, "torch", COUNTING + torch_body, version="2.11.0+cu130")
    count = tmp_path / "imports"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONPATH": str(site),
           "PYTHONNOUSERSITE": "1", "TORCH_IMPORTS": str(count), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    return env, count


def imports(count: Path) -> int:
    return len(count.read_text().split()) if count.exists() else 0


def test_a_check_without_a_command_imports_torch_once_for_both_probes(tmp_path):
    env, count = training_env(tmp_path, FAKE_TORCH_OK)
    host = LiveHost(sys.executable, env)
    host.results(["pyenv", "livetrace"])
    assert imports(count) == 1
    pyenv, live = host.result("pyenv"), host.result("livetrace")
    assert pyenv.status == live.status == "ok"
    torch = pyenv.facts["torch"]
    assert torch["import"]["state"] == "ok" and torch["version"] == "2.11.0+cu130" and torch["cxx11_abi"] is True
    assert torch["cuda_check"]["state"] == "ok" and torch["cuda_check"]["available"] is False
    assert any(os.path.basename(p).startswith("libstdc++.so") for p in torch["libstdcxx"])
    assert pyenv.facts["complete"] and pyenv.facts["error"] is None
    assert "in the live trace's run" in pyenv.evidence[0].label
    assert [(s["step"], s["ok"]) for s in live.facts["steps"]] == [("import torch", True), ("import deepspeed", None)]
    assert live.facts["ok"] and live.facts["source"] == "default probe"
    assert any(x["path"].endswith("libstdc++.so.6") or "libstdc++" in x["path"] for x in live.facts["loaded_all"])
    # the records are the interpreter probe's evidence, not the traced command's output
    assert RECORD_SENTINEL not in live.evidence[0].stdout


def test_the_interpreter_probe_alone_runs_its_own_script_and_the_trace_its_own_later(tmp_path):
    env, count = training_env(tmp_path, FAKE_TORCH_OK)
    host = LiveHost(sys.executable, env)
    host.results(["pyenv"])
    assert imports(count) == 1 and "in the live trace's run" not in host.result("pyenv").evidence[0].label
    assert shared_with_trace(host) is None  # the trace was not asked for in that round
    host.results(["livetrace"])
    assert imports(count) == 2 and host.result("livetrace").facts["ok"]


def test_with_a_command_the_interpreter_probe_imports_torch_itself(tmp_path):
    env, count = training_env(tmp_path, FAKE_TORCH_OK)
    host = LiveHost(sys.executable, env, command=f"{sys.executable} -c 'import torch'")
    host.results(["pyenv", "livetrace"])
    assert imports(count) == 2  # the user's command is traced as it is; nothing is added to it
    assert host.result("pyenv").facts["torch"]["import"]["state"] == "ok"
    assert host.result("livetrace").facts["source"] == "command" and host.result("livetrace").facts["ok"]


def test_a_torch_that_kills_its_process_is_a_crash_for_both_probes(tmp_path):
    env, count = training_env(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    host = LiveHost(sys.executable, env)
    host.results(["pyenv", "livetrace"])
    assert imports(count) == 1
    torch = host.result("pyenv").facts["torch"]
    assert torch["import"]["state"] == "crashed" and torch["import"]["signal"] == "SIGKILL"
    live = host.result("livetrace").facts
    assert not live["ok"] and live["steps"][-1]["step"] == "import torch" and live["steps"][-1]["finished"] is False


@pytest.mark.parametrize("waits", [False, True], ids=["working", "sleeping"])
def test_a_torch_import_slower_than_the_probes_wait_is_its_time_out_while_the_trace_goes_on(tmp_path, waits):
    """The probe's wait ends while the run goes on: where the run's process is then decides between "hangs"
    (it sleeps) and "not examined" (it works on a CPU), and the trace itself still waits for the import."""
    slow = ("import time\ntime.sleep(3)\n" if waits else
            "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end:\n    pass\n")
    env, count = training_env(tmp_path, slow + FAKE_TORCH_OK)
    argv = default_probe_argv(sys.executable, [], [])
    shared = ImportRun(argv, env, timeout=60, run_as=None)
    got = read_shared(shared, sys.executable, timeout=1.0)
    assert got is not None
    ev, stuck = got
    assert ev.error.startswith("timed out")
    assert stuck and all("(python" in x for x in stuck), stuck
    target = {"requested": sys.executable, "explicit": True, "resolved": sys.executable, "realpath": None}
    facts = build_facts(parse_records(ev.stdout), ev, target, stuck, "this node: load 1.0 on 2 CPUs")
    assert facts["timed_out"] and facts["hung_in"] == "import torch"
    assert facts["torch"]["import"]["state"] == "timeout" and facts["waiting"] is waits
    assert shared.wait_end(60) and shared.trace.exit_code == 0  # the trace itself waited for the import
    assert imports(count) == 1


def test_zdoctor_check_imports_torch_once(tmp_path):
    """The command as users run it: the run starts before the checks load, and both probes read it. (A CPU
    build: with CUDA, a torch without ``torch.cuda.nccl`` has the NCCL probe ask a process of its own.)"""
    env, count = training_env(tmp_path, FAKE_TORCH_OK.replace('cuda = "13.0"', "cuda = None"))
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    proc = subprocess.run([sys.executable, "-m", "zdoctor", "check", "--json", "--no-log", "--python", sys.executable],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert imports(count) == 1
    report = json.loads(proc.stdout)
    assert not report["incomplete"]


def test_a_check_that_fails_after_starting_its_run_leaves_nothing_of_it(tmp_path, monkeypatch, capsys):
    """The run starts before the checks load; a check that then fails (here: an internal error) ends it
    before returning, and the process goes on starting commands as before (nothing is left closing)."""
    from prockit import dead, wait_for

    from zdoctor.front import cli
    from zdoctor.proc.runner import run
    from zdoctor.walk import doctor

    env, count = training_env(tmp_path, "import time\ntime.sleep(60)\n")
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def broken(*_a, **_k):
        assert wait_for(lambda: imports(count) == 1, 30)  # the run is in torch's import by now
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(doctor, "check", broken)
    monkeypatch.delenv("ZDOCTOR_DEBUG", raising=False)
    assert cli.main(["check", "--no-log", "--python", sys.executable]) == 2
    assert "simulated bug" in capsys.readouterr().err
    (pid,) = (int(p) for p in count.read_text().split())
    assert wait_for(lambda: dead(pid), 10)
    after = run(["true"])
    assert after.exit_code == 0 and after.error is None
