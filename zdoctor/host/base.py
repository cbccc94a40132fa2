"""A Host answers "what did probe X find?": from the live machine, or from a recorded snapshot."""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from zdoctor.core import progress
from zdoctor.core.model import Evidence, ProbeResult
from zdoctor.proc import children
from zdoctor.proc.nodeload import budget_stretch, load_words, node_load

if TYPE_CHECKING:
    from zdoctor.core.registry import Facts


class Host:
    """Base class: caches one result per probe and runs independent probes concurrently."""

    kind = "abstract"

    def __init__(self) -> None:
        self._results: dict[str, ProbeResult] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._shared: dict[str, Any] = {}
        #: Every probe asked for together so far (:meth:`results`): a probe may share work with one planned.
        self.planned: set[str] = set()
        self.info: dict[str, Any] = {}

    # -- to be provided by subclasses -------------------------------------------------------------
    def _compute(self, name: str) -> ProbeResult:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- shared machinery -------------------------------------------------------------------------
    def _lock_for(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def result(self, name: str) -> ProbeResult:
        """The result of probe ``name``, computed once per host (thread-safe). A probe's time spent here,
        waiting for another probe, is not counted against its own budget (:class:`OwnClock`)."""
        cached = self._results.get(name)
        if cached is not None:
            return cached
        with OwnClock.waiting():
            return self._result_uncached(name)

    def _result_uncached(self, name: str) -> ProbeResult:
        with self._lock_for(name):
            cached = self._results.get(name)
            if cached is None:
                progress.started(name)
                try:
                    cached = self._compute(name)
                finally:
                    progress.ended(name)
                self._results[name] = cached
        return cached

    def shared(self, key: str, make: Callable[[], Any] | None = None) -> Any:
        """The one object ``key`` names for this host, made by ``make`` on the first call (thread-safe): the
        work two probes share, done once. None when there is none and no ``make``."""
        with self._guard:
            if key not in self._shared and make is not None:
                self._shared[key] = make()
            return self._shared.get(key)

    def has_result(self, name: str) -> bool:
        """Whether probe ``name`` has its result here already."""
        return name in self._results

    def facts_of(self, name: str) -> dict[str, Any]:
        """Probe ``name``'s facts when it ran to the end here, else ``{}`` (see
        :func:`zdoctor.core.registry.facts_of`)."""
        from zdoctor.core.registry import facts_of

        return facts_of(self, name)

    def results(self, names: Iterable[str]) -> Facts:
        """Run the named probes concurrently (each bounded by its own timeout) and return them all."""
        from zdoctor.core.registry import Facts

        wanted = list(dict.fromkeys(names))
        self.planned.update(wanted)
        threads = [threading.Thread(target=self.result, args=(n,), daemon=True) for n in wanted
                   if n not in self._results]
        for t in threads:
            t.start()
        with OwnClock.waiting():
            for t in threads:
                children.join(t)
        return Facts({n: self._results[n] for n in wanted})

    def settle(self, name: str, result: ProbeResult) -> ProbeResult:
        """Answer ``result`` for probe ``name`` unless a result has already arrived; return the one in effect.

        For a caller that stops waiting on a running probe (the guide's cancel): the probe's own later
        result still replaces it, as any computed result does.
        """
        return self._results.setdefault(name, result)

    def forget(self, names: Iterable[str]) -> None:
        """Drop cached results so the next request probes again (a re-check after a fix)."""
        for name in names:
            self._results.pop(name, None)
        with self._guard:
            self._shared.clear()  # a re-check runs the shared work again

    def recorded(self) -> dict[str, ProbeResult]:
        """Every result computed so far."""
        return dict(self._results)


class OwnClock:
    """A probe's own time: its worker's wall time less the time it spent waiting in :meth:`Host.result` for
    the probes it reads, which have budgets of their own. So a probe that reads a slow one (the traced run,
    say) is not out of time before it has started its own work."""

    _local = threading.local()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._waited = 0.0
        self._since: float | None = None
        self._depth = 0

    def waited(self) -> float:
        """Seconds spent waiting for other probes so far."""
        with self._lock:
            return self._waited + (time.monotonic() - self._since if self._since is not None else 0.0)

    def own(self) -> float:
        """Seconds of the probe's own work so far."""
        return time.monotonic() - self._t0 - self.waited()

    def _enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._since = time.monotonic()
            self._depth += 1

    def _leave(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._since is not None:
                self._waited += time.monotonic() - self._since
                self._since = None

    def bind(self) -> None:
        """Count the calling thread's waits on this clock (the probe's worker, at its start)."""
        OwnClock._local.clock = self

    @staticmethod
    @contextlib.contextmanager
    def waiting() -> Iterator[None]:
        """A wait for another probe, on the calling probe's clock (nothing outside a probe's worker)."""
        clock = getattr(OwnClock._local, "clock", None)
        if clock is None:
            yield
            return
        clock._enter()
        try:
            yield
        finally:
            clock._leave()


def _join_own(worker: threading.Thread, clock: OwnClock, budget: float) -> None:
    """Wait for ``worker`` until it ends or its own time (:class:`OwnClock`) reaches ``budget``."""
    while worker.is_alive():
        left = budget - clock.own()
        if left <= 0:
            return
        children.join(worker, left)


def run_probe_guarded(host: Host, name: str) -> ProbeResult:
    """Run a registered probe in a daemon thread with its timeout, counted on its own time (the time it
    waits for the probes it reads is theirs); exceptions become ``crash``."""
    from zdoctor.core.registry import PROBES
    from zdoctor.proc import contain

    spec = PROBES.get(name)
    started = time.time()
    if spec is None:
        return ProbeResult(probe=name, status="crash", error=f"unknown probe {name!r}", started=started)
    box: dict[str, Any] = {}
    clock = OwnClock()

    def target() -> None:
        clock.bind()
        try:
            with contain.background() if spec.background else contextlib.nullcontext():
                box["out"] = spec.func(host)
        except BaseException as exc:  # noqa: BLE001 - a probe must never take the doctor down
            box["exc"] = exc
            box["tb"] = traceback.format_exc()

    t0 = time.monotonic()
    worker = threading.Thread(target=target, name=f"probe:{name}", daemon=True)
    worker.start()
    _join_own(worker, clock, spec.timeout)
    load, cpus = node_load()
    stretch = budget_stretch(load, cpus)
    if worker.is_alive() and stretch > 1.0:  # a node busier than its CPUs: the probe is late, not stuck
        _join_own(worker, clock, spec.timeout * stretch)
    duration = time.monotonic() - t0
    if worker.is_alive():
        busy = load_words(load, cpus)
        waited = clock.waited()
        own = f"{duration - waited:.0f}s of its own, after {waited:.0f}s waiting for the probes it reads" \
            if waited >= 1.0 else f"{duration:.0f}s"
        return ProbeResult(
            probe=name, status="timeout", started=started, duration_s=duration,
            error=f"probe {name} ran out of time: {own} (its {spec.timeout:g}s budget"
                  + (f", stretched {stretch:.1f}x for the load" if stretch > 1.0 else "") + f"; {busy}), "
                  "and was abandoned",
        )
    if "exc" in box:
        exc = box["exc"]
        return ProbeResult(
            probe=name, status="crash", started=started, duration_s=duration,
            error=f"{type(exc).__name__}: {exc}",
            evidence=[Evidence(label=f"traceback of probe {name}", kind="traceback",
                               stdout=box["tb"], started=started)],
        )
    facts, evidence = box["out"]
    status = "skip" if facts.get("skipped") else "ok"
    return ProbeResult(probe=name, status=status, facts=facts, evidence=list(evidence), started=started,
                       duration_s=duration, error=facts.get("skipped") or None)
