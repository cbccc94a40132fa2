"""The guided session's responsiveness, measured in a real terminal (tmux) and in-process (Pilot).

1. Time to first screen: from starting ``zdoctor`` (the live node) until the start screen is drawn, and
   ``zdoctor --demo SCENARIO`` until the first step is drawn. Target: under 1 s.
2. Key-press latency while probes run: ``zdoctor --python TRAIN_PY`` probes the training environment
   (torch imports, the live loader trace, remedies re-run) for many seconds; meanwhile ``?`` opens the
   keys and Esc closes them, and the time until the screen shows it is measured.
3. The same in-process with Pilot: a probe that never returns, and ``l`` toggling a panel.

    python bench/tui.py [--runs N] [--python TRAIN_PY] [--json FILE]

tmux polls the screen every 5 ms, so its numbers include up to that much polling slack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCENARIO = "conda-ld-library-path"
TARGET_FIRST_SCREEN = 1.0


def zdoctor_argv() -> list[str]:
    script = shutil.which("zdoctor")
    return [script] if script else [sys.executable, "-m", "zdoctor"]


class Term:
    """A private tmux server running one command."""

    def __init__(self, state: Path, cwd: Path) -> None:
        self.base = ["tmux", "-u", "-L", f"zdoctor-bench-{os.getpid()}"]
        self.state, self.cwd = state, cwd
        self.env = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOME": os.environ.get("HOME", "/root")}

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, env=self.env).stdout

    def start(self, args: list[str]) -> float:
        env = {**self.env, "TERM": "xterm-256color", "XDG_STATE_HOME": str(self.state), "PYTHONPATH": str(REPO)}
        command = "exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + \
            shlex.join([*zdoctor_argv(), *args])
        self.tmux("kill-session", "-t", "b")
        t0 = time.perf_counter()
        self.tmux("new-session", "-d", "-s", "b", "-x", "100", "-y", "30", "-c", str(self.cwd), command)
        return t0

    def wait(self, text: str, timeout: float = 30.0, gone: bool = False) -> float:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            screen = self.tmux("capture-pane", "-p", "-t", "b")
            if (text in screen) != gone:
                return time.perf_counter()
            time.sleep(0.005)
        raise SystemExit(f"bench: never saw {text!r}{' go' if gone else ''}")

    def send(self, key: str) -> float:
        t0 = time.perf_counter()
        self.tmux("send-keys", "-t", "b", key)
        return t0

    def close(self) -> None:
        self.tmux("kill-server")


def first_screen(term: Term, runs: int, demo: bool) -> list[float]:
    out = []
    for _ in range(runs):
        if demo:
            t0 = term.start(["--demo", SCENARIO])
            out.append(term.wait("1. The symptom") - t0)
        else:
            t0 = term.start([])
            out.append(term.wait("First pass of every check") - t0)
        term.send("q")
        time.sleep(0.5)
    return out


def key_latency(term: Term, python: str, presses: int) -> tuple[list[float], list[float]]:
    """Open the keys (``?``) and close them (``q``) while the first pass probes the training environment;
    returns the samples taken while probes still ran, and those taken after."""
    term.start(["--python", python])
    term.wait("First pass of every check")
    during, after = [], []
    for _ in range(presses):
        probing = " s of " in term.tmux("capture-pane", "-p", "-t", "b")  # a probe row still counting
        t0 = term.send("?")
        opened = term.wait("Esc closes") - t0
        t0 = term.send("q")
        closed = term.wait("Esc closes", gone=True) - t0
        (during if probing else after).extend([opened, closed])
        time.sleep(0.05)
    term.send("q")
    return during, after


def pilot_latency(presses: int) -> tuple[list[float], list[float]]:
    """In-process: ``l`` toggles the learn panel while a probe never returns; also a key bound to nothing,
    which is what Pilot itself costs per key."""
    sys.path.insert(0, str(REPO))
    from zdoctor.front.tui import _screens_app
    from zdoctor.host import ReplayHost
    from zdoctor.walk.practice import get_scenario

    hold = threading.Event()

    class Stuck(ReplayHost):
        def _compute(self, name):
            if name == "livetrace":
                hold.wait(120)
            return super()._compute(name)

    host = Stuck(json.loads(get_scenario(SCENARIO).snapshot.read_text()))
    toggles: list[float] = []
    idle: list[float] = []

    async def run() -> None:
        app = _screens_app().make_app(host=host, argv=["bench"], export_dir=tempfile.gettempdir())
        async with app.run_test(size=(100, 30)) as pilot:
            while type(app.screen).__name__ != "StartScreen":
                await pilot.pause(0.01)
            await pilot.press("o")
            while type(app.screen).__name__ != "WalkScreen":
                await pilot.pause(0.01)
            explain = app.screen.query_one("#explain")
            for _ in range(presses):
                before = explain.display
                t0 = time.perf_counter()
                await pilot.press("l")
                while explain.display == before:
                    await pilot.pause(0)
                toggles.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await pilot.press("z")
                idle.append(time.perf_counter() - t0)
            assert app.screen.query_one("#node-probes").running, "the probe was expected to still run"
            hold.set()

    asyncio.run(run())
    return toggles, idle


def describe(label: str, values: list[float]) -> dict[str, float | str]:
    ms = [v * 1000 for v in values]
    row = {"measure": label, "runs": len(ms), "median_ms": round(statistics.median(ms), 1),
           "max_ms": round(max(ms), 1)}
    print(f"{label:<58} median {row['median_ms']:7.1f} ms   max {row['max_ms']:7.1f} ms   ({len(ms)} samples)")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--python", default=os.environ.get("ZDOCTOR_TEST_DS_ENV") and
                    str(Path(os.environ["ZDOCTOR_TEST_DS_ENV"]) / "bin" / "python") or sys.executable,
                    help="a training interpreter to probe while keys are pressed (torch makes it slow)")
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("bench: tmux is needed", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        term = Term(Path(tmp) / "state", Path(tmp))
        try:
            print(f"zdoctor: {shlex.join(zdoctor_argv())}; 100x30 tmux window; {os.cpu_count()} CPUs")
            rows.append(describe("first screen: zdoctor (this node)", first_screen(term, args.runs, False)))
            demo = "--demo" in subprocess.run([*zdoctor_argv(), "--help"], capture_output=True, text=True,
                                              env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
            if demo:
                rows.append(describe(f"first screen: zdoctor --demo {SCENARIO}", first_screen(term, args.runs, True)))
            else:
                print("first screen: zdoctor --demo: this zdoctor has no --demo flag; skipped")
            during, after = key_latency(term, args.python, max(8, 2 * args.runs))
            env_name = Path(args.python).parent.parent.name or "env"
            if during:
                rows.append(describe(f"key to screen while probing {env_name} (tmux)", during))
            if after:
                rows.append(describe("key to screen after the probes (tmux)", after))
        finally:
            term.close()
    toggles, idle = pilot_latency(20)
    rows.append(describe("key to screen while a probe hangs (Pilot, in-process)", toggles))
    rows.append(describe("  of which Pilot itself (a key bound to nothing)", idle))
    worst_first = max(r["median_ms"] for r in rows if str(r["measure"]).startswith("first screen"))
    print(f"target: first screen under {TARGET_FIRST_SCREEN * 1000:.0f} ms: "
          f"{'met' if worst_first < TARGET_FIRST_SCREEN * 1000 else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
