"""Regenerate zdoctor/shape.json, the types zdoctor's probes write at each key path of their facts.

Usage: python bench/learn_shape.py SNAPSHOT.json...  (a snapshot of this machine, ``zdoctor snapshot -o``,
plus any others); the recorded test fixtures (a healthy snapshot, the H200 GPU node) are always added.
Key paths under keys that are data (a path, a number, a library name) are left out: they differ per node.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_gpu_facts import h200_all  # noqa: E402

from zdoctor.core.shape import SHAPE_FILE, learn  # noqa: E402

_DATA_KEY = re.compile(r"[/ ]|^\d+$|^\d+\.\d+|\.so")


def _is_data_key(path: str) -> bool:
    return any(_DATA_KEY.search(seg) for seg in path.replace("[]", "").split("."))


def main(paths: list[str]) -> int:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    docs.append(json.loads((ROOT / "tests" / "fixtures" / "snapshots" / "healthy.json").read_text()))
    docs.append({"probes": {n: {"facts": f} for n, f in h200_all().items()}})
    shape = {p: t for p, t in learn(docs).items() if not _is_data_key(p) and t != ["null"]}
    SHAPE_FILE.write_text("{\n" + ",\n".join(f"{json.dumps(p)}: {json.dumps(t)}" for p, t in sorted(shape.items()))
                          + "\n}\n")
    print(f"{SHAPE_FILE}: {len(shape)} key paths")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
