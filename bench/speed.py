"""The whole diagnosis against the failing command's own time, in rounds rotated in one run.

1. A broken launch, fixes tried: `zdoctor check --python ENV --command CMD` against CMD itself, where CMD
   loads DeepSpeed's JIT-built cpu_adam op and fails in ld.so because of an old libstdc++ reached through
   LD_LIBRARY_PATH, or LD_PRELOAD (the lab cases the tests build). Goal: at most 1.05x the floor below (the
   traced run and each fix zdoctor reports as tried).
2. A healthy node: `zdoctor check --python ENV` against `python -c "import deepspeed"`. Goal: at most 1.05x.

Each round runs every command of a case one after the other, the order rotated from round to round, so a
machine that gets busier mid-run weighs on all of them alike. zdoctor runs from a fresh venv built from this checkout.

    python bench/speed.py [--python ENV_PY] [--pairs N] [--cases ldpath,preload,healthy] [--json FILE]

Without --python the environment comes from tests/dsenv.py (torch CPU + DeepSpeed, built on first use).

Beside zdoctor and its baseline it times, in the same rounds, the work no diagnosis can leave out, and reports the floor
that work sets on this machine (its wall time, or its CPU time over the cores, whichever is larger):

- broken cases: the command traced as zdoctor traces it (LD_DEBUG, and strace filtered in the kernel where
  it can), and the command once fixed, run once per fix zdoctor reports as tried;
- the healthy case: the live confirmation alone (zdoctor's default probe under LD_DEBUG: import torch and
  DeepSpeed, then load every built op); and ``import deepspeed`` beside one busy neighbour on the other core,
  what any work of zdoctor's own beside the confirmation costs it on these cores.

What zdoctor takes beyond the floor is its own: its start, the other probes on the same cores, the checks.
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
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zdoctor.layers.libraries.live import LD_DEBUG_CATEGORIES, default_probe_argv, strace_from_start  # noqa: E402

#: ``import deepspeed`` while one other process works through memory on another core (Python building and
#: sorting lists, as zdoctor's own probes do): what the same import costs when it is not alone on the
#: machine. The neighbour is ended as soon as the import returns; only the import's wall time is read.
NEIGHBOUR = ('"$1" -c "import itertools, random; [sorted(str(random.random()) for _ in range(100000)) '
             'for _ in itertools.count()]" & n=$!; "$2" -c "import deepspeed"; s=$?; kill $n; exit $s')

#: Each case's goal: zdoctor's wall time at most this many times that of its floor, or of its baseline.
GOALS = {"ldpath": ("floor", 1.05), "preload": ("floor", 1.05), "healthy": ("baseline", 1.05)}


@dataclass
class Runs:
    """One command's timed runs in a case."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    codes: set[int] = field(default_factory=set)
    stdouts: list[str] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # each run's start, seconds since the epoch

    @property
    def stdout(self) -> str:
        """The last run's standard output."""
        return self.stdouts[-1] if self.stdouts else ""

    @property
    def wall_s(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_s(self) -> float:
        return statistics.median(self.cpu)

    def add(self, argv: list[str], env: dict[str, str]) -> None:
        """Run once: wall seconds, CPU seconds of it and its children, exit code, standard output."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.starts.append(time.time())
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        self.codes.add(proc.returncode)
        self.stdouts.append(proc.stdout.decode("utf-8", "replace"))


def rounds(cmds: dict[str, tuple[list[str], dict[str, str]]], n: int) -> dict[str, Runs]:
    """``n`` rounds of every command, the order rotated each round, after one warm-up of each."""
    names = list(cmds)
    for name in names:
        Runs().add(*cmds[name])
    out = {k: Runs() for k in names}
    for i in range(n):
        for name in names[i % len(names):] + names[:i % len(names)]:
            out[name].add(*cmds[name])
    return out


def fixes_tried(check_json: str) -> int:
    """How many remedies zdoctor's JSON reports as tried (fixed or not): each is one more run."""
    try:
        doc = json.loads(check_json)
    except ValueError:
        return 0
    return sum(1 for f in doc.get("findings") or [] for r in f.get("remedies") or []
               if isinstance(r.get("verification"), dict)
               and r["verification"].get("state") in ("fixed", "not_fixed"))


def live_timeline(runs: Runs) -> dict[str, float] | None:
    """Where zdoctor's wall time went around its live confirmation, medians over the runs: from its start
    to the traced command's start, the traced command itself, and from its end to zdoctor's exit (the
    parsing of the loader's log, the checks and the report). None when no run recorded the trace."""
    parts: dict[str, list[float]] = {"before_s": [], "live_s": [], "after_s": []}
    for start, wall, out in zip(runs.starts, runs.wall, runs.stdouts):
        try:
            doc = json.loads(out)
        except ValueError:
            continue
        ev = next((e for f in doc.get("findings") or [] for e in f.get("evidence") or []
                   if e.get("kind") == "command" and str(e.get("label") or "").startswith("live trace:")
                   and e.get("started") and e.get("duration_s") is not None), None)
        if ev is None:
            continue
        parts["before_s"].append(float(ev["started"]) - start)
        parts["live_s"].append(float(ev["duration_s"]))
        parts["after_s"].append(wall - parts["before_s"][-1] - parts["live_s"][-1])
    return {k: statistics.median(v) for k, v in parts.items()} if parts["live_s"] else None


def traced_argv(cmd: list[str], log_dir: str) -> tuple[list[str], dict[str, str]]:
    """``cmd`` as zdoctor's traced run starts it: under strace (filtered in the kernel where it can) with
    LD_DEBUG into ``log_dir``."""
    strace = shutil.which("strace")
    prefix: list[str] = []
    if strace:
        prefix = strace_from_start(strace, os.path.join(log_dir, "strace"))[0] or []
    return [*prefix, *cmd], {"LD_DEBUG": LD_DEBUG_CATEGORIES, "LD_DEBUG_OUTPUT": os.path.join(log_dir, "ld")}


def floor_s(parts: list[tuple[float, float]], cores: int) -> float:
    """The least wall time the runs ``parts`` (wall, CPU) need together on ``cores`` cores."""
    return max(max(w for w, _ in parts), sum(c for _, c in parts) / cores)


def summary(r: dict[str, Runs], *, floor: float, floor_of: str, **extra: object) -> dict[str, object]:
    """One case's figures: zdoctor against its baseline, and the floor against the same baseline."""
    za, zb = r["zdoctor"].wall_s, r["baseline"].wall_s
    return {"zdoctor_s": za, "baseline_s": zb, "ratio": za / zb, "floor_s": floor, "floor_ratio": floor / zb,
            "floor_of": floor_of, "zdoctor_runs": r["zdoctor"].wall, "baseline_runs": r["baseline"].wall,
            "zdoctor_exit_codes": sorted(r["zdoctor"].codes),
            "wall_s": {k: v.wall_s for k, v in r.items()}, "cpu_s": {k: v.cpu_s for k, v in r.items()}, **extra}


def training(python: str | None) -> tuple[Path, Path, dict[str, str], list[str]]:
    """The torch + DeepSpeed environment the cases run in: its interpreter (``python``, else the tests' own
    environment, built on first use), its JIT-built cpu_adam op, the environment without any ``LD_``
    variable, and the command that loads the op."""
    from dsenv import LOAD_CPU_ADAM, cpu_adam_op, ensure

    py = Path(python) if python else ensure()
    so = cpu_adam_op(py)
    base = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    base["TORCH_EXTENSIONS_DIR"] = str(so.parent.parent)
    base["PATH"] = f"{py.parent}{os.pathsep}{base.get('PATH', '')}"
    return py, so, base, [str(py), "-c", LOAD_CPU_ADAM]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", help="the torch + DeepSpeed environment's interpreter")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cases", default="ldpath,preload,healthy")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from envkit import make_old_libstdcxx
    from startup import venv_exe

    py, so, base, cmd = training(args.python)
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        zd = venv_exe(Path(tmp))
        old = make_old_libstdcxx(Path(tmp) / "old" / "lib")
        base["XDG_STATE_HOME"] = tmp
        cores = len(os.sched_getaffinity(0))
        for case in [c for c in args.cases.split(",") if c]:
            logs = Path(tmp) / f"logs-{case}"
            logs.mkdir()
            if case == "healthy":
                live = dict(base, LD_DEBUG=LD_DEBUG_CATEGORIES, LD_DEBUG_OUTPUT=str(logs / "ld"))
                beside = ["/bin/sh", "-c", NEIGHBOUR, "neighbour", sys.executable, str(py)]
                r = rounds({"zdoctor": ([*zd, "check", "--json", "--no-log", "--python", str(py)], base),
                            "baseline": ([str(py), "-c", "import deepspeed"], base),
                            "live probe": (default_probe_argv(str(py), [], [str(so)]), live),
                            "baseline beside a neighbour": (beside, base)}, args.pairs)
                results[case] = summary(r, floor=r["live probe"].wall_s, floor_of="the live confirmation alone",
                                        timeline=live_timeline(r["zdoctor"]),
                                        beside_ratio=r["baseline beside a neighbour"].wall_s / r["baseline"].wall_s)
                continue
            broken = dict(base)
            if case == "ldpath":
                broken["LD_LIBRARY_PATH"] = str(old.parent)
            elif case == "preload":
                broken["LD_PRELOAD"] = str(old)
            else:
                raise SystemExit(f"unknown case {case!r}")
            t_argv, t_env = traced_argv(cmd, str(logs))
            r = rounds({"zdoctor": ([*zd, "check", "--json", "--no-log", "--python", str(py), "--command",
                                     shlex.join(cmd)], broken),
                        "baseline": (cmd, broken),
                        "traced": (t_argv, {**broken, **t_env}),
                        "fixed": (cmd, base)}, args.pairs)
            n = fixes_tried(r["zdoctor"].stdout)
            tr, fx = r["traced"], r["fixed"]
            parts = [(tr.wall_s, tr.cpu_s)] + [(fx.wall_s, fx.cpu_s)] * n
            results[case] = summary(r, floor=floor_s(parts, cores), floor_of=f"the traced run and {n} fixed runs "
                                    f"on {cores} cores", fixes_tried=n)
    print(f"{'case':<9} {'zdoctor':>9} {'baseline':>9} {'ratio':>7} {'floor':>8} {'floor ratio':>12} "
          f"{'zdoctor/floor':>14} {'goal':>14}")
    for case, res in results.items():
        ratio, fl = float(res["ratio"]), float(res["floor_s"])  # type: ignore[arg-type]
        of, goal = GOALS[case]
        over_floor = float(res["zdoctor_s"]) / fl  # type: ignore[arg-type]
        res["zdoctor_over_floor"] = over_floor
        measured = over_floor if of == "floor" else ratio
        print(f"{case:<9} {res['zdoctor_s']:>8.2f}s {res['baseline_s']:>8.2f}s {ratio:>6.2f}x "
              f"{fl:>7.2f}s {res['floor_ratio']:>11.2f}x {over_floor:>13.2f}x {goal:>5.2f}x the {of:<8}"
              f"  {res['floor_of']}{'' if measured <= goal else '  (over the goal)'}")
    print("CPU seconds (medians): " + "; ".join(
        f"{case}: " + ", ".join(f"{k} {v:.2f}" for k, v in res["cpu_s"].items())  # type: ignore[attr-defined]
        for case, res in results.items()))
    for case, res in results.items():
        tl = res.get("timeline")
        if isinstance(tl, dict):
            alone = res["wall_s"]["live probe"]  # type: ignore[index]
            print(f"{case}: zdoctor's live confirmation started {tl['before_s']:.2f} s after zdoctor, ran "
                  f"{tl['live_s']:.2f} s (alone: {alone:.2f} s), and zdoctor exited {tl['after_s']:.2f} s "
                  "after it (medians)")
        if "beside_ratio" in res:
            print(f"{case}: `import deepspeed` beside one busy neighbour on another core takes "
                  f"{res['beside_ratio']:.2f}x its time alone (the same import, not alone on the machine)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
