"""The jit-build-log layer, on a real pair of ninjas (Debian's 1.11 and PyPI's 1.13): an op-like directory
built by one, the finding's prediction for the other, and the rebuild (or not) that really happens when that
ninja runs there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dsenv
import pytest
from test_gpu_facts import facts_of

from zdoctor.core.shape import facts_problems
from zdoctor.layers.jit_build_log import ninjafile, ninjahash, ninjalog
from zdoctor.layers.jit_build_log.check_jitbuildlog import check_build_log
from zdoctor.layers.jit_build_log.probe_jitbuildlog import collect_jitbuildlog
from zdoctor.symptoms.extract import from_text

DEBIAN_NINJA = "/usr/bin/ninja"
PATH = "/usr/bin:/bin"
BUILD_NINJA = """ninja_required_version = 1.3
cxx = {cxx}

cflags = -DTORCH_EXTENSION_NAME=tiny_op -isystem {torch}/include -isystem /usr/include/python3 -fPIC -O0
post_cflags =
ldflags = -shared

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
  depfile = $out.d
  deps = gcc

rule link
  command = $cxx $in $ldflags -o $out

build tiny_op.o: compile {src}
build tiny_op.so: link tiny_op.o

default tiny_op.so
"""


def _version(ninja: str) -> str:
    return subprocess.run([ninja, "--version"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def pypi_ninja(tmp_path_factory) -> str:
    """PyPI's ninja: the lab environment's when it is another release than Debian's, else installed into a
    venv of this module."""
    lab = dsenv.location() / "bin" / "ninja"
    if lab.exists() and _version(str(lab)).split(".")[:2] != _version(DEBIAN_NINJA).split(".")[:2]:
        return str(lab)
    venv = tmp_path_factory.mktemp("ninja-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "ninja>=1.13"], check=True, timeout=600)
    return str(venv / "bin" / "ninja")


def lab_python() -> Path:
    """The lab environment's python (built first when it is not there)."""
    python = dsenv.location() / "bin" / "python"
    return python if python.exists() else dsenv.ensure()


@pytest.fixture(scope="module")
def torch_dir() -> str:
    """The real torch package of the lab environment: its cpp_extension.py says whether it wraps compilers."""
    where = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    return subprocess.run([str(lab_python()), "-c", where], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]


def _op(tmp_path: Path, torch: str, cxx: str = "c++") -> Path:
    op = tmp_path / "ext" / "tiny_op"
    op.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "tiny_op.cpp"
    if not src.exists():  # rewritten, it would be newer than the object and rebuild for that reason alone
        src.write_text("int tiny_op() { return 1; }\n")
    (op / "build.ninja").write_text(BUILD_NINJA.format(cxx=cxx, torch=torch, src=src))
    return op


def _ninja(ninja: str, op: Path) -> subprocess.CompletedProcess[str]:
    """ninja as torch runs it: `ninja -v` in the op dir, here with -d explain to show why it rebuilds."""
    return subprocess.run([ninja, "-v", "-d", "explain"], cwd=op, capture_output=True, text=True, timeout=120,
                          env={"PATH": PATH, "HOME": str(op)})


def _rebuilt(run: subprocess.CompletedProcess[str]) -> bool:
    assert run.returncode == 0, run.stdout + run.stderr
    return "[1/" in run.stdout and "no work to do" not in run.stdout


def _facts(op: Path, torch: str, on_path: str, *, remote: str | None = None, env: dict[str, str] | None = None,
           symptoms: str | None = None, python: str = "/opt/venv/bin/python") -> Any:
    prereq = {"python": python, "ninja": {"on_path": on_path, "on_noninteractive_path": remote,
                                                          "beside_interpreter": None},
              "python_headers": {"include": "/usr/include/python3"}}
    jit = {"base": str(op.parent), "ops": [{"name": op.name, "dir": str(op), "in_use": True}]}
    pyenv = {"torch": {"location": torch}}
    facts, _ev = collect_jitbuildlog(env or {"PATH": PATH}, jit, prereq, pyenv, {}, {})
    facts = json.loads(json.dumps(facts))
    assert facts_problems("jitbuildlog", facts) == []  # a snapshot of it replays
    probes = {"jitbuildlog": facts}
    if symptoms is not None:
        probes["symptoms"] = {"symptoms": [s.to_dict() for s in from_text(symptoms, "log", "launch.log")]}
    return facts_of(**probes)


