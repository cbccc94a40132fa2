"""The hostile-input kit measures zdoctor's own peak memory, not the test process's it was started from."""

from __future__ import annotations

from hostilekit import run_measured


def test_a_measured_run_does_not_count_the_memory_of_the_process_that_started_it() -> None:
    held = bytearray(600 << 20)  # the test process grows past what any bound here allows
    held[::4096] = b"x" * len(held[::4096])  # every page touched: resident
    m = run_measured(["--version"], wall_limit=60)
    assert m.returncode == 0 and not m.killed and m.stdout.startswith("zdoctor ")
    assert 5 < m.peak_rss_mb < 200, f"{m.peak_rss_mb:.0f} MB"
    del held
