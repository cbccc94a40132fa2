"""The training environment's code runs as its owner, never as root (no option keeps root for it)."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import run_cli
from userkit import SYSTEM_PYTHON, owned_environment, plant_witness, unprivileged_user, witnessed

import zdoctor.layers.libraries.probe_libs  # noqa: F401 - registers livetrace and libfix
import zdoctor.layers.python_env.probe_pyenv  # noqa: F401 - registers the interpreter probe
from zdoctor.host import LiveHost
from zdoctor.layers.libraries import live
from zdoctor.layers.offload import fstab_apply
from zdoctor.proc import privilege, systools
from zdoctor.proc.target import Target

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                                reason="needs root and a system python3 to create another user's environment")


@pytest.fixture(scope="module")
def account():
    with unprivileged_user("p") as acc:
        yield acc


@pytest.fixture
def env_dir(account):
    with owned_environment(account) as env:
        yield env


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SUDO_USER"}


def test_the_probe_interpreter_runs_as_the_environments_owner_without_groups(account, env_dir):
    seen = plant_witness(env_dir, account)
    host = LiveHost(python=str(env_dir / "bin" / "python"), env=_env())
    res = host.result("pyenv")
    runs = witnessed(seen)
    assert runs, "the environment's .pth file never ran"
    assert all(r[:3] == (account.uid, account.uid, account.gid) for r in runs), runs
    assert all(r[3] == "[]" for r in runs), runs  # supplementary groups dropped
    assert res.facts["ran_as"] == account.name
    assert any(f"[as user {account.name} (uid {account.uid})]" in ev.label for ev in res.evidence)


def test_no_option_keeps_root_for_the_owners_code_and_a_root_environment_stays_root(account, env_dir):
    seen = plant_witness(env_dir, account)
    host = LiveHost(python=str(env_dir / "bin" / "python"), env=_env(), options={"as_root": True})
    host.result("pyenv")
    assert {r[0] for r in witnessed(seen)} == {account.uid}
    root_target = Target.of(SYSTEM_PYTHON, _env())
    assert privilege.code_runs_as(root_target) is None
    proc = run_cli(["check", "--no-log", "--python", str(env_dir / "bin" / "python"), "--as-root"])
    assert proc.returncode == 2 and "--as-root is refused" in proc.stderr and "Traceback" not in proc.stderr


def test_the_traced_command_and_its_remedy_trials_run_as_the_owner(account, env_dir):
    seen = plant_witness(env_dir, account)
    python = str(env_dir / "bin" / "python")
    host = LiveHost(python=python, env=_env(), command=f"{python} -c pass")
    lt = host.result("livetrace")
    runs = witnessed(seen)
    assert runs and {r[0] for r in runs} == {account.uid}, runs
    assert lt.status == "ok", lt.error
    assert any(account.name in ev.label for ev in lt.evidence)


def test_trace_command_keeps_ld_debug_and_strace_as_root(account, env_dir):
    run_as = privilege.code_runs_as(Target.of(str(env_dir / "bin" / "python"), _env()))
    assert run_as is not None and run_as.uid == account.uid
    seen = plant_witness(env_dir, account)
    lt = live.trace_command([str(env_dir / "bin" / "python"), "-c", "import json"], _env(), timeout=60,
                            run_as=run_as, use_strace=shutil.which("strace") is not None)
    assert lt.exit_code == 0, lt.evidence.stderr
    assert {r[0] for r in witnessed(seen)} == {account.uid}
    assert lt.traces, "the LD_DEBUG logs the user's process wrote were not read"
    if lt.strace_used:
        assert "strace as root" in lt.evidence.label


SHOW_EUID = ("#include <stdio.h>\n#include <unistd.h>\n"
             "int main(void) { printf(\"euid %d\\n\", (int)geteuid()); return 0; }\n")


def test_a_set_user_id_program_in_the_owners_traced_command_works_as_it_does_untraced(account, env_dir, tmp_path):
    """Traced by root, the command dropped to its owner runs a set-user-ID program as it would untraced:
    that trace is not the kernel-filtered one, whose no_new_privs would take the program's rights away."""
    if not all(shutil.which(t) for t in ("strace", "gcc", "setpriv")):
        pytest.skip("needs strace, gcc and setpriv")
    top = env_dir.parent
    prog = top / "show-euid"
    src = tmp_path / "show_euid.c"
    src.write_text(SHOW_EUID)
    import subprocess

    subprocess.run(["gcc", "-o", str(prog), str(src)], check=True, capture_output=True)
    os.chown(prog, 0, 0)
    os.chmod(prog, 0o4755)
    untraced = subprocess.run(["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups",
                               str(prog)], capture_output=True, text=True)
    if untraced.stdout.strip() != "euid 0":
        pytest.skip(f"set-user-ID programs do not run here: {untraced.stdout or untraced.stderr}")
    run_as = privilege.code_runs_as(Target.of(str(env_dir / "bin" / "python"), _env()))
    lt = live.trace_command([str(prog)], _env(), timeout=60, run_as=run_as)
    assert lt.strace_used, lt.notes
    assert lt.exit_code == 0 and lt.evidence.stdout.strip() == "euid 0", (lt.evidence.stdout, lt.evidence.stderr)


def test_system_tools_are_found_in_system_directories_only(tmp_path, monkeypatch):
    planted = tmp_path / "findmnt"
    planted.write_text("#!/bin/sh\ntouch /tmp/zdoctor-h8-planted\n")
    planted.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ.get('PATH', '')}")
    found = systools.system_tool("findmnt")
    assert found is not None and os.path.dirname(found) in systools.SYSTEM_DIRS
    assert systools.system_tool("zdoctor-h8-no-such-tool") is None
    assert fstab_apply._mount_argv("/etc/fstab", "/mnt/x")[0] == systools.system_tool("mount")


def test_a_remedy_trial_runs_as_the_owner(account, env_dir):
    from zdoctor.trials.remedies import Plan, verify

    seen = plant_witness(env_dir, account)
    python = str(env_dir / "bin" / "python")
    run_as = privilege.code_runs_as(Target.of(python, _env()))
    plan = Plan(key="ld-library-path", title="drop an entry", env_changes={"ZDOCTOR_H8_TRIAL": "1"})
    ev = verify(plan, [python, "-c", "import os; assert os.environ['ZDOCTOR_H8_TRIAL'] == '1'"], _env(),
                timeout=60, run_as=run_as)
    assert plan.verified, (ev.stderr, plan.verification)
    assert {r[0] for r in witnessed(seen)} == {account.uid}
    assert f"[as user {account.name}" in ev.label
