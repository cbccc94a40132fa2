"""A 16-node fleet on loopback against 16 sequential `zdoctor snapshot` runs.

Starts a real OpenSSH server listening on 127.0.0.2 ... 127.0.0.17 (one port, generated keys), then
times `zdoctor fleet` over all of them through pdsh and through ssh, and the same 16 snapshots taken one
after another on this machine. Needs root, Debian's openssh-server and pdsh.

    python bench/fleet.py [--nodes 16] [--runs 3] [--python TRAIN_ENV_PY] [--json FILE]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from sshkit import node_bin, start_sshd  # noqa: E402


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--python", help="the training interpreter each snapshot looks at (default: python3)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    zd = [sys.executable, "-m", "zdoctor"]
    py = ["--python", args.python] if args.python else []
    with tempfile.TemporaryDirectory(prefix="zdoctor-fleet-bench-") as tmp:
        root = Path(tmp)
        good = node_bin(root / "bin")
        addrs = [f"127.0.0.{i}" for i in range(2, 2 + args.nodes)]
        sshd = start_sshd(root / "sshd", {a: {"PATH": f"{good}:/usr/local/bin:/usr/bin:/bin"} for a in addrs})
        try:
            hf = root / "hostfile"
            hf.write_text("".join(f"{a} slots=8\n" for a in addrs))
            env = dict(os.environ, XDG_STATE_HOME=str(root / "state"))
            results: dict[str, list[float]] = {"sequential": [], "fleet-pdsh": [], "fleet-ssh": []}
            for _ in range(args.runs):
                t0 = time.perf_counter()
                for _a in addrs:
                    _, p = timed([*zd, "snapshot", "-o", os.devnull, *py], env)
                    assert p.returncode == 0, p.stderr
                results["sequential"].append(time.perf_counter() - t0)
                for launcher in ("pdsh", "ssh"):
                    took, p = timed([*zd, "fleet", "--hostfile", str(hf), "--launcher", launcher, "--ssh-config",
                                     str(sshd.ssh_config), "--zdoctor", "zdoctor-node", "--parallel",
                                     str(args.nodes), "--no-log", "--json", *py], env)
                    doc = json.loads(p.stdout)
                    assert doc["summary"]["reached"] == args.nodes, p.stderr
                    results[f"fleet-{launcher}"].append(took)
        finally:
            sshd.stop()
    cores = os.cpu_count()
    report = {"nodes": args.nodes, "cores": cores, "python": args.python or "python3",
              "median_s": {k: round(statistics.median(v), 2) for k, v in results.items()},
              "runs_s": {k: [round(x, 2) for x in v] for k, v in results.items()}}
    seq = report["median_s"]["sequential"]
    report["speedup"] = {k: round(seq / v, 2) for k, v in report["median_s"].items() if k != "sequential"}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
