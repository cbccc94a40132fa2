"""screens/, playbooks/ and assets/ work from an installed wheel, not only from the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, dependency_dirs


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("zdoctor-*.whl")
    return whl


def test_wheel_carries_the_data(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    assert "zdoctor/front/cli.py" in names
    assert "zdoctor/scripts/probe_script.py" in names
    assert any(n.startswith("zdoctor/playbooks/") and n.endswith(".toml") for n in names)
    assert any(n.startswith("zdoctor/screens/") and n.endswith(".py") for n in names)
    assert any(n.startswith("zdoctor/assets/") for n in names)
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_installed_wheel_runs(wheel: Path, tmp_path: Path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    vpy = env_dir / "bin" / "python"
    # Dependencies come from this environment's site-packages as a plain path entry (no .pth hooks run
    # from it), so the checkout itself is never importable inside the new venv.
    site = Path(subprocess.check_output([str(vpy), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    (site / "deps.pth").write_text("\n".join(dependency_dirs()) + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    exe = env_dir / "bin" / "zdoctor"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    run = dict(capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=120,
               stdin=subprocess.DEVNULL)

    where = subprocess.run([str(vpy), "-c", "import zdoctor, zdoctor.core.resources as r; "
                            "print(zdoctor.__file__); print(r.data_dir('playbooks')); "
                            "import zdoctor.front.tui as t; print(t._screens_app().__file__)"], **run)
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert line.startswith(str(env_dir)), f"{line} does not come from the installed wheel"

    listing = subprocess.run([str(exe), "playbooks", "list"], **run)
    assert listing.returncode == 0, listing.stderr
    assert "toolchain" in listing.stdout

    lint = subprocess.run([str(exe), "playbooks", "lint"], **run)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    chk = subprocess.run([str(exe), "check", "--json"], **run)
    assert chk.returncode in (0, 1, 3), chk.stderr
    doc = json.loads(chk.stdout)
    assert doc["findings"] and doc["summary"]["total"] == len(doc["findings"])
    assert {p["id"] for p in doc["playbooks"]} >= {"toolchain"}