def test_the_hashes_in_each_real_ninjas_log_are_recomputed(tmp_path, pypi_ninja, torch_dir):
    for ninja, kind, header in ((DEBIAN_NINJA, "murmur", 5), (pypi_ninja, "rapidhash", 7)):
        op = _op(tmp_path / kind, torch_dir)
        assert _rebuilt(_ninja(ninja, op))
        log = ninjalog.read_log((op / ".ninja_log").read_text())
        assert log["version"] == header == ninjalog.rule_for(ninjalog.parse_version(_version(ninja))).writes
        cmds = ninjafile.commands((op / "build.ninja").read_text())
        assert sorted(cmds) == ["tiny_op.o", "tiny_op.so"]
        assert {ninjahash.which_hash(log["entries"][o]["hash"], c) for o, c in cmds.items()} == {kind}


def test_pypi_ninja_on_debians_log_starts_over_as_predicted(tmp_path, pypi_ninja, torch_dir):
    op = _op(tmp_path, torch_dir)
    assert _rebuilt(_ninja(DEBIAN_NINJA, op))
    [f] = check_build_log(_facts(op, torch_dir, pypi_ninja))
    assert (f.id, f.status) == ("jit.build-log.tiny_op", "warn")
    assert f.title.startswith("The next launch rebuilds op tiny_op because the log is v5")
    assert "reads only v7" in f.title and "too old; starting over" in f.title
    run = _ninja(pypi_ninja, op)
    assert _rebuilt(run) and "ninja: warning: build log version is too old; starting over" in run.stderr
    [f] = check_build_log(_facts(op, torch_dir, DEBIAN_NINJA))  # now a v7 log, and 1.11 next
    assert f.status == "warn" and "'command line changed'" in f.title
    # the node whose shells resolve both: the warning a launch printed is this finding's to explain
    [f] = check_build_log(_facts(op, torch_dir, pypi_ninja, remote=DEBIAN_NINJA, symptoms=run.stderr))
    assert f.status == "warn" and f.explains == ["S1"]


def test_debian_ninja_on_pypis_log_reads_command_line_changed(tmp_path, pypi_ninja, torch_dir):
    op = _op(tmp_path, torch_dir)
    assert _rebuilt(_ninja(pypi_ninja, op))
    [f] = check_build_log(_facts(op, torch_dir, DEBIAN_NINJA))
    assert f.status == "warn" and "rapidhash (ninja 1.13)" in f.title
    run = _ninja(DEBIAN_NINJA, op)
    assert _rebuilt(run) and "command line changed for tiny_op.o" in run.stderr


def test_the_same_ninja_does_not_rebuild_and_the_finding_says_so(tmp_path, pypi_ninja, torch_dir):
    op = _op(tmp_path, torch_dir)
    assert _rebuilt(_ninja(DEBIAN_NINJA, op))
    [f] = check_build_log(_facts(op, torch_dir, DEBIAN_NINJA))
    assert (f.status, f.title) == ("ok", "op tiny_op: the next launch does not rebuild it")
    assert not _rebuilt(_ninja(DEBIAN_NINJA, op))


def test_two_shells_resolving_two_ninjas_rebuild_at_every_switch(tmp_path, pypi_ninja, torch_dir):
    op = _op(tmp_path, torch_dir)
    assert _rebuilt(_ninja(pypi_ninja, op))
    python = os.path.join(os.path.dirname(pypi_ninja), "python")  # PyPI's ninja is the environment's own
    [f] = check_build_log(_facts(op, torch_dir, pypi_ninja, remote=DEBIAN_NINJA, python=python))
    assert f.status == "warn" and "pdsh/ssh shells resolve /usr/bin/ninja (1.11" in f.title
    keep = f.remedies[0]
    assert pypi_ninja in keep.title and "no rebuild" in keep.title  # the ninja that wrote the log
    assert keep.commands[0] == f'export PATH={os.path.dirname(pypi_ninja)}:"$PATH"'
    assert ".deepspeed_env" in keep.commands[1]
    pin = [r for r in f.remedies if "pip install" in " ".join(r.commands)]
    assert pin and pin[0].commands == [f"{python} -m pip install ninja==1.11.1"]
    # for real: the kept ninja finds nothing to do; each switch between the two rebuilds
    assert not _rebuilt(_ninja(pypi_ninja, op))
    assert _rebuilt(_ninja(DEBIAN_NINJA, op)) and _rebuilt(_ninja(pypi_ninja, op))


def test_a_compiler_other_than_the_one_in_build_ninja_rebuilds(tmp_path, torch_dir):
    op = _op(tmp_path, torch_dir)
    assert _rebuilt(_ninja(DEBIAN_NINJA, op))
    [f] = check_build_log(_facts(op, torch_dir, DEBIAN_NINJA, env={"PATH": PATH, "CXX": "g++"}))
    assert f.status == "warn"
    assert "build.ninja's the C++ compiler (cxx) is c++ and this environment's is g++" in f.title
    assert f.remedies[0].commands == ["export CXX=c++"]
    # torch writes build.ninja from the environment at the next load: the same ninja then rebuilds
    _op(tmp_path, torch_dir, cxx="g++")
    run = _ninja(DEBIAN_NINJA, op)
    assert _rebuilt(run) and "command line changed for tiny_op.o" in run.stderr


