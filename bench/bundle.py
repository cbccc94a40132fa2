"""The one-file bundle against the installed tool: size, first start (empty cache) and later starts.

Budgets: the bundle under 15 MB, its first start under 2 s, later starts within 0.3 s of the installed
tool. The installed tool is this checkout's wheel in a fresh venv (as in ``bench/startup.py``); the bundle
is built from the same checkout and run by the same interpreter (and by Python 3.8 when ``--py38`` names
one). "First start" runs with a new, empty cache directory each time: extraction, compiling every module
imported, and the command itself.

    python bench/bundle.py [--runs N] [--py38 PYTHON] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import venv_exe  # noqa: E402

COMMANDS = [["--version"], ["playbooks", "list"], ["check", "--json", "--no-log"]]


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd,
                          stdin=subprocess.DEVNULL, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv}: exit {proc.returncode}: {proc.stderr.decode()[-300:]}")
    return elapsed


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
        inst: list[float] = []
        first: dict[str, list[float]] = {label: [] for label, _ in pythons}
        later: dict[str, list[float]] = {label: [] for label, _ in pythons}
        for label, py in pythons:
            timed([py, str(pyz), *cmd], env_for(f"later-{label}"), str(root))  # fill the cache once
        for i in range(args.runs):
            inst.append(timed([*installed, *cmd], env_for("installed"), str(root)))
            for label, py in pythons:
                first[label].append(timed([py, str(pyz), *cmd], env_for(f"first-{label}-{cmd[0]}-{i}"), str(root)))
                later[label].append(timed([py, str(pyz), *cmd], env_for(f"later-{label}"), str(root)))
        rows.append({"command": " ".join(cmd), "how": "installed", "median_s": median(inst)})
        for label, _ in pythons:
            rows.append({"command": " ".join(cmd), "how": f"{label}, first start", "median_s": median(first[label])})
            rows.append({"command": " ".join(cmd), "how": f"{label}, later start", "median_s": median(later[label]),
                         "vs_installed_s": median(later[label]) - median(inst)})
    print(f"zdoctor.pyz: {size / 2**20:.1f} MiB (budget 15 MB)")
    print("| command | how | median | later minus installed |")
    print("|---|---|---|---|")
    for r in rows:
        delta = f"{r['vs_installed_s']:+.2f} s" if "vs_installed_s" in r else ""
        print(f"| `{r['command']}` | {r['how']} | {r['median_s']:.2f} s | {delta} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"size_bytes": size, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
