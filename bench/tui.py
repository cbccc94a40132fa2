"""The guided session's responsiveness, measured in a real terminal (tmux) and in-process (Pilot).

1. Time to first screen: from starting ``zdoctor`` (the live node) until the start screen is drawn, and
   ``zdoctor --demo SCENARIO`` until the first step is drawn, in rotated rounds with a bare Textual app (a
   header and one line, the toolkit's own floor) started the same way. Target: the start screen within
   1.2x the bare app's first screen (medians).
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

from startup import zdoctor_exe

REPO = Path(__file__).resolve().parent.parent
SCENARIO = "conda-ld-library-path"
TARGET_FIRST_SCREEN_RATIO = 1.2
#: The toolkit's floor: a Textual app with a header and one line, started like zdoctor.
BARE_APP = """
from textual.app import App
from textual.widgets import Header, Static


class Bare(App):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self):
        yield Header()
        yield Static("bare first screen")


Bare().run()
"""
BARE_MARK = "bare first screen"


def zdoctor_argv() -> list[str]:
    """zdoctor as this interpreter installed it, started like the bare app: the console script beside
    ``sys.executable`` (not a version manager's shim found first on ``PATH``, such as pyenv's, which runs
    bash and ``pyenv exec`` before Python starts: about 20 ms the bare app does not pay)."""
    return zdoctor_exe()


class Term:
    """A private tmux server running one command."""

    def __init__(self, state: Path, cwd: Path) -> None:
        self.base = ["tmux", "-u", "-L", f"zdoctor-bench-{os.getpid()}"]
        self.state, self.cwd = state, cwd
        self.env = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOME": os.environ.get("HOME", "/root")}

    def tmux(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, env=self.env).stdout

    def start(self, args: list[str], argv: list[str] | None = None) -> float:
        """Run ``zdoctor ARGS`` (or ``argv`` itself) in the window; returns when it was started."""
        env = {**self.env, "TERM": "xterm-256color", "XDG_STATE_HOME": str(self.state), "PYTHONPATH": str(REPO)}
        command = "exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + \
            shlex.join(argv if argv is not None else [*zdoctor_argv(), *args])
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
        screen = self.tmux("capture-pane", "-p", "-t", "b").rstrip()
        raise SystemExit(f"bench: never saw {text!r}{' go' if gone else ''}; the screen was:\n{screen}")

    def wait_exit(self, timeout: float = 30.0) -> None:
        """Until the window's command has exited (its session is gone), then a moment for its children."""
        end = time.perf_counter() + timeout
        while time.perf_counter() < end and subprocess.run([*self.base, "has-session", "-t", "b"],
                                                           capture_output=True, env=self.env).returncode == 0:
            time.sleep(0.02)
        time.sleep(0.2)

    def send(self, key: str) -> float:
        t0 = time.perf_counter()
        self.tmux("send-keys", "-t", "b", key)
        return t0

    def close(self) -> None:
        self.tmux("kill-server")


def first_screen(term: Term, kind: str) -> float:
    """Seconds until the first screen of ``kind`` is drawn: ``start`` (zdoctor on this node), ``demo``
    (zdoctor --demo SCENARIO) or ``bare`` (a bare Textual app)."""
    if kind == "demo":
        t0 = term.start(["--demo", SCENARIO])
        shown = term.wait("1. The symptom")
    elif kind == "bare":
        t0 = term.start([], [sys.executable, "-c", BARE_APP])
        shown = term.wait(BARE_MARK)
    else:
        t0 = term.start([])
        shown = term.wait("First pass of every check")
    term.send("q")
    term.wait_exit()  # the next round starts on a machine this one has left
    return shown - t0


def first_screens(term: Term, runs: int, kinds: list[str]) -> dict[str, list[float]]:
    """Each kind's first screen once per round, the order rotated each round (a load that comes and goes
    weighs on every kind alike)."""
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(runs):
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            out[kind].append(first_screen(term, kind))
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
    ap.add_argument("--first-screen-only", action="store_true", help="time the first screens alone")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("bench: tmux is needed", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        term = Term(Path(tmp) / "state", Path(tmp))
        try:
            print(f"zdoctor: {shlex.join(zdoctor_argv())}; 100x30 tmux window; {os.cpu_count()} CPUs")
            load = os.getloadavg()[0]
            demo = "--demo" in subprocess.run([*zdoctor_argv(), "--help"], capture_output=True, text=True,
                                              env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
            if not demo:
                print("first screen: zdoctor --demo: this zdoctor has no --demo flag; skipped")
            firsts = first_screens(term, args.runs, ["bare", "start", *(["demo"] if demo else [])])
            print(f"first screens in {args.runs} rotated rounds; load average {load:.1f} at the start, "
                  f"{os.getloadavg()[0]:.1f} at the end")
            rows.append(describe("first screen: a bare Textual app", firsts["bare"]))
            rows.append(describe("first screen: zdoctor (this node)", firsts["start"]))
            if demo:
                rows.append(describe(f"first screen: zdoctor --demo {SCENARIO}", firsts["demo"]))
            during, after = ([], []) if args.first_screen_only else \
                key_latency(term, args.python, max(8, 2 * args.runs))
            env_name = Path(args.python).parent.parent.name or "env"
            if during:
                rows.append(describe(f"key to screen while probing {env_name} (tmux)", during))
            if after:
                rows.append(describe("key to screen after the probes (tmux)", after))
        finally:
            term.close()
    if not args.first_screen_only:
        toggles, idle = pilot_latency(20)
        rows.append(describe("key to screen while a probe hangs (Pilot, in-process)", toggles))
        rows.append(describe("  of which Pilot itself (a key bound to nothing)", idle))
    medians = {str(r["measure"]): float(r["median_ms"]) for r in rows}
    bare = medians["first screen: a bare Textual app"]
    for label in [m for m in medians if m.startswith("first screen: zdoctor")]:
        ratio = medians[label] / bare
        rows.append({"measure": f"{label} / bare Textual app", "ratio": round(ratio, 2)})
        print(f"{label}: {ratio:.2f}x the bare Textual app's (target {TARGET_FIRST_SCREEN_RATIO:g}x): "
              f"{'met' if ratio <= TARGET_FIRST_SCREEN_RATIO else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
