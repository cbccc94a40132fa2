"""A check starts its slow live probes as soon as the host is made: ``Host.start`` returns at once, the probe
runs meanwhile, and a later request waits for that same run instead of starting another. The slow
interpreter is real: it waits for a file before it starts the real one."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from test_start_progress import held_interpreter

from zdoctor.core import progress
from zdoctor.front.early import EARLY_PROBES, start_early_probes
from zdoctor.host import LiveHost


def test_early_probes_run_while_the_rest_loads_and_are_computed_once(tmp_path: Path) -> None:
    python, release = held_interpreter(tmp_path)
    runs = tmp_path / "runs"
    python.write_text(python.read_text().replace("exec ", f"echo run >> '{runs}'\nexec ", 1))
    host = LiveHost(python=str(python))
    start_early_probes(host)  # returns while the interpreter is held
    assert set(EARLY_PROBES) == {"livetrace", "pyenv"}
    assert not set(EARLY_PROBES) & set(host.recorded())
    deadline = time.monotonic() + 60  # a bound on the wait, not a timed assertion
    while not {r.name for r in progress.snapshot()[0]} >= set(EARLY_PROBES) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {r.name for r in progress.snapshot()[0]} >= set(EARLY_PROBES)  # running, held by the interpreter
    assert not set(EARLY_PROBES) & set(host.recorded())
    release.write_text("")
    res = host.results(["pyenv", "livetrace"])
    assert res["pyenv"].status == "ok" and res["pyenv"].facts["python"]["version"].split()[0] == \
        sys.version.split()[0]
    assert res["livetrace"].status in ("ok", "skip") and res["livetrace"].status != "crash"
    started = len(runs.read_text().splitlines())
    assert host.result("pyenv") is res["pyenv"]  # cached: no second run
    assert len(runs.read_text().splitlines()) == started
