"""One fleet run as an object: collect, record and evaluate; cancellable from another thread."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass, field

from zdoctor.fleet.collect import NodeRun, OnNode
from zdoctor.fleet.dispatch import collect
from zdoctor.fleet.launch import FleetOptions, remote_argv
from zdoctor.fleet.record import record_report
from zdoctor.fleet.result import FleetReport
from zdoctor.walk.events import FleetNode, FleetStart, Recorder


@dataclass
class LiveFleet:
    """The hosts, how to reach them, and where the run is recorded; :meth:`run` blocks until every node
    has answered or timed out, :meth:`cancel` (from any thread) kills the launchers."""

    hosts: list[str]
    opts: FleetOptions
    source: str
    slots: dict[str, int | None] = field(default_factory=dict)
    record: Recorder = field(default=lambda _t, _d: None)
    session: str | None = None
    _pids: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False

    @property
    def launcher(self) -> str:
        return self.opts.launcher

    def _started(self, pid: int) -> None:
        with self._lock:
            self._pids.add(pid)
            cancelled = self.cancelled
        if cancelled:
            self._kill(pid)

    @staticmethod
    def _kill(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def cancel(self) -> None:
        """Kill every launcher process group started so far, and any started from now on."""
        with self._lock:
            self.cancelled = True
            pids = list(self._pids)
        for pid in pids:
            self._kill(pid)

    def run(self, on_node: OnNode | None = None) -> FleetReport:
        """Collect every node (each recorded as it arrives), evaluate, record the result."""
        FleetStart(launcher=self.launcher, source=self.source, hosts=list(self.hosts), slots=dict(self.slots or {}),
                   remote=list(remote_argv(self.opts)), timeout=self.opts.timeout,
                   parallel=self.opts.parallel).record(self.record)

        def arrived(node: NodeRun) -> None:
            FleetNode(node=node.to_dict()).record(self.record)
            if on_node:
                on_node(node)

        runs = collect(self.hosts, self.opts, arrived, self._started)
        report = FleetReport.build(runs, self.launcher, self.source, self.slots)
        report.session = self.session
        record_report(report, self.record)
        return report
