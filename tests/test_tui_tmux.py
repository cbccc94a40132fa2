"""The installed `zdoctor` in a real terminal (tmux): a whole practice scenario by keyboard, exported as
Markdown; and a session killed mid-walk (as an SSH drop would) resumed with `zdoctor --resume`.

Runs with NO_COLOR and TERM=screen at 80x24, and with TERM=xterm-256color in a window resized while the
app runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO

from zdoctor.walk.session import load_events, sessions_dir

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

SCENARIO = "conda-ld-library-path"


def zdoctor_argv() -> list[str]:
    """The console script when it is installed, else ``python -m zdoctor`` (the checkout is on PYTHONPATH
    either way, so the code under test runs)."""
    script = shutil.which("zdoctor")
    return [script] if script else [sys.executable, "-m", "zdoctor"]


class Tmux:
    """One private tmux server with one window running a command."""

    def __init__(self, tmp_path: Path, state: Path) -> None:
        self.socket = f"zdoctor-test-{os.getpid()}-{id(self) % 10000}"
        self.cwd = tmp_path
        self.state = state
        self.base = ["tmux", "-u", "-L", self.socket]
        self.env = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOME": os.environ.get("HOME", "/root")}

    def tmux(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run([*self.base, *args], capture_output=True, text=True, env=self.env, timeout=30)
        if check and proc.returncode:
            raise AssertionError(f"tmux {' '.join(args)}: {proc.stderr}")
        return proc.stdout

    def start(self, args: list[str], size: tuple[int, int], term: str, no_color: bool = False) -> None:
        env = {**self.env, "TERM": term, "XDG_STATE_HOME": str(self.state), "PYTHONPATH": str(REPO),
               "PYENV_VERSION": os.environ.get("PYENV_VERSION", "")}
        if no_color:
            env["NO_COLOR"] = "1"
        command = "exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items() if v) + " " + \
            shlex.join([*zdoctor_argv(), *args])
        self.tmux("kill-session", "-t", "zd", check=False)
        self.tmux("new-session", "-d", "-s", "zd", "-x", str(size[0]), "-y", str(size[1]), "-c", str(self.cwd),
                  command)
        self.tmux("set-option", "-t", "zd", "remain-on-exit", "on")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "zd")

    def send(self, *keys: str, pause: float = 0.3) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", "zd", key)
            time.sleep(pause)

    def wait(self, *texts: str, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = self.screen()
            flat = " ".join(screen.split())
            if all(" ".join(t.split()) in flat for t in texts):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"never saw {texts!r}; the screen:\n{screen}")

    def wait_gone(self, *texts: str, timeout: float = 60.0) -> str:
        """Wait until none of ``texts`` is on the screen (a closed dialog, a left screen)."""
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = self.screen()
            flat = " ".join(screen.split())
            if not any(" ".join(t.split()) in flat for t in texts):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"still saw one of {texts!r}; the screen:\n{screen}")

    def press(self, key: str, *until: str, gone: tuple[str, ...] = ()) -> str:
        """Send one key and wait for the screen state it leads to: ``until`` shown and ``gone`` no longer shown.
        The next key goes only to the screen that is ready for it (an Escape followed at once by a key reaches
        a busy app as one Alt+key sequence; a key sent mid-transition goes to the screen being left)."""
        self.send(key, pause=0)
        if gone:
            self.wait_gone(*gone)
        return self.wait(*until) if until else self.screen()

    def pane(self, field: str) -> str:
        return self.tmux("display-message", "-p", "-t", "zd", f"#{{{field}}}").strip()

    def wait_dead(self, timeout: float = 20.0) -> str:
        """Wait until the app has exited; its exit status when tmux caught it (sometimes it does not: the
        session log's ``session_end`` is the check that counts)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.pane("pane_dead") == "1":
                time.sleep(0.2)
                return self.pane("pane_dead_status")
            time.sleep(0.1)
        raise AssertionError(f"zdoctor did not exit; the screen:\n{self.screen()}")

    def kill_app(self) -> None:
        """SIGKILL the app and everything it started, as a dropped connection with no time to clean up."""
        proc = psutil.Process(int(self.pane("pane_pid")))
        for p in [*proc.children(recursive=True), proc]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)

    def close(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.fixture
def term(tmp_path, state_home):
    t = Tmux(tmp_path, state_home)
    yield t
    t.close()


def only_session(state: Path) -> str:
    (path,) = list(sessions_dir(state / "zdoctor").iterdir())
    return path.name[:-len(".jsonl")] if path.name.endswith(".jsonl") else path.name


STEPS = ["1. The symptom", "2. Which libstdc++", "3. GLIBCXX versions", "4. Every layer",
         "5. Verify the hypothesis", "6. Where does the old copy", "7. Fix: drop the offending",
         "An LD_LIBRARY_PATH entry loads"]


def go_next(term: Tmux, times: int = 1) -> None:
    """Press n once per step, each time only after the step has been evaluated (its "Next →" line shows:
    a key pressed while probes run is refused with a notice, as a user would see)."""
    for _ in range(times):
        flat = " ".join(term.screen().split())
        heading = re.sub(r"Next → .*", "", flat)  # the current step's title, not the announced next one
        current = max(i for i, t in enumerate(STEPS) if t in heading)
        upcoming = STEPS[current + 1]
        term.wait(f"Next → {upcoming}")
        term.send("n")
        deadline = time.monotonic() + 30
        while upcoming not in re.sub(r"Next → .*", "", " ".join(term.screen().split())):  # the step itself, not
            assert time.monotonic() < deadline, f"never reached {upcoming!r}"       # the line announcing it
            time.sleep(0.1)


def test_a_whole_practice_scenario_in_a_real_terminal(term, tmp_path, state_home):
    """Every key waits for the screen state the previous one led to, never for a fixed time: on a loaded
    machine a key sent during a step transition, or right after an Escape, would otherwise be lost."""
    term.start(["--demo"], (80, 24), "screen", no_color=True)
    term.wait("Practice (learn mode)", SCENARIO)
    term.press("Enter", "1. The symptom: run the launch under the real loader", "Next → 2. Which libstdc++.so.6",
               "n Next step")
    term.wait("Next → 2. Which libstdc++")
    term.press("?", "Keys", "Esc closes", "Next step", "Other branch", "Export")
    term.press("Escape", "1. The symptom", gone=("Esc closes",))
    term.press("t", "Glossary", "SONAME")
    term.press("Escape", "1. The symptom", gone=("Glossary",))
    go_next(term, 2)
    term.wait("3. GLIBCXX versions: needed vs provided", "Next → 4. Every layer")
    term.press("e", "Evidence: 3. GLIBCXX versions", "what each library the training imports gets")
    term.press("Escape", "Next → 4. Every layer", gone=("Evidence: 3. GLIBCXX versions",))
    go_next(term, 5)
    screen = term.wait("Diagnosis: An LD_LIBRARY_PATH entry loads an old libstdc++")
    assert "1 symptom › 2 loaded › 3 needs › 4 layers" in " ".join(screen.split())
    term.press("g", "● diag-ld-library-path", "⇒ diag-ld-library-path")
    term.press("Escape", "Diagnosis: An LD_LIBRARY_PATH entry", gone=("● diag-ld-library-path",))
    term.press("r", "Drop /opt/conda/lib from LD_LIBRARY_PATH", "unset LD_LIBRARY_PATH", "a Apply")
    term.press("a", "Yes, write it", "Practice: nothing is run")  # a shell-only fix: a file to source
    term.press("Enter", "Declined (answered No in the confirmation)")  # the focused answer is No
    term.press("Escape", "Diagnosis: An LD_LIBRARY_PATH entry", gone=("Declined (answered No",))
    term.press("n", "Walk finished")
    term.press("x", "Export this session")
    term.send("m", pause=0)
    sid = only_session(state_home)
    md_path = tmp_path / f"zdoctor-{sid}.md"
    term.wait("Written:", str(tmp_path)[:30])
    assert md_path.exists()
    term.press("Escape", gone=("Export this session",))
    term.send("q", pause=0)
    assert term.wait_dead() in ("0", "")

    md = md_path.read_text()
    assert f"# zdoctor session `{sid}`" in md and "- **Mode:** demo" in md
    assert "- **Host:** train-node-01" in md
    end = load_events(sid)[-1]
    assert end["type"] == "session_end" and end["exit_code"] == 0
    for i, node in enumerate(["symptom", "loaded", "needs", "layers", "verify", "source", "fix-ld-library-path",
                              "diag-ld-library-path"], 1):
        assert f"{i}. `{node}`" in md
    assert "**Diagnosis:** An LD\\_LIBRARY\\_PATH entry loads an old libstdc++" in md
    assert "cpu\\_adam.so needs GLIBCXX\\_3.4.30" in md
    assert "(declined: answered No in the confirmation)" in md


def test_killed_mid_walk_then_resumed(term, tmp_path, state_home):
    term.start(["--demo", SCENARIO], (80, 24), "xterm-256color")
    term.wait("1. The symptom")
    go_next(term, 2)
    term.wait("3. GLIBCXX versions: needed vs provided", "Next → 4. Every layer")
    sid = only_session(state_home)
    term.kill_app()
    assert term.wait_dead() != "0"
    events = load_events(sid)
    assert events[-1]["type"] != "session_end"  # nothing had the chance to close the log
    assert [e["node"] for e in events if e["type"] == "node_enter"] == ["symptom", "loaded", "needs"]

    term.start(["--resume"], (100, 30), "xterm-256color")
    term.wait("1 symptom › 2 loaded › 3 needs", "3. GLIBCXX versions: needed vs provided")
    term.tmux("resize-window", "-t", "zd", "-x", "120", "-y", "40")
    term.wait("Next → 4. Every layer of the GCC toolchain")
    # the step's findings come first; below them, the probe read before the kill, with its recorded time
    for _ in range(4):
        term.send("PageDown")
    term.wait(" libs 4.13 s")
    for _ in range(4):
        term.send("PageUp")
    term.wait("3. GLIBCXX versions: needed vs provided")
    assert term.pane("pane_width") == "120"
    go_next(term, 5)
    term.wait("Diagnosis: An LD_LIBRARY_PATH entry loads an old libstdc++")
    term.send("x", "m")
    term.wait("Written:")
    assert (tmp_path / f"zdoctor-{sid}.md").exists()
    term.send("Escape", "q")
    assert term.wait_dead() in ("0", "")

    md = (tmp_path / f"zdoctor-{sid}.md").read_text()
    assert "- **Resumed:**" in md and "8. `diag-ld-library-path` (diagnosis)" in md
    events = load_events(sid)
    types = [e["type"] for e in events]
    assert types.count("session_start") == 1 and types.count("session_resume") == 1
    assert [e["node"] for e in events if e["type"] == "node_enter"][:3] == ["symptom", "loaded", "needs"]
    assert types[-1] == "session_end" and events[-1]["exit_code"] == 0


def test_fleet_screen_in_a_real_terminal(term, tmp_path, state_home):
    """`zdoctor fleet --replay last --tui` on a recorded fleet: the matrix, a node's findings, a fact across
    nodes, a Markdown export written to the working directory, and q exiting with the fleet's code."""
    from fleetkit import h200_fleet, h200_report

    from zdoctor.fleet.record import record_report
    from zdoctor.walk.session import SessionLog

    report = h200_report()
    with SessionLog.create("fleet", ["fleet", "--hostfile", "hf"], {"kind": "fleet", "hostname": "login-1"},
                           state_dir=state_home / "zdoctor") as log:
        log.record("fleet_start", {"launcher": "ssh", "source": "hf", "hosts": [n.host for n in report.nodes]})
        for run in h200_fleet():
            log.record("fleet_node", {"node": run.to_dict()})
        record_report(report, log.record)
        sid = log.id
    term.start(["fleet", "--replay", "last", "--tui"], (110, 34), "xterm-256color")
    term.wait("gpu-1", "gpu-5", "NVIDIA driver", "x Export")
    term.send("Down", "Enter")  # the second node: gpu-2
    term.wait("gpu.runtime", "torch needs CUDA 13.0")
    term.send("Escape", "f", "Enter")  # the first fact row: a differing one comes first
    screen = term.wait("Most nodes: 580.159.04", "570.124.06: gpu-2", "Why it matters")
    assert "gpu-2" in screen
    term.send("Escape", "x")
    term.wait("Markdown")
    term.send("m")
    deadline = time.monotonic() + 20
    while not (tmp_path / f"zdoctor-{sid}.md").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    md = (tmp_path / f"zdoctor-{sid}.md").read_text()
    assert "## Fleet" in md and "gpu-2: 570.124.06" in md
    term.send("Escape", "q")
    assert term.wait_dead() in ("1", "")


def test_escape_sequences_from_a_node_never_reach_the_terminal(term, tmp_path, state_home):
    """A node's snapshot is its own to make up: a fact carrying an OSC title sequence and a clear-screen is
    drawn as text without its control characters, so the terminal keeps its title and its screen."""
    from fleetkit import h200_node

    from zdoctor.fleet.record import record_report
    from zdoctor.fleet.result import FleetReport
    from zdoctor.walk.session import SessionLog

    evil = "/opt/\x1b]2;owned-title\x07\x1b[2Jconda/lib"
    runs = [h200_node("a"), h200_node("b", lambda p: p["libs"]["env"].update(LD_LIBRARY_PATH=evil)),
            h200_node("c")]
    report = FleetReport.build(runs, "ssh", "hf")
    with SessionLog.create("fleet", ["fleet"], {"kind": "fleet"}, state_dir=state_home / "zdoctor") as log:
        log.record("fleet_start", {"launcher": "ssh", "source": "hf", "hosts": ["a", "b", "c"]})
        for run in runs:
            log.record("fleet_node", {"node": run.to_dict()})
        record_report(report, log.record)
    term.tmux("set-option", "-g", "allow-rename", "on", check=False)
    term.start(["fleet", "--replay", "last", "--tui"], (120, 34), "xterm-256color")
    term.wait("LD_LIBRARY_PATH")
    term.send("f", "Enter")
    screen = term.wait("]2;owned-title[2Jconda/lib", "Why it matters")
    assert "Fact" in screen
    assert "owned-title" not in term.pane("pane_title")
    term.send("q")
    term.wait_dead()


def test_ctrl_c_in_a_real_terminal_leaves_as_q_does(term, state_home):
    """A real terminal sends Ctrl-C to the app as a key (raw mode): the guide leaves, and closes its
    session as ``q`` does, on the walk screen and on the remedy screen alike."""
    for remedy_screen in (False, True):
        for old in sessions_dir(state_home / "zdoctor").glob("*.jsonl"):  # one session per start
            old.unlink()
        term.start(["--demo", SCENARIO], (80, 24), "xterm-256color")
        term.wait("1. The symptom")
        if remedy_screen:
            go_next(term, 6)
            term.wait("Next → An LD_LIBRARY_PATH entry loads")
            term.press("r", "unset LD_LIBRARY_PATH")
        term.send("C-c", pause=0)  # on the walk screen, at once: its session log may not be open yet
        assert term.wait_dead() in ("0", "")
        events = load_events(only_session(state_home))  # written all the same
        assert events[-1]["type"] == "session_end" and events[-1]["exit_code"] == 0
