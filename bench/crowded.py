"""A late probe is never the node's failure: the same checks on a quiet node and on one crowded far past its
CPUs, and what changed between them.

The crowd is real work, not idle loops: compilers building a C++ file over and over (``g++ -O2``) and
Python processes churning through memory, enough of them that the load average climbs well past the CPUs
(30 by default on this 2-core machine). zdoctor starts only once the one-minute load has reached the
target, so its budgets see the node as it is.

Cases: the healthy check (``check --python ENV``) and the broken launch whose fix is tried (``check --python
ENV --command CMD``, CMD loading DeepSpeed's JIT-built cpu_adam op through an old libstdc++ on
LD_LIBRARY_PATH, as in ``bench/speed.py``). Each row: zdoctor's wall time, the load when it started and
ended, the probes that ran out of time, and every finding whose status differs from the quiet run's. The
goal: on the crowded node nothing fails that passed when quiet, and every finding the quiet run made is
still there (a probe that ran out of time is "not examined", never a failure).

    python bench/crowded.py [--python ENV_PY] [--load 30] [--cases healthy,ldpath] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

#: One unit of the crowd's Python half: builds and sorts lists of strings, so it works through memory.
CHURN = ("import random\nwhile True:\n    xs = [str(random.random()) for _ in range(200000)]\n"
         "    xs.sort()\n    d = {x: len(x) for x in xs}\n")
#: The compiler half's source: templates enough that one build takes about a second.
CXX_SOURCE = """#include <map>
#include <string>
#include <vector>
#include <algorithm>
#include <regex>
int main() {
  std::map<std::string, std::vector<int>> m; std::regex r("a+b*");
  for (int i = 0; i < 100; ++i) m[std::to_string(i)].push_back(i);
  return std::regex_match("aab", r) ? 0 : 1;
}
"""


class Crowd:
    """``n`` busy processes: every other one a compiler loop (where g++ exists), the rest memory churners."""

    def __init__(self, n: int, work: Path) -> None:
        self.n, self.work = n, work
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Crowd:
        src = self.work / "crowd.cpp"
        src.write_text(CXX_SOURCE)
        gxx = shutil.which("g++")
        for i in range(self.n):
            if gxx and i % 2 == 0:
                out = shlex.quote(str(self.work / f"crowd-{i}.o"))
                argv = ["sh", "-c", f"while :; do {shlex.quote(gxx)} -O2 -c {shlex.quote(str(src))} -o {out}; done"]
            else:
                argv = [sys.executable, "-c", CHURN]
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                               start_new_session=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
        for p in self.procs:
            p.wait()

    @staticmethod
    def wait_quiet(cpus: int, most_s: float = 300.0) -> float:
        """Wait until the one-minute load has fallen below half the CPUs (an earlier crowd's tail), at most
        ``most_s`` seconds."""
        end = time.monotonic() + most_s
        while os.getloadavg()[0] >= cpus / 2 and time.monotonic() < end:
            time.sleep(2)
        return os.getloadavg()[0]

    def wait_for_load(self, target: float, most_s: float = 240.0) -> float:
        """Wait until the one-minute load average reaches ``target`` (at most ``most_s`` seconds)."""
        end = time.monotonic() + most_s
        while os.getloadavg()[0] < target and time.monotonic() < end:
            time.sleep(2)
        return os.getloadavg()[0]


def run_check(argv: list[str], env: dict[str, str], keep: Path | None = None) -> dict[str, object]:
    """One ``check --json``: its wall time, the load around it, its findings' statuses and its walks' ends;
    with ``keep``, its whole report is written there."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    if keep is not None:
        keep.write_bytes(proc.stdout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return {"wall_s": wall, "exit_code": proc.returncode, "error": proc.stderr.decode("utf-8", "replace")[-400:]}
    statuses: dict[str, list[str]] = {}
    titles: dict[str, list[str]] = {}
    for f in doc.get("findings") or []:
        statuses.setdefault(f["id"], []).append(f["status"])
        titles.setdefault(f["id"], []).append(str(f.get("title") or ""))
        for r in f.get("remedies") or []:  # a fix tried is part of the verdict: "fixed" must stay "fixed"
            state = (r.get("verification") or {}).get("state") if isinstance(r.get("verification"), dict) else None
            if state:
                statuses.setdefault(f"{f['id']} (remedy tried)", []).append(state)
    findings = {k: ",".join(sorted(v)) for k, v in statuses.items()}
    late = sorted(i for i, f in ((f["id"], f) for f in doc.get("findings") or [])
                  if "ran out of time" in str(f.get("title") or ""))
    walks = {w.get("id"): w.get("diagnosis") for w in doc.get("playbooks") or []}
    return {"wall_s": wall, "exit_code": proc.returncode, "load_start": load0, "load_end": os.getloadavg()[0],
            "findings": findings, "titles": titles, "late": late, "walks": walks}


def compare(quiet: dict[str, object], crowded: dict[str, object]) -> dict[str, object]:
    """What the crowded run says differently: findings gone, findings changed (quiet -> crowded), walks
    ending elsewhere, and whether any of it is a failure the quiet node did not have."""
    q, c = quiet.get("findings") or {}, crowded.get("findings") or {}
    assert isinstance(q, dict) and isinstance(c, dict)
    changed = {k: f"{q[k]} -> {c[k]}" for k in q if k in c and q[k] != c[k]}
    gone = sorted(k for k in q if k not in c)
    new = {k: c[k] for k in c if k not in q}
    new_failures = sorted(k for k, s in {**new, **{k: c[k] for k in changed}}.items()
                          if "fail" in s.split(",") or "crash" in s.split(","))
    qw, cw = quiet.get("walks") or {}, crowded.get("walks") or {}
    assert isinstance(qw, dict) and isinstance(cw, dict)
    walks = {k: f"{qw.get(k)} -> {cw.get(k)}" for k in set(qw) | set(cw) if qw.get(k) != cw.get(k)}
    return {"changed": changed, "gone": gone, "new": new, "new_failures": new_failures, "walks": walks,
            "same_verdict": not changed and not gone and not new and not walks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", help="the torch + DeepSpeed environment's interpreter")
    ap.add_argument("--load", type=float, default=30.0, help="the crowd's one-minute load to reach (default 30)")
    ap.add_argument("--cases", default="healthy,ldpath")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep", help="write each run's whole report into this folder (CASE-NODE.json)")
    args = ap.parse_args()
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    from envkit import make_old_libstdcxx
    from speed import training
    from startup import venv_exe

    py, _, base, cmd = training(args.python)
    cpus = len(os.sched_getaffinity(0))
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        zd = venv_exe(Path(tmp))
        old = make_old_libstdcxx(Path(tmp) / "old" / "lib")
        base["XDG_STATE_HOME"] = tmp
        cases: dict[str, tuple[list[str], dict[str, str]]] = {
            "healthy": ([*zd, "check", "--json", "--no-log", "--python", str(py)], base),
            "ldpath": ([*zd, "check", "--json", "--no-log", "--python", str(py), "--command", shlex.join(cmd)],
                       dict(base, LD_LIBRARY_PATH=str(old.parent))),
        }
        chosen = [c for c in args.cases.split(",") if c]
        Crowd.wait_quiet(cpus)
        for case in chosen:
            if case not in cases:
                raise SystemExit(f"unknown case {case!r}")
            results[case] = {"quiet": run_check(*cases[case], keep / f"{case}-quiet.json" if keep else None)}
        # the crowd takes about 15 workers to hold a load of 30 on two cores: each busy process adds one
        with Crowd(int(args.load), Path(tmp)) as crowd:
            reached = crowd.wait_for_load(args.load * 0.8)
            print(f"crowd of {crowd.n} processes: load {reached:.1f} on {cpus} CPUs", file=sys.stderr)
            for case in chosen:
                results[case]["crowded"] = run_check(*cases[case], keep / f"{case}-crowded.json" if keep else None)
        for case in chosen:
            results[case]["difference"] = compare(results[case]["quiet"], results[case]["crowded"])  # type: ignore[arg-type]
    print(f"{'case':<8} {'node':<8} {'load start-end':>15} {'wall':>8} {'exit':>5}  ran out of time / what differs")
    for case, res in results.items():
        for node in ("quiet", "crowded"):
            r = res[node]
            assert isinstance(r, dict)
            late = ", ".join(r.get("late") or []) or "none"
            print(f"{case:<8} {node:<8} {r.get('load_start', 0):>6.1f}-{r.get('load_end', 0):<6.1f}  "
                  f"{r['wall_s']:>7.1f}s {r['exit_code']:>5}  late: {late}")
        d = res["difference"]
        assert isinstance(d, dict)
        print(f"{case:<8} same verdict: {'yes' if d['same_verdict'] else 'no'}; new failures: "
              f"{', '.join(d['new_failures']) or 'none'}; changed: {d['changed'] or 'none'}; gone: "
              f"{', '.join(d['gone']) or 'none'}; new: {d['new'] or 'none'}; walks: {d['walks'] or 'same'}")
        crowded = res["crowded"]
        assert isinstance(crowded, dict)
        for fid in [*d["changed"], *d["new"]]:
            for title in (crowded.get("titles") or {}).get(fid) or []:
                print(f"{'':<8} crowded {fid}: {title}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
