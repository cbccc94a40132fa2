"""The launch layer against the real DeepSpeed 0.19.8 of the test environment: its real `deepspeed`
launcher refusing a non-contiguous CUDA_VISIBLE_DEVICES and a hostfile host that does not resolve, and
zdoctor running a plain `python t.py` that calls deepspeed.init_distributed() and explaining why it asked
for mpi4py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli
from dsenv import ensure
from test_gpu_facts import facts_of

from zdoctor.layers.launch import check_launch as cl
from zdoctor.layers.launch.dslauncher import installed_launcher_rules
from zdoctor.layers.launch.probe_launch import collect_hostfile, collect_launch
from zdoctor.symptoms.extract import from_text

SCRIPT = "import deepspeed\ndeepspeed.init_distributed()\n"
MISSING = "h7-launch-nohost.invalid"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    python = ensure()
    work = tmp_path_factory.mktemp("launch")
    (work / "t.py").write_text(SCRIPT)
    (work / "hostfile").write_text(f"{MISSING} slots=1\nlocalhost slots=1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT", "CUDA_VISIBLE_DEVICES")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    launcher = str(python.parent / "deepspeed")
    # The two launcher runs at once: each imports torch twice (runner and launch).
    runs = {"cvd": subprocess.Popen([launcher, "t.py"], cwd=work, env={**env, "CUDA_VISIBLE_DEVICES": "0,2"},
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
            "host": subprocess.Popen([launcher, "-H", "hostfile", "--no_ssh_check", "t.py"], cwd=work, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)}
    out = {k: p.communicate(timeout=300)[0] for k, p in runs.items()}
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    pyenv = {"deepspeed": {"installed": True, "version": "0.19.8", "location": str(site / "deepspeed")},
             "packages": {"mpi4py": {"installed": False}}}
    return {"python": python, "work": work, "env": env, "out": out, "pyenv": pyenv,
            "rc": {k: p.returncode for k, p in runs.items()}}


def symptoms(text: str) -> dict:
    return {"symptoms": [s.to_dict() for s in from_text(text, "command", "--command")]}


def test_the_real_launcher_refuses_a_non_contiguous_list_and_zdoctor_explains_it(lab):
    out = lab["out"]["cvd"]
    assert lab["rc"]["cvd"] != 0
    assert "Detected VISIBLE_DEVICES=0,2: setting --include=localhost:0,2" in out
    assert "ValueError: No slot '2' specified on host 'localhost'" in out
    rules = installed_launcher_rules(lab["pyenv"]["deepspeed"]["location"], "0.19.8")
    assert rules["visible-devices"]["state"] == "count-checked"
    lf, _ = collect_launch("deepspeed t.py", {"CUDA_VISIBLE_DEVICES": "0,2"}, lab["pyenv"], cwd=str(lab["work"]))
    sy = symptoms(out)
    (f,) = cl.check_devices(facts_of(launch=lf, symptoms=sy))
    assert f.status == "fail" and f.explains == [s["id"] for s in sy["symptoms"] if s["kind"] == "hostfile-slot"]
    # the remedy, run for real: the launcher takes --include with the variable unset (and goes on to start
    # the ranks; on this CPU-only machine its own device count decides what happens next)
    (cmd,) = f.remedies[0].commands
    assert cmd == "env -u CUDA_VISIBLE_DEVICES deepspeed --include localhost:0,2 t.py"


def test_the_real_launcher_cannot_reach_a_host_that_does_not_resolve(lab):
    out = lab["out"]["host"]
    assert lab["rc"]["host"] != 0
    assert f"ssh: Could not resolve hostname {MISSING}" in out
    hf, _ = collect_hostfile(str(lab["work"] / "hostfile"), "the command's hostfile option (deepspeed)", ssh=False)
    sy = symptoms(out)
    (f,) = cl.check_hostfile(facts_of(hostfile=hf, symptoms=sy))
    assert f.status == "fail" and MISSING in f.title
    assert f.explains == [s["id"] for s in sy["symptoms"] if s["kind"] == "host-unresolved"]


def test_plain_python_calling_init_distributed_is_explained_by_zdoctor(lab):
    python = str(lab["python"])
    real = subprocess.run([python, "t.py"], cwd=lab["work"], env=lab["env"], capture_output=True, text=True,
                          timeout=300)
    assert real.returncode == 1 and "ModuleNotFoundError: No module named 'mpi4py'" in real.stderr
    proc = run_cli(["check", "--json", "--no-log", "--python", python, "--command", "python t.py"],
                   env=lab["env"], cwd=str(lab["work"]), timeout=600)
    doc = json.loads(proc.stdout)
    found = {f["id"]: f for f in doc["findings"]}
    f = found["launcher.env"]
    assert f["status"] == "fail" and "mpi4py is not installed in the training environment" in f["detail"]
    (sym,) = [s for s in doc["symptoms"] if s["kind"] == "module-missing"]
    assert sym["id"] in f["explains"] and "launcher.env" in sym["explained_by"]
    assert f["remedies"][0]["commands"] == ["deepspeed t.py"]
    layers = {x["id"]: x for x in doc["layers"]}
    assert layers["launch"]["status"] == "partly examined"  # the launch is judged; no hostfile to resolve
    assert "launcher.env" in layers["launch"]["checks"]
    assert "launcher.hostfile" in [m["check"] for m in layers["launch"]["not_examined"]]
    assert {m["check"]: m["why"] for m in layers["launch"]["not_examined"]}["launcher.hostfile"].startswith(
        "no hostfile given")
    assert layers["rank-cores"]["status"] == "examined" and found["cores.ranks"]["status"] in ("ok", "warn")
    assert Path(lab["work"] / "t.py").read_text() == SCRIPT
