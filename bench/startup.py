"""Start-up budgets: `zdoctor --version` under 0.3 s, `zdoctor check` under 2 s (torch absent).

Runs each command several times as a real process (the installed console script) and reports the
median and the worst wall time, plus `python -X importtime`'s top imports for `check`.

    python bench/startup.py [--runs N] [--json FILE] [--python TRAIN_ENV_PY] [--installed]

By default zdoctor is timed from its own fresh venv, built from this checkout's wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGETS = {"--version": 0.3, "check": 2.0}


def zdoctor_exe() -> list[str]:
    here = Path(sys.executable).parent / "zdoctor"
    if here.exists():
        return [str(here)]
    found = shutil.which("zdoctor")
    return [found] if found else [sys.executable, "-m", "zdoctor"]


def venv_exe(root: Path, repo: Path | None = None) -> list[str]:
    """Build the wheel (of this checkout, or of ``repo``) and install it into a fresh venv of its own;
    return its console script.

    Dependencies are taken from this interpreter's site-packages through a plain path entry, so
    nothing is downloaded and the checkout itself is not importable in the venv.
    """
    import sysconfig
    import venv

    repo = repo or Path(__file__).resolve().parent.parent
    dist = root / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(dist), str(repo)], check=True)
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    vpy = env_dir / "bin" / "python"
    site = subprocess.check_output([str(vpy), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   text=True).strip()
    dirs = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    Path(site, "deps.pth").write_text("\n".join(dict.fromkeys(dirs)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps",
                    *map(str, dist.glob("zdoctor-*.whl"))], check=True)
    return [str(env_dir / "bin" / "zdoctor")]


def time_command(argv: list[str], runs: int, env: dict[str, str]) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                       stdin=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return times


def top_imports(env: dict[str, str], n: int = 8) -> list[tuple[int, str]]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "zdoctor", "check", "--json", "--no-log"],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            parts = [p.strip() for p in line[len("import time:"):].split("|")]
            if parts[1].isdigit():
                rows.append((int(parts[1]), parts[2]))
    return sorted(rows, reverse=True)[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", metavar="FILE", help="also write the numbers here")
    ap.add_argument("--installed", action="store_true",
                    help="time the zdoctor already on PATH instead of a fresh venv built from this checkout")
    ap.add_argument("--python", metavar="PY", help="also time `check --python PY` against a training env "
                    "with torch, next to `PY -c 'import torch'` (no budget: torch's import dominates)")
    args = ap.parse_args()
    env = dict(os.environ, NO_COLOR="1", XDG_STATE_HOME=tempfile.mkdtemp(prefix="zdoctor-bench-"))
    torch = subprocess.run(["python3", "-c", "import torch"], capture_output=True, env=env).returncode == 0
    scratch = Path(tempfile.mkdtemp(prefix="zdoctor-bench-venv-"))
    exe = zdoctor_exe() if args.installed else venv_exe(scratch)
    print(f"timing {exe[0]}")
    results = {"torch_in_target": torch, "runs": args.runs, "commands": {}}
    ok = True
    for sub, budget in BUDGETS.items():
        argv = exe + ([sub] if sub.startswith("--") else [sub, "--json"])
        time_command(argv, 1, env)  # warm the page cache
        times = time_command(argv, args.runs, env)
        med = statistics.median(times)
        results["commands"][sub] = {"median_s": round(med, 3), "max_s": round(max(times), 3),
                                    "budget_s": budget, "within_budget": med < budget}
        ok &= med < budget
        print(f"zdoctor {sub:<10} median {med:.3f}s  max {max(times):.3f}s  budget {budget:.1f}s  "
              f"{'OK' if med < budget else 'OVER'}")
    print(f"target python3 has torch: {torch}")
    if args.python:
        chk = statistics.median(time_command(exe + ["check", "--json", "--python", args.python], 3, env))
        imp = statistics.median(time_command([args.python, "-c", "import torch"], 3, env))
        results["with_torch"] = {"check_s": round(chk, 3), "import_torch_s": round(imp, 3),
                                 "ratio": round(chk / imp, 2)}
        print(f"zdoctor check --python {args.python}: {chk:.3f}s; `import torch` alone: {imp:.3f}s "
              f"(ratio {chk / imp:.2f})")
    print("slowest imports of `zdoctor check` (cumulative us):")
    for us, mod in top_imports(env):
        print(f"  {us:>8}  {mod}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
