"""Run mypy over zdoctor/ and fail on any error that is not in the committed baseline.

The baseline (``.ci/mypy-baseline.txt``) holds the errors there were when the check joined CI, one per
line as ``path: message [code]`` (line numbers left out, so moving code does not count as a new error).
It may only shrink: ``python3 .ci/mypy_gate.py --write`` records the errors of now, and refuses to add any
(an error whose code moved to another file keeps its message, and is not counted as new).
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".ci" / "mypy-baseline.txt"
_LINE = re.compile(r"^(?P<path>[^:]+):\d+(?::\d+)?: error: (?P<msg>.*)$")


def current() -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty",
                           "--show-error-codes"], cwd=ROOT, capture_output=True, text=True)
    out = []
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            out.append(f"{m.group('path')}: {m.group('msg')}")
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not out):
        sys.exit(f"mypy did not run: {proc.stderr.strip() or proc.stdout.strip()}")
    return sorted(out)


def main(argv: list[str]) -> int:
    now = collections.Counter(current())
    base = collections.Counter(BASELINE.read_text(encoding="utf-8").splitlines()) if BASELINE.exists() else None
    if "--write" in argv:
        # Code that moved keeps its errors under a new path: growth is judged by the messages alone.
        def messages(c: collections.Counter) -> collections.Counter:
            return collections.Counter(e.split(": ", 1)[1] for e in c.elements())

        if base is not None and messages(now) - messages(base):
            print("mypy: refusing to grow the baseline; new errors:", *sorted(messages(now) - messages(base)),
                  sep="\n  ")
            return 1
        BASELINE.write_text("".join(f"{e}\n" for e in sorted(now.elements())), encoding="utf-8")
        print(f"mypy: baseline written ({sum(now.values())} errors)")
        return 0
    if base is None:
        print(f"mypy: no baseline at {BASELINE}")
        return 1
    new = now - base
    if new:
        print(f"mypy: {sum(new.values())} error(s) not in the baseline:", *sorted(new.elements()), sep="\n  ")
        return 1
    fixed = sum((base - now).values())
    print(f"mypy: {sum(now.values())} known errors, none new" + (f"; {fixed} fixed: shrink the baseline with "
                                                              "`python3 .ci/mypy_gate.py --write`" if fixed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
