"""The one-file bundle against the installed tool: size, first start (empty cache) and later starts.

Budgets: the bundle under 15 MB, its first start under 2 s, later starts within 0.3 s of the installed
tool. The installed tool is this checkout's wheel in a fresh venv (as in ``bench/startup.py``); the bundle
is built from the same checkout and run by the same interpreter (and by Python 3.8 when ``--py38`` names
one). "First start" runs with a new, empty cache directory each time: extraction, compiling every module
imported, and the command itself. With tmux, the guided session is timed too: from its start until the
start screen is drawn (80x24).

    python bench/bundle.py [--runs N] [--py38 PYTHON] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import venv_exe  # noqa: E402

COMMANDS = [["--version"], ["playbooks", "list"], ["check", "--json", "--no-log"]]


CPU: dict[int, float] = {}


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """Wall time of one run; its CPU time (user + system, with every process it waited for) goes to CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, check=False)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv}: exit {proc.returncode}: {proc.stderr.decode()[-300:]}")
    CPU[id(argv)] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed


def run_cpu(argv: list[str], env: dict[str, str], cwd: str, wall: list[float], cpu: list[float]) -> None:
    wall.append(timed(argv, env, cwd))
    cpu.append(CPU.pop(id(argv)))


def first_screen(argv: list[str], env: dict[str, str], cwd: str, text: str = "First pass of every check") -> float:
    """Seconds from starting ``argv`` in tmux (80x24) until the guided session's start screen shows ``text``."""
    base = ["tmux", "-u", "-L", f"zdoctor-bench-bundle-{os.getpid()}"]
    command = "exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in {**env, "TERM": "screen"}.items()) + \
        " " + shlex.join(argv)
    for _attempt in range(5):  # a server still shutting down from the previous run refuses a new session
        t0 = time.perf_counter()
        if subprocess.run([*base, "new-session", "-d", "-s", "b", "-x", "80", "-y", "24", "-c", cwd, command],
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.3)
    else:
        raise SystemExit("bench: tmux would not start a session")
    try:
        while time.perf_counter() - t0 < 60:
            screen = subprocess.run([*base, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True).stdout
            if text in screen:
                return time.perf_counter() - t0
            time.sleep(0.01)
        raise SystemExit(f"bench: {argv} never showed {text!r}")
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True)
        time.sleep(0.3)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--py38", help="also time the bundle under this Python 3.8")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    root = Path(tempfile.mkdtemp(prefix="zdoctor-bench-bundle-"))
    installed = venv_exe(root)
    pyz = root / "zdoctor.pyz"
    subprocess.run([sys.executable, "-m", "zdoctor", "build-bundle", "-o", str(pyz)], cwd=str(repo), check=True)
    size = pyz.stat().st_size
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "NO_COLOR": "1",
            "XDG_STATE_HOME": str(root / "state")}
    pythons = [("bundle", sys.executable)] + ([("bundle, Python 3.8", args.py38)] if args.py38 else [])
    rows = []
    def env_for(name: str) -> dict[str, str]:
        home = root / name
        return dict(base, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))

    for cmd in COMMANDS:
        # Interleaved (installed, then the bundle first and later start under each Python), so that the
        # load of a shared machine weighs on every column alike.
        inst: tuple[list[float], list[float]] = ([], [])
        first = {label: ([], []) for label, _ in pythons}
        later = {label: ([], []) for label, _ in pythons}
        for label, py in pythons:
            timed([py, str(pyz), *cmd], env_for(f"later-{label}"), str(root))  # fill the cache once
        for i in range(args.runs):
            run_cpu([*installed, *cmd], env_for("installed"), str(root), *inst)
            for label, py in pythons:
                run_cpu([py, str(pyz), *cmd], env_for(f"first-{label}-{cmd[0]}-{i}"), str(root), *first[label])
                run_cpu([py, str(pyz), *cmd], env_for(f"later-{label}"), str(root), *later[label])
        name = " ".join(cmd)
        rows.append({"command": name, "how": "installed", "median_s": median(inst[0]), "cpu_s": median(inst[1])})
        for label, _ in pythons:
            rows.append({"command": name, "how": f"{label}, first start", "median_s": median(first[label][0]),
                         "cpu_s": median(first[label][1])})
            rows.append({"command": name, "how": f"{label}, later start", "median_s": median(later[label][0]),
                         "cpu_s": median(later[label][1]),
                         "vs_installed_s": median(later[label][0]) - median(inst[0]),
                         "vs_installed_cpu_s": median(later[label][1]) - median(inst[1])})
    if shutil.which("tmux"):
        inst = []
        first = {label: [] for label, _ in pythons}
        later = {label: [] for label, _ in pythons}
        for label, py in pythons:
            first_screen([py, str(pyz)], env_for(f"tui-later-{label}"), str(root))
        for i in range(args.runs):
            inst.append(first_screen([*installed], env_for("installed"), str(root)))
            for label, py in pythons:
                first[label].append(first_screen([py, str(pyz)], env_for(f"tui-first-{label}-{i}"), str(root)))
                later[label].append(first_screen([py, str(pyz)], env_for(f"tui-later-{label}"), str(root)))
        name = "(guided session: start screen)"
        rows.append({"command": name, "how": "installed", "median_s": median(inst)})
        for label, _ in pythons:
            rows.append({"command": name, "how": f"{label}, first start", "median_s": median(first[label])})
            rows.append({"command": name, "how": f"{label}, later start", "median_s": median(later[label]),
                         "vs_installed_s": median(later[label]) - median(inst)})
    print(f"zdoctor.pyz: {size / 2**20:.1f} MiB (budget 15 MB)")
    print("| command | how | wall (median) | CPU (median) | later minus installed: wall, CPU |")
    print("|---|---|---|---|---|")
    for r in rows:
        delta = f"{r['vs_installed_s']:+.2f} s" if "vs_installed_s" in r else ""
        delta += f", {r['vs_installed_cpu_s']:+.2f} s" if "vs_installed_cpu_s" in r else ""
        cpu = f"{r['cpu_s']:.2f} s" if "cpu_s" in r else "—"
        print(f"| `{r['command']}` | {r['how']} | {r['median_s']:.2f} s | {cpu} | {delta} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"size_bytes": size, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
