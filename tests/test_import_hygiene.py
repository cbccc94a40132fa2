"""The headless core never imports textual; `--version` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

PROBE = """
import json, sys
sys.argv = ["zdoctor"] + sys.argv[1:]
from zdoctor.front import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
mods = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "networkx", "rich", "elftools", "screens"))
sys.stderr.write("@@" + json.dumps({"code": code, "mods": mods}) + "\\n")
"""


def loaded_modules(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          cwd=str(REPO), timeout=120, stdin=subprocess.DEVNULL)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("@@")][-1]
    return json.loads(line[2:])


def test_check_never_imports_textual():
    out = loaded_modules("check", "--json", "--no-log")
    assert out["code"] in (0, 1, 3)
    assert not [m for m in out["mods"] if m.startswith(("textual", "screens"))]


def test_core_modules_import_without_textual():
    code = ("import sys, pkgutil, importlib, zdoctor\n"
            "for m in pkgutil.walk_packages(zdoctor.__path__, 'zdoctor.'):\n"
            "    skip = ('zdoctor.__main__', 'zdoctor.front.tui', 'zdoctor.scripts.probe_script')\n"
            "    if m.name not in skip and not m.name.startswith('zdoctor.screens'):\n"
            "        importlib.import_module(m.name)\n"
            "print([m for m in sys.modules if m.startswith('textual')])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_version_imports_nothing_heavy():
    out = loaded_modules("--version")
    assert out["code"] == 0
    assert out["mods"] == []


FIRST_SCREEN = """
import sys
from zdoctor.front import cli
from zdoctor.front.tui import _screens_app
args = cli.parse_args([])
app = _screens_app().make_app(python=None, argv=[], host=cli._live_host(args))
from screens.start import StartScreen
print(" ".join(sorted(m for m in sys.modules if m.startswith("zdoctor"))))
"""


def test_the_guides_first_screen_loads_none_of_the_probes_machinery():
    """What a bare ``zdoctor`` imports before its start screen is drawn: the probes' registry, their facts'
    types, the runner and the replay side load after it (with the first probe), not before."""
    proc = subprocess.run([sys.executable, "-c", FIRST_SCREEN], capture_output=True, text=True, cwd=str(REPO),
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert "zdoctor.host.live" in loaded and "zdoctor.proc.target" in loaded
    assert not loaded & {"zdoctor.core.registry", "zdoctor.core.factstypes", "zdoctor.proc.runner",
                         "zdoctor.proc.contain", "zdoctor.host.replay", "zdoctor.walk.playbook"}
