"""Shared fixtures: every test gets its own session directory; CLI runs as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import pytest
from prockit import spawn  # noqa: F401 - the detached-process fixture, for every test module

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the session log at a private directory for each test."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def run_cli(args: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m zdoctor ARGS`` for real and capture its output."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("NO_COLOR", "1")
    return subprocess.run([sys.executable, "-m", "zdoctor", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or str(REPO), timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def cli():
    return run_cli


def dependency_dirs() -> list[str]:
    """Where this interpreter finds zdoctor's dependencies (a venv's own and, with system site packages,
    the base interpreter's), never the checkout itself."""
    dirs = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return list(dict.fromkeys(dirs))
