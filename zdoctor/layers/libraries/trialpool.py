"""The re-runs of a failing command with each fix, started as soon as a fix is predicted.

The static audit predicts the fixes (the LD_LIBRARY_PATH entry without the old copy, the preload of a
copy with every version) seconds before the traced run of the command ends. A :class:`TrialPool` starts
those re-runs at once, beside the traced run; when the trace's own plans are known, a plan whose change is
the same (same kind, same environment changes, same trial, same command) takes the result of the re-run
already under way instead of running again, the rest are started then, and a predicted re-run no plan
wants any more is dropped (cancelled when it has not started). A re-run is never made twice for one change.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future

from zdoctor.core.model import Evidence
from zdoctor.trials.remedies import Plan

#: Re-runs at the same time: each is a whole run of the training's imports.
MAX_PARALLEL = 3



def identity(plan: Plan, argv: Sequence[str]) -> str:
    """What decides a re-run's outcome: the command, the plan's kind, its environment changes and trial."""
    return json.dumps([list(argv), plan.key, plan.env_changes, plan.trial], sort_keys=True, default=str)


class TrialPool:
    """Re-runs keyed by :func:`identity`, at most :data:`MAX_PARALLEL` at once, each in a daemon thread (a
    re-run nobody waits for never holds zdoctor's exit: its process ends with zdoctor)."""

    def __init__(self, verify: Callable[[Plan, Sequence[str], Mapping[str, str]], Evidence], env: Mapping[str, str],
                 on_done: Callable[[int, int], None] | None = None) -> None:
        self._verify = verify
        self._env = dict(env)
        self._slots = threading.Semaphore(MAX_PARALLEL)
        self._runs: dict[str, tuple[Plan, Future[Evidence]]] = {}
        self._lock = threading.Lock()
        self._on_done = on_done
        self._finished = 0

    def start(self, plan: Plan, argv: Sequence[str]) -> None:
        """Start the re-run of ``argv`` with ``plan`` unless the same one is already under way."""
        key = identity(plan, argv)
        with self._lock:
            if key in self._runs:
                return
            mine: Plan = copy.deepcopy(plan)
            future: Future[Evidence] = Future()
            self._runs[key] = (mine, future)
        threading.Thread(target=self._run, args=(mine, list(argv), future), name="zdoctor-trial",
                         daemon=True).start()

    def _run(self, plan: Plan, argv: list[str], future: Future[Evidence]) -> None:
        with self._slots:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self._verify(plan, argv, self._env))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(exc)
        with self._lock:
            self._finished += 1
            done, total = self._finished, len(self._runs)
        if self._on_done is not None:
            self._on_done(done, total)

    @property
    def started(self) -> int:
        with self._lock:
            return len(self._runs)

    def unused(self, plans: Sequence[Plan], argv: Sequence[str]) -> int:
        """How many re-runs were started that none of ``plans`` wants (the trace made them moot)."""
        wanted = {identity(p, argv) for p in plans}
        with self._lock:
            return sum(1 for key in self._runs if key not in wanted)

    def results(self, plans: Sequence[Plan], argv: Sequence[str]) -> list[Evidence]:
        """Try each of ``plans`` with ``argv`` (taking a matching re-run already under way), fill in each
        plan's verdict, and drop the predicted re-runs none of them wants. Evidence in the plans' order."""
        wanted = [identity(p, argv) for p in plans]
        self.drop_all_but(set(wanted))
        for p in plans:
            self.start(p, argv)
        out: list[Evidence] = []
        for p, key in zip(plans, wanted):
            ran, fut = self._runs[key]
            out.append(fut.result())
            p.tried, p.verified, p.verification = ran.tried, ran.verified, ran.verification
        return out

    def drop_all_but(self, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Cancel the re-runs not in ``keep`` that have not started (one already running ends on its own;
        its result is not used)."""
        with self._lock:
            moot = [fut for key, (_plan, fut) in self._runs.items() if key not in keep]
        for fut in moot:
            fut.cancel()
