"""Who runs the user's code is decided by the runner from what runs: a whole ``check --command``, with
its fix trials, started as root on a training environment another user can change, never runs that
environment's code as root. A recording ``.pth`` counts every start of the interpreter and who it ran as."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO
from envkit import build_extension, make_old_libstdcxx
from userkit import SYSTEM_PYTHON, WITNESS_PTH, Account, owned_environment, plant_witness, unprivileged_user, witnessed

from zdoctor.proc import codeowner

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                                reason="needs root and a system python3 to make another user's environment")

VERSION = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with unprivileged_user("c") as acc:
        yield acc


def _chown_tree(top: Path, account: Account) -> None:
    for directory, dirs, files in os.walk(top):
        for n in [*dirs, *files]:
            os.chown(os.path.join(directory, n), account.uid, account.gid, follow_symlinks=False)
    os.chown(top, account.uid, account.gid)


def _witness_dir(top: Path) -> Path:
    seen = top / "witness"
    seen.mkdir()
    os.chmod(seen, 0o777)
    return seen


@contextmanager
def conda_like_prefix(account: Account) -> Iterator[tuple[Path, Path]]:
    """A conda-style prefix the account owns: its own copy of the system interpreter in ``bin/``, the
    standard library linked in entry by entry, and a real ``dist-packages`` holding a recording ``.pth``."""
    top = Path(tempfile.mkdtemp(prefix="zdoctor-conda-"))
    os.chmod(top, 0o755)
    try:
        prefix = top / "conda"
        (prefix / "bin").mkdir(parents=True)
        shutil.copy2(os.path.realpath(SYSTEM_PYTHON), prefix / "bin" / "python3")
        lib = prefix / "lib" / f"python{VERSION}"
        lib.mkdir(parents=True)
        stdlib = Path(os.path.realpath(SYSTEM_PYTHON)).parent.parent / "lib" / f"python{VERSION}"
        for entry in stdlib.iterdir():
            if entry.name not in ("site-packages", "dist-packages"):
                (lib / entry.name).symlink_to(entry)
        sites = [lib / "site-packages", lib / "dist-packages"]
        seen = _witness_dir(top)
        for site in sites:
            site.mkdir()
            (site / "zz_witness.pth").write_text(WITNESS_PTH.format(dir=str(seen)))
        _chown_tree(prefix, account)
        yield prefix / "bin" / "python3", seen
    finally:
        shutil.rmtree(top, ignore_errors=True)


@contextmanager
def foreign_home(account: Account) -> Iterator[tuple[Path, Path]]:
    """The account's home, whose user site holds a recording ``x.pth``; given to zdoctor as HOME (what a
    ``sudo -E`` shell keeps)."""
    top = Path(tempfile.mkdtemp(prefix="zdoctor-home-"))
    os.chmod(top, 0o755)
    try:
        home = top / "home"
        site = home / ".local" / "lib" / f"python{VERSION}" / "site-packages"
        site.mkdir(parents=True)
        seen = _witness_dir(top)
        (site / "x.pth").write_text(WITNESS_PTH.format(dir=str(seen)))
        _chown_tree(home, account)
        subprocess.run(["usermod", "-d", str(home), account.name], check=True, capture_output=True)
        yield home, seen
    finally:
        subprocess.run(["usermod", "-d", "/nonexistent", account.name], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


@contextmanager
def broken_libstdcxx(account: Account) -> Iterator[tuple[str, str]]:
    """A C++ extension needing GLIBCXX_3.4.30 and an old libstdc++ on LD_LIBRARY_PATH, readable by every
    user: the command fails in ld.so, so zdoctor traces it and runs its fix trials (other libstdc++)."""
    top = Path(tempfile.mkdtemp(prefix="zdoctor-glibcxx-"))
    os.chmod(top, 0o755)
    try:
        old = make_old_libstdcxx(top / "old").parent
        exts = top / "exts"
        build_extension(exts, "needsnew")
        yield str(old), str(exts)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _check(python: Path | str, exts: str, old: str, state: Path, **extra: str) -> dict:
    command = shlex.join([str(python), "-c", f"import sys; sys.path.insert(0, {exts!r}); import needsnew"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_") and k != "SUDO_USER"}
    env.update(LD_LIBRARY_PATH=old, XDG_STATE_HOME=str(state), **extra)
    # zdoctor itself starts without a user site (-s): what is counted is what zdoctor starts.
    proc = subprocess.run([sys.executable, "-s", "-m", "zdoctor", "check", "--json", "--timeout", "60",
                           "--python", str(python), "--command", command, "--playbook", "zero3-launch"],
                          env=env, cwd=str(REPO), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _trials(report: dict) -> list[str]:
    """The remedies a fix trial confirmed (the command then succeeded): proof that the trials ran."""
    return [r["title"] for f in report.get("findings", []) for r in f.get("remedies", []) if r.get("verified")]


def _assert_never_root(seen: Path) -> list[tuple[int, int, int, str]]:
    runs = witnessed(seen)
    assert runs, "the recording .pth never ran"
    assert all(r[0] != 0 and r[1] != 0 for r in runs), runs
    return runs


def test_a_whole_check_on_a_user_owned_venv_never_runs_its_code_as_root(account, tmp_path):
    with owned_environment(account) as env, broken_libstdcxx(account) as (old, exts):
        assert os.path.islink(env / "bin" / "python")  # the default venv layout: a link to the base
        seen = plant_witness(env, account)
        report = _check(env / "bin" / "python", exts, old, tmp_path / "state")
        runs = _assert_never_root(seen)
        assert {r[0] for r in runs} == {account.uid}
        assert len(runs) > 2, runs  # the probes, the traced command and its trials all started it
        assert _trials(report), "no fix trial was run"


def test_a_whole_check_on_a_user_owned_conda_prefix_never_runs_its_code_as_root(account, tmp_path):
    with conda_like_prefix(account) as (python, seen), broken_libstdcxx(account) as (old, exts):
        report = _check(python, exts, old, tmp_path / "state")
        runs = _assert_never_root(seen)
        assert len(runs) > 2, runs
        assert _trials(report), "no fix trial was run"


def test_the_system_python_with_another_users_home_never_runs_that_user_site_as_root(account, tmp_path):
    with foreign_home(account) as (home, seen), broken_libstdcxx(account) as (old, exts):
        report = _check(SYSTEM_PYTHON, exts, old, tmp_path / "state", HOME=str(home))
        runs = _assert_never_root(seen)
        assert len(runs) > 2, runs
        assert _trials(report), "no fix trial was run"


# -- the rule itself, on the same real states -----------------------------------------------------------

def test_the_rule_names_the_owner_and_keeps_root_only_for_an_isolated_root_interpreter(account, tmp_path):
    with owned_environment(account) as env, foreign_home(account) as (home, _seen):
        python = str(env / "bin" / "python")
        for argv in ([python, "-c", "pass"], [python, "-I", "-S", "-c", "pass"], ["python", "-V"]):
            found = codeowner.runs_as(argv, {"PATH": str(env / "bin"), "HOME": "/root"}, "/")
            assert found is not None and found.uid == account.uid, argv
        user_site = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
        found = codeowner.runs_as([SYSTEM_PYTHON, "-c", "pass"], user_site, "/")
        assert found is not None and found.uid == account.uid
        # Isolated with no site: the user site is never read, and the interpreter is root's.
        assert codeowner.runs_as([SYSTEM_PYTHON, "-I", "-S", "-c", "pass"], user_site, "/") is None
        assert codeowner.runs_as([SYSTEM_PYTHON, "-s", "-c", "pass"], user_site, "/") is None
        # A script whose #! names the environment's interpreter runs it.
        script = tmp_path / "tool"
        script.write_text(f"#!{python}\nprint(1)\n")
        os.chmod(script, 0o755)
        assert codeowner.runs_as([str(script)], {"PATH": "/usr/bin", "HOME": "/root"}, "/") is not None
        script.write_text("#!/bin/sh\necho 1\n")
        assert codeowner.runs_as([str(script)], {"PATH": "/usr/bin", "HOME": "/root"}, "/") is None
        script.write_text("#!/usr/bin/env python\nprint(1)\n")
        found = codeowner.runs_as([str(script)], {"PATH": str(env / "bin"), "HOME": "/root"}, "/")
        assert found is not None and found.uid == account.uid
        # A -c query started from a folder the user owns imports from it: never as root.
        found = codeowner.runs_as([SYSTEM_PYTHON, "-c", "import json"], {"PATH": "/usr/bin", "HOME": "/root"},
                                  str(env))
        assert found is not None and found.uid == account.uid
        assert codeowner.runs_as(["/bin/true"], {"PATH": "/usr/bin", "HOME": str(home)}, "/") is None


def test_a_remedy_step_that_runs_the_users_interpreter_runs_as_that_user_streamed_or_on_the_terminal(account):
    """A remedy's lines run as root by the guide (``pip install`` into the environment, say) start the
    environment's interpreter as its owner, both read line by line and with the terminal handed over."""
    from zdoctor.core.model import Remedy
    from zdoctor.walk.apply import run_remedy

    with owned_environment(account) as env:
        seen = plant_witness(env, account)
        remedy = Remedy(title="t", commands=[f"{shlex.quote(str(env / 'bin' / 'python'))} -c pass"])
        clean = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
        streamed = run_remedy(remedy, clean, cwd="/")
        assert streamed.ok, streamed.output
        on_terminal = run_remedy(remedy, clean, cwd="/",
                                 terminal=lambda argv, run_env: subprocess.call(argv, env=run_env, cwd="/"))
        assert on_terminal.ok, on_terminal.error
        runs = witnessed(seen)
        assert len(runs) == 2 and {r[:3] for r in runs} == {(account.uid, account.uid, account.gid)}, runs
