"""The guided session from an installed wheel: screens, stylesheet, practice scenarios and glossary are
found inside the package, and a practice walk reaches its diagnosis there."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

from conftest import REPO
from test_wheel import dependency_dirs

PILOT = r"""
import asyncio, sys
from zdoctor.front.tui import _screens_app
from zdoctor.walk.practice import scenarios_dir
from zdoctor.core.glossary import glossary_path

mod = _screens_app()
for path in (mod.__file__, scenarios_dir(), glossary_path()):
    print("from", path)

async def main():
    app = mod.make_app(demo="conda-ld-library-path", argv=["--demo"], export_dir=sys.argv[1])
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(400):
            await pilot.pause(0.05)
            ws = app.screen
            if type(ws).__name__ != "WalkScreen" or ws.outcome is None:
                continue
            if ws.walk.node.kind == "diagnosis":
                break
            await pilot.press("n")
        print("path", " ".join(app.screen.walk.path))
        await pilot.press("t")
        await pilot.pause(0.3)
        print("screen", type(app.screen).__name__, app.screen.query_one("#terms").option_count)

asyncio.run(main())
"""


def test_practice_walk_from_an_installed_wheel(tmp_path):
    dist = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(dist), str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    vpy = env_dir / "bin" / "python"
    site = Path(subprocess.check_output([str(vpy), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    (site / "deps.pth").write_text("\n".join(dependency_dirs()) + "\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "-q",
                           *map(str, dist.glob("zdoctor-*.whl"))], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    out = subprocess.run([str(vpy), "-c", PILOT, str(tmp_path)], capture_output=True, text=True, cwd=str(tmp_path),
                         env=env, timeout=180, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for line in lines:
        if line.startswith("from "):
            assert line[5:].startswith(str(env_dir)), f"{line} does not come from the installed wheel"
    assert "path symptom loaded needs layers verify source fix-ld-library-path diag-ld-library-path" in lines
    (glossary,) = [line for line in lines if line.startswith("screen ")]
    assert glossary.startswith("screen GlossaryScreen ") and int(glossary.split()[-1]) >= 10