def test_a_real_torch_op_dir_is_read_and_predicted(tmp_path):
    """DeepSpeed's cpu_adam as torch built it in the lab environment (its build.ninja and .ninja_log copied)."""
    so = dsenv.cpu_adam_op(lab_python())
    op = tmp_path / "cpu_adam"
    op.mkdir()
    for name in ("build.ninja", ".ninja_log"):
        shutil.copy(so.parent / name, op / name)
    log = ninjalog.read_log((op / ".ninja_log").read_text())
    cmds = ninjafile.commands((op / "build.ninja").read_text())
    assert set(cmds) == {"cpu_adam.o", "cpu_adam_impl.o", "cpu_adam.so"}
    writer = ninjalog.rule_for(ninjalog.parse_version(_version(str(dsenv.location() / "bin" / "ninja"))))
    assert {ninjahash.which_hash(log["entries"][o]["hash"], c) for o, c in cmds.items()} == {writer.hash}
    assert ninjalog.predict(log, cmds, (1, 11, 1))["rebuild"] is (writer.hash != "murmur")
    assert ninjalog.predict(log, cmds, ninjalog.parse_version(_version(str(dsenv.location() / "bin" / "ninja")))
                            )["rebuild"] is False
    assert ninjalog.last_build_ms(log["entries"]) > 1000


def test_no_op_is_not_examined_with_where_it_looked(tmp_path):
    facts, _ev = collect_jitbuildlog({"PATH": PATH}, {"base": str(tmp_path), "ops": []},
                                     {"ninja": {"on_path": DEBIAN_NINJA}}, {}, {}, {})
    [f] = check_build_log(facts_of(jitbuildlog=facts))
    assert f.id == "jit.build-log.not-checked" and f.detail == f"no JIT-built op in {tmp_path}"


def test_log_rules_and_hashes_of_short_commands():
    assert ninjalog.parse_version("1.13.2.git.kitware.jobserver-pipe-1") == (1, 13, 2)
    assert ninjalog.rule_for((1, 9, 0)) is None and ninjalog.rule_for((1, 12, 1)).writes == 6
    p = ninjalog.predict({"version": 5, "entries": {}}, {"x": "true"}, (1, 12, 1))
    assert p["rebuild"] and p["message"] == "ninja: warning: build log version is too old; starting over"
    p = ninjalog.predict({"version": 7, "entries": {}}, {"x": "true"}, (1, 12, 0))
    assert p["message"] == "ninja: warning: build log version is too new; starting over"
    assert ninjalog.predict(None, {}, (2, 0, 0))["rebuild"] is None
    # the short inputs take other branches of both hashes; values as the real ninjas wrote them
    assert ninjahash.murmur64a(b"cp in.txt out.txt") == 0xDDE0249754EABCD9
    assert ninjahash.rapidhash(b"cp in.txt out.txt") == 0xBA388C0EE5508D4C
    assert ninjahash.which_hash("zz", "x") is None and os.sep == "/"


def test_the_shells_ninja_is_run_once_for_both_layers(tmp_path, torch_dir):
    """jitprereq runs the shell's ninja under the job's environment; the build-log layer reads that answer
    instead of running it again (a ninja the loader blocks on would wait out its time limit twice)."""
    from zdoctor.layers.toolchain.probe_jitprereq import ninja_runs

    count = tmp_path / "runs"
    ninja = tmp_path / "bin" / "ninja"
    ninja.parent.mkdir()
    ninja.write_text(f"#!/bin/sh\necho run >> {count}\nexec {DEBIAN_NINJA} \"$@\"\n")
    ninja.chmod(0o755)
    env = {"PATH": f"{ninja.parent}:{PATH}"}
    op = _op(tmp_path / "op", torch_dir)
    prereq = {"ninja": {"on_path": str(ninja), "on_noninteractive_path": None, "beside_interpreter": None,
                        "runs": ninja_runs(str(ninja), env)}}
    jit = {"base": str(op.parent), "ops": [{"name": op.name, "dir": str(op), "in_use": True}]}
    facts, evidence = collect_jitbuildlog(env, jit, prereq, {"torch": {"location": torch_dir}}, {}, {})
    assert count.read_text().splitlines() == ["run"]
    (shell,) = facts["ninjas"]
    assert shell["version"] == _version(DEBIAN_NINJA) and shell["runs"] is True
    assert any("run once, by the JIT prerequisites probe" in (ev.stdout or "") for ev in evidence)
