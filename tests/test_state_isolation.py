"""No test touches the user's own zdoctor state or home: the state directory is redirected before any
fixture runs (a module's ``zdoctor check`` included), and the run's guard sees a write into a home."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REAL_HOME, REAL_STATE, RUN_STATE, home_listing, listing_changes, run_cli

BEFORE_ANY_FIXTURE = os.environ.get("XDG_STATE_HOME")


def inside_home(path: str) -> bool:
    home = str(REAL_HOME.resolve())
    return str(Path(path).resolve()).startswith(home.rstrip("/") + "/")


@pytest.fixture(scope="module")
def module_check() -> tuple[str, set[str]]:
    """A ``zdoctor check`` run by a module-scoped fixture, as the end-to-end files do: what it saw as its
    state home, and the user's session files just after it."""
    before = set(os.listdir(REAL_STATE / "sessions")) if (REAL_STATE / "sessions").is_dir() else set()
    state = os.environ["XDG_STATE_HOME"]
    proc = run_cli(["check", "--json", "--playbook", "gpu-stack"])
    assert proc.returncode in (0, 1, 3), proc.stderr
    after = set(os.listdir(REAL_STATE / "sessions")) if (REAL_STATE / "sessions").is_dir() else set()
    return state, after - before


def test_state_is_redirected_when_the_test_module_is_imported():
    assert BEFORE_ANY_FIXTURE == RUN_STATE
    assert not inside_home(RUN_STATE)


def test_module_fixture_check_lands_outside_the_users_state(module_check):
    state, new_in_real = module_check
    assert not inside_home(state)
    assert list((Path(state) / "zdoctor" / "sessions").glob("*.jsonl")), "the check recorded no session"
    assert new_in_real == set()


def test_the_guard_sees_a_session_written_into_a_home(tmp_path):
    """A real zdoctor run with only HOME set (no XDG_STATE_HOME), as a fixture ran before the redirection:
    the listing the run's guard compares tells the difference."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("")
    state = home / ".local" / "state" / "zdoctor"
    before = home_listing(home, state)
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env["HOME"] = str(home)
    proc = run_cli(["check", "--json", "--playbook", "gpu-stack"], env=env)
    assert proc.returncode in (0, 1, 3), proc.stderr
    changes = listing_changes(before, home_listing(home, state))
    assert "added ~/.local" in changes
    assert any(c.startswith("added ") and c.endswith(".jsonl") for c in changes), changes
    assert listing_changes(before, before) == []
