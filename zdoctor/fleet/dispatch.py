"""Which way the fleet's snapshots are collected: through pdsh in one run, one launcher run per node, or by
pushing the one-file bundle first. Above :mod:`.collect` (the ways) and :mod:`.push` (the bundle), so
neither imports the other's caller."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zdoctor.core.errors import UsageError
from zdoctor.fleet import launch
from zdoctor.fleet.collect import NodeRun, OnNode, OnStart, pdsh_nodes, per_node, require_launcher
from zdoctor.fleet.push import collect_with_push


def collect(hosts: Sequence[str], opts: launch.FleetOptions, on_node: OnNode | None = None,
            on_start: OnStart | None = None) -> list[NodeRun]:
    """Snapshot every host through ``opts.launcher``; results in host order, one per host.

    ``on_node`` hears of each node as it finishes, one call at a time (possibly from a reader thread).
    """
    if opts.launcher not in launch.LAUNCHERS:
        raise UsageError(f"zdoctor fleet: unknown launcher {opts.launcher!r} (choose {', '.join(launch.LAUNCHERS)})")
    require_launcher(opts)
    launch.remote_argv(opts)  # a bad --zdoctor is a usage error before anything runs
    if opts.node_args:
        return _by_node_args(hosts, opts, on_node, on_start)
    if opts.push:
        return collect_with_push(hosts, opts, Path(opts.push), on_node, on_start)
    if opts.launcher == "pdsh":
        return pdsh_nodes(hosts, opts, on_node, on_start)
    return per_node(hosts, opts, on_node, on_start)


def _by_node_args(hosts: Sequence[str], opts: launch.FleetOptions, on_node: OnNode | None,
                  on_start: OnStart | None) -> list[NodeRun]:
    """Nodes with arguments of their own (``--pid HOST=PID``): each group of nodes that run the same snapshot
    command collected as usual, the groups at once; ``on_node`` still hears one node at a time."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for h in hosts:
        groups.setdefault(tuple(opts.node_args.get(h, ())), []).append(h)
    lock = threading.Lock()

    def told(node: NodeRun) -> None:
        if on_node is not None:
            with lock:
                on_node(node)

    def one(extra: tuple[str, ...], group: list[str]) -> list[NodeRun]:
        sub = dataclasses.replace(opts, snapshot_args=[*opts.snapshot_args, *extra], node_args={})
        return collect(group, sub, told, on_start)

    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        done = [pool.submit(one, extra, group) for extra, group in groups.items()]
        runs = {n.host: n for fut in done for n in fut.result()}
    return [runs[h] for h in hosts]
