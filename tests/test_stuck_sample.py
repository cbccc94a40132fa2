"""Where a run at its time limit is: a process that polls is waiting, however its single look falls; one
working on a CPU is running. Real processes, sampled as the live run and the interpreter probe sample them."""

from __future__ import annotations

import subprocess
import sys
import time

from zdoctor.readers.stuck import describe, sample_tree, shows_wait

#: Works 20 ms on a CPU, then sleeps 80 ms, for ever: in a fifth of the instants it is running.
POLLER = ("import time\nwhile True:\n    end = time.monotonic() + 0.02\n    while time.monotonic() < end: pass\n"
          "    time.sleep(0.08)")


def sampled(code: str, times: int) -> list[list[str]]:
    """The tree of a shell running ``python -c code`` (so the interpreter is a leaf), sampled ``times`` times."""
    parent = subprocess.Popen(["sh", "-c", 'python="$1"; shift; "$python" -c "$1" & wait', "sh", sys.executable, code],
                              start_new_session=True)
    try:
        time.sleep(0.5)
        out = []
        for _ in range(times):
            out.append([describe(s) for s in sample_tree(parent.pid)])
            time.sleep(0.031)  # each sample at another point of the poller's cycle
        return out
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(parent.pid)], check=False)
        parent.wait()


def test_a_process_that_polls_is_waiting_and_one_that_works_is_running() -> None:
    for sample in sampled(POLLER, 12):
        assert len(sample) == 1 and shows_wait(sample), sample  # "sleeping in ...", never "running"
        assert "sleeping" in sample[0], sample
    for sample in sampled("while True: pass", 4):
        assert len(sample) == 1 and not shows_wait(sample) and sample[0].endswith(": running"), sample
