"""Library forensics against a real torch + DeepSpeed install.

1. The static audit (ld.so emulation, version needs vs provides, cold ELF cache) of every library that
   torch, DeepSpeed's prebuilt ops and the JIT-built cpu_adam load, against `readelf -V` and `ldd -v`
   over the same files, each in one run. Target: the audit within 2x `readelf -V`.
2. The whole `zdoctor check` in that environment against `python -c "import torch"`. Target: 1.5x.

    python bench/forensics.py [--python ENV_PY] [--runs N] [--json FILE]

Without --python the environment comes from tests/dsenv.py (built on first use).
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
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

AUDIT = r"""
import json, sys, time
t0 = time.perf_counter()
from zdoctor.layers.libraries.audit import static_audit, training_targets
from zdoctor.readers.loader import LoaderConfig
spec = json.loads(sys.argv[1])
t1 = time.perf_counter()
config = LoaderConfig.detect()
audit = static_audit(spec["python"], spec["env"], training_targets(**spec["targets"]), config=config)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "audit_s": t2 - t1, "files": sorted({o["path"] for o in audit["loaded"]}),
                  "failures": len(audit["failures"]), "needs": len(audit["needs"])}))
"""


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    return time.perf_counter() - t0, proc


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", help="the torch (+ deepspeed) environment's interpreter")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.python:
        py = Path(args.python)
        so = None
    else:
        from dsenv import cpu_adam_op, ensure

        py = ensure()
        so = cpu_adam_op(py)
    probe = subprocess.run([str(py), "-c", "import os, torch\ntry:\n import deepspeed; d = os.path.dirname("
                            "deepspeed.__file__)\nexcept ImportError:\n d = None\nprint(os.path.dirname("
                            "torch.__file__)); print(d or '')"], capture_output=True, text=True, check=True)
    lines = [ln for ln in probe.stdout.splitlines() if not ln.startswith("[")]
    torch_dir, ds_dir = lines[-2], lines[-1] or None
    from startup import venv_exe

    from zdoctor.readers.jitcache import prebuilt_ops

    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    if so is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(so.parent.parent)
    spec = {"python": str(py), "env": env, "targets": {
        "torch_dir": torch_dir, "deepspeed_ops": prebuilt_ops(ds_dir) if ds_dir else [],
        "jit_ops": [str(so)] if so else []}}
    audit_runs, files = [], []
    for _ in range(args.runs):
        _, proc = timed([sys.executable, "-c", AUDIT, json.dumps(spec)])
        out = json.loads(proc.stdout)
        audit_runs.append(out["audit_s"])
        files = out["files"]
    files = [f for f in files if os.path.isfile(f)]
    readelf = [timed(["readelf", "-V", "-W", *files])[0] for _ in range(args.runs)]
    ldd = [timed(["ldd", "-v", *files])[0] for _ in range(args.runs)]

    with tempfile.TemporaryDirectory() as tmp:
        zd = venv_exe(Path(tmp))
        check_env = dict(env, XDG_STATE_HOME=tmp)
        timed([*zd, "check", "--json", "--no-log", "--python", str(py)], env=check_env)  # warm the page cache
        check = [timed([*zd, "check", "--json", "--no-log", "--python", str(py)], env=check_env)[0]
                 for _ in range(args.runs)]
    imp = [timed([str(py), "-c", "import torch"], env=env)[0] for _ in range(args.runs)]
    result = {
        "files": len(files),
        "audit_s": median(audit_runs), "readelf_V_s": median(readelf), "ldd_v_s": median(ldd),
        "audit_vs_readelf": median(audit_runs) / median(readelf),
        "audit_vs_ldd": median(audit_runs) / median(ldd),
        "check_s": median(check), "import_torch_s": median(imp),
        "check_vs_import_torch": median(check) / median(imp),
        "runs": args.runs,
    }
    print(f"static audit of {len(files)} libraries (torch, DeepSpeed ops{', cpu_adam' if so else ''}):")
    print(f"  zdoctor audit (cold ELF cache) {result['audit_s']:.3f} s")
    print(f"  readelf -V                     {result['readelf_V_s']:.3f} s   ratio {result['audit_vs_readelf']:.2f}x"
          " (target <= 2x)")
    print(f"  ldd -v                         {result['ldd_v_s']:.3f} s   ratio {result['audit_vs_ldd']:.2f}x")
    print(f"zdoctor check --python ENV       {result['check_s']:.2f} s")
    print(f"python -c 'import torch'         {result['import_torch_s']:.2f} s   ratio "
          f"{result['check_vs_import_torch']:.2f}x (target <= 1.5x)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
