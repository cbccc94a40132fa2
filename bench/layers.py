"""What the probes of the newer layers cost `zdoctor check`: this checkout against an older one.

`zdoctor check --python ENV` from this checkout and from BASE (a git revision without the newer layers'
probes), each built into a fresh venv of its own, alternated in pairs. The difference of the medians is
what the added probes cost; the goal is at most 0.2 s, because they run beside the training
interpreter's probe (torch's import), which stays the slowest. It also lists, from one recorded session,
each probe of the layers named by --layers with its own duration and when it ended against `pyenv`.

    python bench/layers.py --base REV [--python ENV_PY] [--pairs N] [--json FILE]
    python bench/layers.py --isolated [--python ENV_PY] [--pairs N] [--json FILE]

With --isolated the other side is this checkout itself with the probes of --layers taken out of the
registry (their checks then say skip): what those probes and their checks cost, apart from anything
else that changed since an older revision.

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
    from zdoctor.core.registry import CHECKS, load_vocabulary

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


def layer_probes(layers: list[str]) -> list[str]:
    """The probes read by the checks of ``layers`` and by no check of another layer."""
    from zdoctor.core.registry import CHECKS, load_vocabulary

    load_vocabulary()
    inside = {p for spec in CHECKS.values() if spec.layer in layers for p in spec.probes}
    outside = {p for spec in CHECKS.values() if spec.layer not in layers for p in spec.probes}
    return sorted(inside - outside)


def without_probes(zd: list[str], probes: list[str]) -> list[str]:
    """A command line that runs the console script ``zd``'s zdoctor with ``probes`` unregistered."""
    python = str(Path(zd[0]).with_name("python"))
    code = ("import sys\nimport zdoctor.core.registry as r\nr.load_vocabulary()\n"
            f"for n in {probes!r}:\n    r.PROBES.pop(n, None)\n"
            "from zdoctor.front.cli import main\nsys.argv[0] = 'zdoctor'\nsys.exit(main())\n")
    return [python, "-c", code]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    side = ap.add_mutually_exclusive_group(required=True)
    side.add_argument("--base", help="the git revision to compare with")
    side.add_argument("--isolated", action="store_true",
                      help="compare with this checkout without the probes of --layers")
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
        removed = layer_probes(args.layers.split(",")) if args.isolated else []
        old = without_probes(new, removed) if args.isolated else venv_of(args.base, root / "old")
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
    paired = statistics.median([a - b for a, b in zip(t_new, t_old)])
    other = "without those probes" if args.isolated else args.base[:12]
    result = {"new_s": m_new, "base_s": m_old, "added_s": m_new - m_old, "paired_added_s": paired,
              "goal_s": GOAL_S, "base": "isolated" if args.isolated else args.base, "removed": removed,
              "new_runs": t_new, "base_runs": t_old, "probes": timeline}
    print(f"zdoctor check --python ENV: this checkout {m_new:.2f} s, {other} {m_old:.2f} s, "
          f"added {m_new - m_old:+.2f} s (median of the pairs' differences {paired:+.2f} s; goal <= {GOAL_S:.1f} s)")
    if removed:
        print(f"  taken out: {', '.join(removed)}")
    for row in timeline:
        lead = row["ends_before_pyenv_s"]
        when = f"{lead:.2f} s before" if lead >= 0 else f"{-lead:.2f} s after"
        print(f"  {row['probe']:<16} {row['duration_s'] or 0:6.2f} s, ends {when} pyenv")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
