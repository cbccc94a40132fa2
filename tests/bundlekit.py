"""The one-file bundle for tests: built once per test run from this checkout, and the interpreters it is
run with (the oldest supported Python, 3.8, and the distribution's Python 3.11), each started from an empty
directory with an empty environment, so nothing of zdoctor but the bundle can be found."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from kmsgkit import private_kmsg_argv

REPO = Path(__file__).resolve().parent.parent
_BUILT: list[Path] = []


def build_bundle() -> Path:
    """``zdoctor build-bundle`` run from the checkout (downloads the wheels once, then from the cache)."""
    if _BUILT:
        return _BUILT[0]
    out = Path(tempfile.mkdtemp(prefix="zdoctor-bundle-")) / "zdoctor.pyz"
    proc = subprocess.run([sys.executable, "-m", "zdoctor", "build-bundle", "-o", str(out)], cwd=str(REPO),
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    _BUILT.append(out)
    return out


def _first(candidates: list[str]) -> str | None:
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    return None


def interpreter(version: str) -> str:
    """A real interpreter of ``version`` ("3.8", "3.9", "3.11"): ``$ZDOCTOR_TEST_PY38`` (and so on),
    the distribution's, pyenv's, or on PATH. Missing: the test fails when ``ZDOCTOR_REQUIRE_PYTHONS`` is set
    (CI), and is skipped otherwise."""
    env = os.environ.get("ZDOCTOR_TEST_PY" + version.replace(".", ""))
    found = _first([
        env or "",
        f"/usr/bin/python{version}",
        *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")), reverse=True),
        shutil.which(f"python{version}") or "",
    ])
    if found is None:
        if os.environ.get("ZDOCTOR_REQUIRE_PYTHONS"):
            pytest.fail(f"no Python {version} interpreter on this machine")
        pytest.skip(f"no Python {version} interpreter on this machine")
    return found


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with nothing of the test run in it: no PYTHONPATH, no virtualenv, a fresh HOME."""
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "XDG_STATE_HOME": str(home / "state"), "TMPDIR": str(home / "tmp"), "NO_COLOR": "1"}
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env.update(extra)
    return env


def offline(argv: list[str]) -> list[str]:
    """``argv`` in a network namespace of its own (only a loopback that is down) where ``unshare -n`` works."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n", *argv]
    return argv


def run_bundle(python: str, bundle: Path, args: list[str], home: Path, cwd: Path, *, timeout: float = 300,
               network: bool = False, kmsg: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``python bundle ARGS`` from ``cwd`` with a clean environment and (unless ``network``) no network; with
    ``kmsg``, that kmsg-format file is its kernel log (the machine's own changes while other tests run)."""
    argv = [python, str(bundle), *args]
    argv = argv if network else offline(argv)
    return subprocess.run(argv if kmsg is None else private_kmsg_argv(kmsg, argv), cwd=str(cwd),
                          env=clean_env(home, **env),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
