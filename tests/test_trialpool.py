"""Re-runs with each fix start as soon as the static audit predicts them, and one change runs once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from zdoctor.layers.libraries.trialpool import TrialPool, identity
from zdoctor.trials.remedies import Plan, verify


def _plan(key: str, **env: str | None) -> Plan:
    return Plan(key=key, title=f"plan {key}", env_changes=dict(env))


def test_a_predicted_re_run_is_taken_by_the_traced_plan_with_the_same_change_and_not_run_again(tmp_path):
    count = tmp_path / "runs"
    script = f"echo x >> {count}; test -z \"$BROKEN\""
    argv = ["/bin/sh", "-c", script]
    calls: list[str] = []

    def counted(plan, run_argv, env):
        calls.append(plan.key)
        return verify(plan, run_argv, env, timeout=30)

    pool = TrialPool(counted, {**os.environ, "BROKEN": "1"})
    pool.start(_plan("unset-broken", BROKEN=None), argv)  # predicted by the static audit
    pool.start(_plan("unset-broken", BROKEN=None), argv)  # the same change again: not a second run
    final = [_plan("unset-broken", BROKEN=None), _plan("keep", OTHER="1")]  # the trace's plans
    evidence = pool.results(final, argv)
    assert calls.count("unset-broken") == 1 and calls.count("keep") == 1
    assert len(count.read_text().splitlines()) == 2  # two real re-runs, not three
    assert final[0].tried and final[0].verified and "succeeded" in final[0].verification
    assert final[1].tried and not final[1].verified
    assert [e.exit_code for e in evidence] == [0, 1]


def test_a_predicted_re_run_the_trace_made_moot_is_dropped_before_it_starts():
    release = threading.Event()
    ran: list[str] = []

    def slow(plan, _argv, _env):
        ran.append(plan.key)
        release.wait(10)
        return verify(plan, ["/bin/true"], {}, timeout=10)

    pool = TrialPool(slow, {})
    for i in range(5):  # more than run at once: the last ones wait for a slot
        pool.start(_plan(f"p{i}", X=str(i)), ["/bin/true"])
    time.sleep(0.3)
    wanted = [_plan("p0", X="0")]
    assert pool.unused(wanted, ["/bin/true"]) == 4
    pool.drop_all_but({identity(wanted[0], ["/bin/true"])})
    release.set()
    pool.results(wanted, ["/bin/true"])
    time.sleep(0.3)
    assert "p0" in ran and "p3" not in ran and "p4" not in ran  # cancelled while waiting for a slot


def test_an_unfinished_predicted_re_run_never_holds_zdoctors_exit(tmp_path):
    code = (
        f"import sys; sys.path.insert(0, {os.getcwd()!r})\n"
        "from zdoctor.layers.libraries.trialpool import TrialPool\n"
        "from zdoctor.trials.remedies import Plan, verify\n"
        "pool = TrialPool(lambda p, a, e: verify(p, a, e, timeout=60), {})\n"
        "pool.start(Plan(key='k', title='t'), ['/bin/sleep', '30'])\n"
        "print('leaving')\n"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "leaving" in out.stdout and time.monotonic() - t0 < 20
