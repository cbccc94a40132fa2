"""The whole diagnosis against the failing command's own time, in pairs alternated in one run.

1. A broken launch, fixes tried: `zdoctor check --python ENV --command CMD` against CMD itself, where CMD
   loads DeepSpeed's JIT-built cpu_adam op and fails in ld.so because of an old libstdc++ reached through
   LD_LIBRARY_PATH, or LD_PRELOAD (the lab cases the tests build). Goal: at most 1.5x.
2. A healthy node: `zdoctor check --python ENV` against `python -c "import deepspeed"`. Goal: at most 1.05x.

Each pair runs the two commands one after the other, alternating which goes first, so a machine that
gets busier mid-run weighs on both sides alike. zdoctor runs from a fresh venv built from this checkout.

    python bench/speed.py [--python ENV_PY] [--pairs N] [--cases ldpath,preload,healthy] [--json FILE]

Without --python the environment comes from tests/dsenv.py (torch CPU + DeepSpeed, built on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

GOALS = {"ldpath": 1.5, "preload": 1.5, "healthy": 1.05}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0, proc.returncode


def pairs(a: list[str], b: list[str], env_a: dict[str, str], env_b: dict[str, str], n: int) -> dict[str, object]:
    """``n`` alternated runs of ``a`` (zdoctor) and ``b`` (the baseline), after one warm-up of each."""
    timed(a, env_a)
    timed(b, env_b)
    ta, tb, codes = [], [], set()
    for i in range(n):
        order = [(a, env_a, ta), (b, env_b, tb)] if i % 2 == 0 else [(b, env_b, tb), (a, env_a, ta)]
        for argv, env, out in order:
            dt, rc = timed(argv, env)
            out.append(dt)
            if out is ta:
                codes.add(rc)
    za, zb = statistics.median(ta), statistics.median(tb)
    return {"zdoctor_s": za, "baseline_s": zb, "ratio": za / zb, "zdoctor_runs": ta, "baseline_runs": tb,
            "zdoctor_exit_codes": sorted(codes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", help="the torch + DeepSpeed environment's interpreter")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cases", default="ldpath,preload,healthy")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from dsenv import LOAD_CPU_ADAM, cpu_adam_op, ensure
    from envkit import make_old_libstdcxx
    from startup import venv_exe

    py = Path(args.python) if args.python else ensure()
    so = cpu_adam_op(py)
    base = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    base["TORCH_EXTENSIONS_DIR"] = str(so.parent.parent)
    base["PATH"] = f"{py.parent}{os.pathsep}{base.get('PATH', '')}"
    cmd = [str(py), "-c", LOAD_CPU_ADAM]
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        zd = venv_exe(Path(tmp))
        old = make_old_libstdcxx(Path(tmp) / "old" / "lib")
        base["XDG_STATE_HOME"] = tmp
        for case in [c for c in args.cases.split(",") if c]:
            if case == "healthy":
                results[case] = pairs([*zd, "check", "--json", "--no-log", "--python", str(py)],
                                      [str(py), "-c", "import deepspeed"], base, base, args.pairs)
                continue
            broken = dict(base)
            if case == "ldpath":
                broken["LD_LIBRARY_PATH"] = str(old.parent)
            elif case == "preload":
                broken["LD_PRELOAD"] = str(old)
            else:
                raise SystemExit(f"unknown case {case!r}")
            results[case] = pairs([*zd, "check", "--json", "--no-log", "--python", str(py), "--command",
                                   shlex.join(cmd)], cmd, broken, broken, args.pairs)
    print(f"{'case':<9} {'zdoctor':>9} {'baseline':>9} {'ratio':>7} {'goal':>6}")
    for case, r in results.items():
        print(f"{case:<9} {r['zdoctor_s']:>8.2f}s {r['baseline_s']:>8.2f}s {r['ratio']:>6.2f}x "
              f"{GOALS[case]:>5.2f}x{'' if r['ratio'] <= GOALS[case] else '  (over)'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
