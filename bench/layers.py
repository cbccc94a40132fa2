"""What the probes of the newer layers cost `zdoctor check`: this checkout against an older one.

`zdoctor check --python ENV` from this checkout and from BASE (a git revision without the newer layers'
probes), each built into a fresh venv of its own, alternated in pairs. The difference of the medians is
what the added probes cost; the goal is at most 0.2 s, because they run beside the training
interpreter's probe (torch's import), which stays the slowest. It also lists, from one recorded session,
each probe of the layers named by --layers with its own duration and when it ended against `pyenv`.

    python bench/layers.py --base REV [--python ENV_PY] [--pairs N] [--json FILE]

Without --python the environment comes from tests/dsenv.py (torch CPU + DeepSpeed, built on first use).
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE))

GOAL_S = 0.2


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def venv_of(rev: str | None, root: Path) -> list[str]:
    """The console script of a fresh venv holding zdoctor as of ``rev`` (None: this checkout)."""
    from startup import venv_exe

    if rev is None:
        return venv_exe(root)
    tree = root / "src"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
    try:
        return venv_exe(root, repo=tree)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


def probe_timeline(zd: list[str], py: str, env: dict[str, str], layers: list[str]) -> list[dict[str, object]]:
    """Each probe read by a check of ``layers``: its duration and its end against the pyenv probe's."""
    subprocess.run([*zd, "check", "--python", py], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    doc = json.loads(subprocess.run([*zd, "export", "--last", "--format", "json"], capture_output=True, text=True,
                                    env=env).stdout)
    results = {e["result"]["probe"]: e["result"] for e in doc["events"] if "result" in e}
    from zdoctor.registry import CHECKS, load_vocabulary

    load_vocabulary()
    wanted = sorted({p for spec in CHECKS.values() if spec.layer in layers for p in spec.probes})
    base = results.get("pyenv") or {}
    base_end = (base.get("started") or 0) + (base.get("duration_s") or 0)
    rows = []
    for name in wanted:
        r = results.get(name)
        if r is None:
            continue
        end = (r.get("started") or 0) + (r.get("duration_s") or 0)
        rows.append({"probe": name, "duration_s": r.get("duration_s"), "ends_before_pyenv_s": base_end - end})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare with")
    ap.add_argument("--python", help="the torch + DeepSpeed environment's interpreter")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--layers", default="kernel-log,driver-parts,container,cuda-lookup,gpu-capability,"
                                         "jit-build-log,nccl-network,launch,ranks,rank-cores")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from dsenv import ensure

    py = str(Path(args.python) if args.python else ensure())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        new = venv_of(None, root / "new")
        old = venv_of(args.base, root / "old")
        env = {**os.environ, "XDG_STATE_HOME": str(root / "state")}
        for zd in (new, old):
            timed([*zd, "check", "--json", "--no-log", "--python", py], env)  # warm the page cache
        t_new, t_old = [], []
        for i in range(args.pairs):
            order = [(new, t_new), (old, t_old)] if i % 2 == 0 else [(old, t_old), (new, t_new)]
            for zd, out in order:
                out.append(timed([*zd, "check", "--json", "--no-log", "--python", py], env))
        timeline = probe_timeline(new, py, env, args.layers.split(","))
    m_new, m_old = statistics.median(t_new), statistics.median(t_old)
    result = {"new_s": m_new, "base_s": m_old, "added_s": m_new - m_old, "goal_s": GOAL_S, "base": args.base,
              "new_runs": t_new, "base_runs": t_old, "probes": timeline}
    print(f"zdoctor check --python ENV: this checkout {m_new:.2f} s, {args.base[:12]} {m_old:.2f} s, "
          f"added {m_new - m_old:+.2f} s (goal <= {GOAL_S:.1f} s)")
    for row in timeline:
        print(f"  {row['probe']:<16} {row['duration_s'] or 0:6.2f} s, ends {row['ends_before_pyenv_s']:+.2f} s "
              "before pyenv")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
