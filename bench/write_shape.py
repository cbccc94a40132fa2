"""Write zdoctor/core/shape.json, the types zdoctor's probes write at each key path of their facts, from the typed
records the probes declare (:mod:`zdoctor.core.factstypes`).

Usage: python bench/write_shape.py  (tests/test_facts_types.py fails while the committed file differs).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zdoctor.core.registry import declared_shape  # noqa: E402
from zdoctor.core.shape import SHAPE_FILE, shape_text  # noqa: E402


def main() -> int:
    shape = declared_shape()
    SHAPE_FILE.write_text(shape_text(shape), encoding="utf-8")
    print(f"{SHAPE_FILE}: {len(shape)} key paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
