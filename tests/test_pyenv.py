"""The pyenv probe (resolution, errors, timeouts, crashes), its checks and its predicates, for real."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import zdoctor.layers.python_env.check_pyenv  # noqa: F401 - registers checks and predicates
from zdoctor.core.model import Evidence, ProbeResult
from zdoctor.core.registry import PREDICATES, PROBES, Facts
from zdoctor.host import LiveHost
from zdoctor.layers import evaluate_check
from zdoctor.layers.python_env.probe_pyenv import (
    SCRIPT,
    build_facts,
    error_line,
    parse_records,
    probe_target,
    signal_name,
)

GLIBCXX_MSG = ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
               "(required by /opt/env/lib/python3.11/site-packages/torch/lib/libtorch_python.so)")
FAKE_TORCH_OK = '''
__version__ = "2.4.1+cu121"
class version:
    cuda = "12.1"
    git_version = "abc123"
class __config__:
    @staticmethod
    def show():
        return "PyTorch built with:\\n  - GCC 9.3\\n"
class _C:
    _GLIBCXX_USE_CXX11_ABI = False
class cuda:
    @staticmethod
    def is_available():
        return False
'''


def make_pkg(root: Path, name: str, body: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "__init__.py").write_text(textwrap.dedent(body))


def base_env(tmp_path: Path | None = None, **extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
    if tmp_path is not None:
        env["PYTHONPATH"] = str(tmp_path)
    env.update(extra)
    return env


def check(name: str, facts: dict) -> list:
    return evaluate_check(name, Facts({"pyenv": ProbeResult(probe="pyenv", facts=facts)}))


def pred(name: str, facts: dict) -> bool:
    return PREDICATES[name].func(Facts({"pyenv": ProbeResult(probe="pyenv", facts=facts)}))


# -- pure helpers ----------------------------------------------------------------------------------

def test_error_line_prefers_the_loader_line():
    tb = f"Traceback (most recent call last):\n  File \"x\", line 1\nImportError: {GLIBCXX_MSG}"
    assert error_line(tb) == f"ImportError: {GLIBCXX_MSG}"
    assert error_line("a\nOSError: libfoo.so: cannot open shared object file: No such file") \
        .endswith("No such file")
    assert error_line("RuntimeError: boom\n") == "RuntimeError: boom"
    assert error_line("") is None


def test_signal_names():
    assert signal_name(-11) == "SIGSEGV"
    assert signal_name(-9) == "SIGKILL"
    assert signal_name(0) is None and signal_name(1) is None and signal_name(None) is None


def test_build_facts_from_partial_records_after_a_timeout():
    out = "\n".join([
        '@@zdoctor@@ {"stage": "hello", "version_info": [3, 10, 4], "executable": "/e/python"}',
        '@@zdoctor@@ {"stage": "basics", "version_info": [3, 10, 4], "executable": "/e/python", '
        '"packages": {"torch": {"installed": true, "version": "2.3.0"}}, "env": {"PATH": "/x"}}',
        '@@zdoctor@@ {"stage": "torch_import", "state": "started"}',
    ])
    ev = Evidence(label="x", stdout=out, error="timed out after 60s; process group killed")
    target = {"requested": "/e/python", "resolved": "/e/python", "explicit": True}
    waited = ["pid 9 (python): sleeping in futex_wait_queue"]
    facts = build_facts(parse_records(out), ev, target, waited, "this node: load 0.5 on 2 CPUs")
    assert facts["error"] is None
    assert facts["timed_out"] is True and facts["hung_in"] == "import torch"
    assert facts["torch"]["installed"] is True
    assert facts["torch"]["import"]["state"] == "timeout"
    assert facts["env"] == {"PATH": "/x"}
    assert facts["waiting"] is True and facts["stuck_states"] == waited
    assert pred("torch_import_hung", facts) and not pred("torch_import_failed", facts)
    assert not pred("torch_import_late", facts)
    [finding] = check("pyenv.torch-import", facts)
    assert finding.status == "fail" and finding.title == "import torch hangs"
    assert "-X importtime" in finding.detail and "sleeping in futex_wait_queue" in finding.detail
    # the same records, the process working on a CPU when the limit came: slow, not hung
    busy = build_facts(parse_records(out), ev, target, ["pid 9 (python): running"], "this node: load 31.0 on 2 CPUs")
    assert busy["waiting"] is False
    assert pred("torch_import_late", busy) and not pred("torch_import_hung", busy)
    [finding] = check("pyenv.torch-import", busy)
    assert finding.status == "skip" and "not examined" in finding.title and "slow, not hung" in finding.title
    assert "load 31.0 on 2 CPUs" in finding.detail and "hangs" not in finding.title
    # no sample at all (a recording from before samples): no hang evidence, so no verdict
    unknown = build_facts(parse_records(out), ev, target)
    [finding] = check("pyenv.torch-import", unknown)
    assert finding.status == "skip" and finding.title == "import torch: not examined: it ran out of time"
    assert pred("torch_import_late", unknown) and not pred("torch_import_hung", unknown)


# -- the probe against real interpreters ----------------------------------------------------------

def test_missing_interpreter_paths_and_names(tmp_path):
    for python, kind, text in [
        (str(tmp_path / "nope" / "python"), "missing", "no such file"),
        ("python-does-not-exist", "missing", "not found on the target PATH"),
        (str(tmp_path), "not_executable", "is a directory"),
    ]:
        facts, evidence = probe_target(python, base_env())
        assert facts["error_kind"] == kind, python
        assert text in facts["error"]
        assert evidence and evidence[0].kind == "note"
        assert pred("interpreter_unusable", facts)
    plain = tmp_path / "python"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    facts, _ = probe_target(str(plain), base_env(), explicit=True)
    assert facts["error_kind"] == "not_executable"
    [finding] = check("pyenv.interpreter", facts)
    assert finding.status == "fail"
    assert finding.title.startswith("Target interpreter is not executable")
    assert "You named this interpreter" in finding.detail
    assert finding.remedies[0].commands[0].startswith("zdoctor check --python ")


def test_a_name_is_looked_up_on_the_target_path_not_ours(tmp_path):
    bindir = tmp_path / "env bin"
    bindir.mkdir()
    (bindir / "trainpy").symlink_to(sys.executable)
    facts, _ = probe_target("trainpy", {"PATH": str(bindir)})
    assert facts["error"] is None
    assert facts["target"]["resolved"] == str(bindir / "trainpy")
    assert facts["python"]["version_info"][:2] == list(sys.version_info[:2])
    facts, _ = probe_target("trainpy", base_env())
    assert facts["error_kind"] == "missing"


def test_not_python_and_shell_scripts(tmp_path):
    script = tmp_path / "fakepy"
    script.write_text("#!/bin/sh\necho 'I am not python' >&2\nexit 3\n")
    script.chmod(0o755)
    facts, evidence = probe_target(str(script), base_env())
    assert facts["error_kind"] == "not_python"
    assert "exit code 3" in facts["error"] and "I am not python" in facts["error"]
    assert evidence[0].argv[0] == str(script) and evidence[0].exit_code == 3
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x7fELF garbage")
    junk.chmod(0o755)
    facts, _ = probe_target(str(junk), base_env())
    assert facts["error_kind"] == "not_python"


@pytest.mark.parametrize("python", ["/root/.pyenv/versions/2.7.18/bin/python",
                                    "/root/.pyenv/versions/3.6.15/bin/python"])
def test_too_old_interpreter(python):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed on this machine")
    facts, _ = probe_target(python, base_env(), explicit=True)
    assert facts["error_kind"] == "too_old"
    assert "3.8 or newer" in facts["error"]
    [finding] = check("pyenv.interpreter", facts)
    assert finding.status == "fail" and "too old" in finding.title
    assert check("pyenv.torch-import", facts)[0].status == "skip"


def test_interpreter_that_crashes_at_start(tmp_path):
    # sitecustomize runs before the probe: a crash there is a crash of the interpreter itself.
    (tmp_path / "sitecustomize.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    facts, _ = probe_target(sys.executable, base_env(tmp_path))
    assert facts["signal"] == "SIGSEGV"
    assert facts["error_kind"] == "crashed"
    [finding] = check("pyenv.interpreter", facts)
    assert finding.status == "fail" and "(SIGSEGV)" in finding.title


def test_healthy_interpreter_without_torch_defaulted_warns_and_explicit_fails(tmp_path):
    facts, evidence = probe_target(sys.executable, base_env(VIRTUAL_ENV=str(tmp_path)))
    assert facts["error"] is None and facts["complete"] is True
    assert facts["torch"]["installed"] is False
    assert facts["python"]["prefix"] == sys.prefix
    assert evidence[0].exit_code == 0 and evidence[0].argv == [sys.executable, "-B", str(SCRIPT)]
    [ok] = check("pyenv.interpreter", facts)
    assert ok.status == "ok" and ok.title.startswith(f"Python {'.'.join(map(str, sys.version_info[:3]))}")
    [warn] = check("pyenv.torch-import", facts)
    assert warn.status == "warn" and warn.title.startswith("torch is not installed")
    assert warn.remedies[0].title == "Point zdoctor at the training interpreter"
    # VIRTUAL_ENV points at a directory without an interpreter: nothing concrete to suggest.
    assert facts["candidates"]["active"] == []
    assert warn.remedies[0].commands == ["zdoctor check --python /path/to/env/bin/python"]
    assert pred("torch_missing", facts) and not facts["target"]["explicit"]
    facts, _ = probe_target(sys.executable, base_env(), explicit=True)
    [fail] = check("pyenv.torch-import", facts)
    assert fail.status == "fail"
    assert fail.remedies[0].commands == [f"{shlex.quote(sys.executable)} -m pip install torch"]
    assert facts["target"]["explicit"] is True


def test_torch_imports_through_livehost(tmp_path):
    make_pkg(tmp_path, "torch", FAKE_TORCH_OK)
    host = LiveHost(python=sys.executable, env=base_env(tmp_path))
    res = host.result("pyenv")
    assert res.status == "ok", res.error
    f = res.facts
    assert f["target"]["explicit"] is True
    assert f["torch"]["import"]["state"] == "ok"
    assert f["torch"]["version"] == "2.4.1+cu121" and f["torch"]["cxx11_abi"] is False
    assert f["torch"]["cuda_check"]["available"] is False
    assert f["env"]["PYTHONPATH"] == str(tmp_path)
    facts = host.results(["pyenv"])
    [finding] = evaluate_check("pyenv.torch-import", facts)
    assert finding.status == "ok"
    assert finding.title.startswith("torch 2.4.1+cu121 imports in ") and "CUDA 12.1" in finding.title
    assert PROBES["pyenv"].timeout > 60


def test_glibcxx_import_error_is_quoted_exactly(tmp_path):
    make_pkg(tmp_path, "torch", f"import ctypes\nctypes.CDLL('libstdc++.so.6')\nraise ImportError({GLIBCXX_MSG!r})")
    facts, evidence = probe_target(sys.executable, base_env(tmp_path))
    imp = facts["torch"]["import"]
    assert imp["state"] == "failed" and imp["error_line"] == GLIBCXX_MSG
    [finding] = check("pyenv.torch-import", facts)
    assert finding.status == "fail"
    assert finding.title == f"import torch fails: {GLIBCXX_MSG}"
    assert "backward compatible" in finding.detail
    assert "libstdc++ mapped when the import failed: /" in finding.detail
    assert [e.kind for e in evidence] == ["command", "traceback"]
    assert GLIBCXX_MSG in evidence[1].stdout
    assert pred("glibcxx_error", facts) and pred("torch_import_failed", facts)


def test_hanging_torch_import_times_out_with_partial_facts(tmp_path):
    make_pkg(tmp_path, "torch", "import time\ntime.sleep(120)\n")
    t0 = time.monotonic()
    facts, evidence = probe_target(sys.executable, base_env(tmp_path), timeout=3)
    assert time.monotonic() - t0 < 15
    assert facts["timed_out"] and facts["hung_in"] == "import torch"
    assert facts["error"] is None, "the interpreter itself answered"
    assert facts["python"]["version_info"][:2] == list(sys.version_info[:2])
    assert facts["torch"]["import"]["state"] == "timeout"
    assert evidence[0].error.startswith("timed out after 3s")
    assert facts["waiting"] and any("(python" in x and "sleeping" in x for x in facts["stuck_states"]), facts
    assert check("pyenv.torch-import", facts)[0].title == "import torch hangs"


def test_a_torch_import_still_working_at_the_limit_is_slow_not_hung(tmp_path):
    # the import works on a CPU past the probe's limit: zdoctor's time ran out, nothing waited
    make_pkg(tmp_path, "torch", "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end:\n    pass\n")
    facts, evidence = probe_target(sys.executable, base_env(tmp_path), timeout=3)
    assert facts["timed_out"] and facts["torch"]["import"]["state"] == "timeout"
    assert facts["stuck_states"] and facts["waiting"] is False, facts["stuck_states"]
    assert "on" in facts["node_load"] and "CPUs" in facts["node_load"]
    [finding] = check("pyenv.torch-import", facts)
    assert finding.status == "skip" and finding.title.startswith("import torch: not examined")
    assert "running" in finding.detail and "hangs" not in finding.title
    assert pred("torch_import_late", facts) and not pred("torch_import_hung", facts)


def test_torch_import_that_segfaults(tmp_path):
    make_pkg(tmp_path, "torch", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    facts, _ = probe_target(sys.executable, base_env(tmp_path))
    assert facts["signal"] == "SIGSEGV" and facts["error"] is None
    assert facts["torch"]["import"]["state"] == "crashed"
    [finding] = check("pyenv.torch-import", facts)
    assert finding.status == "fail" and finding.title == "import torch crashes the interpreter (SIGSEGV)"
    assert pred("torch_import_failed", facts)


def test_hanging_cuda_check_is_a_warning(tmp_path):
    make_pkg(tmp_path, "torch", FAKE_TORCH_OK.replace("return False", "import time; time.sleep(120)"))
    facts, _ = probe_target(sys.executable, base_env(tmp_path), timeout=4)
    assert facts["torch"]["import"]["state"] == "ok"
    assert facts["torch"]["cuda_check"]["state"] == "timeout"
    assert facts["hung_in"] == "torch.cuda.is_available()"
    [finding] = check("pyenv.torch-import", facts)
    assert finding.status == "warn" and "is_available() hangs" in finding.title


def test_retarget_remedy_suggests_the_active_env_and_is_quoted(tmp_path):
    env_dir = tmp_path / "my env $(touch pwned)"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "bin" / "python").symlink_to(sys.executable)
    facts, _ = probe_target(str(tmp_path / "missing"), base_env(VIRTUAL_ENV=str(env_dir)))
    assert facts["candidates"]["active"] == [str(env_dir / "bin" / "python")]
    [finding] = check("pyenv.interpreter", facts)
    cmd = finding.remedies[0].commands[0]
    assert cmd == f"zdoctor check --python {shlex.quote(str(env_dir / 'bin' / 'python'))}"
    out = subprocess.run(["bash", "-c", cmd.replace("zdoctor check --python", "printf %s")], cwd=tmp_path,
                         capture_output=True, text=True).stdout
    assert out == str(env_dir / "bin" / "python")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("waits", [False, True], ids=["working", "sleeping"])
def test_an_interpreter_that_has_not_answered_at_the_limit(tmp_path, waits):
    """An interpreter that works on a CPU past the probe's limit before its first line is slow: "not
    examined", and the toolchain walk says so; one that sleeps there is the interpreter's own failure."""
    from zdoctor.host import ReplayHost
    from zdoctor.walk.engine import Walk
    from zdoctor.walk.playbook import load_all

    slow = tmp_path / "python3"
    slow.write_text("#!/bin/sh\n" + ("exec sleep 60\n" if waits else "while :; do :; done\n"))
    slow.chmod(0o755)
    facts, evidence = probe_target(str(slow), base_env(tmp_path), timeout=3)
    assert facts["error_kind"] == "timeout" and facts["stuck_states"] and facts["waiting"] is waits
    [finding] = check("pyenv.interpreter", facts)
    if waits:
        assert finding.status == "fail" and finding.title.startswith("Target interpreter did not answer")
        assert pred("interpreter_unusable", facts) and not pred("interpreter_late", facts)
    else:
        assert finding.status == "skip" and "not examined" in finding.title and "slow, not hung" in finding.title
        assert pred("interpreter_late", facts) and not pred("interpreter_unusable", facts)
    host = ReplayHost({"format": "zdoctor-snapshot", "version": 1,
                       "probes": {"pyenv": ProbeResult(probe="pyenv", facts=facts).to_dict()}})
    path = Walk(load_all()["toolchain"], host).run().path
    assert path == ["interpreter", "diag-interpreter" if waits else "diag-interpreter-late"], path
    from zdoctor.walk.guide import next_step

    said = next_step([finding], facts)
    assert said.startswith("Next: name the training interpreter" if waits else "Next: run zdoctor again"), said
