"""Fleets built from the real H200 capture: each node is the recorded H200 with some facts changed.

Used where the machine cannot be what the test needs (several GPU nodes with different drivers); the
loopback sshd tests cover the real launchers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from test_gpu_facts import h200_all

from zdoctor.fleet.collect import NodeRun
from zdoctor.fleet.result import FleetReport


def snapshot_of(probes: dict[str, dict[str, Any]], hostname: str) -> dict[str, Any]:
    """A snapshot document whose probes recorded ``probes`` (facts with ``skipped`` are skips)."""
    return {"format": "zdoctor-snapshot", "version": 1, "zdoctor": "test", "created": 0.0,
            "host": {"kind": "live", "hostname": hostname},
            "probes": {n: {"probe": n, "status": "skip" if f.get("skipped") else "ok", "facts": f,
                           "error": f.get("skipped"), "evidence": [], "started": 0.0, "duration_s": 0.0}
                       for n, f in probes.items()}}


def h200_node(host: str, change: Callable[[dict[str, dict[str, Any]]], None] | None = None) -> NodeRun:
    probes = copy.deepcopy(h200_all())
    probes["libs"] = {"env": {"LD_LIBRARY_PATH": None, "LD_PRELOAD": None}}
    probes["system"] = {"hostname": host, "glibc": "glibc 2.39", "kernel": "6.8.0"}
    if change:
        change(probes)
    return NodeRun(host, "ok", exit_code=0, argv=["ssh", host], snapshot=snapshot_of(probes, host))


def older_driver(p: dict[str, dict[str, Any]]) -> None:
    p["nvml"].update(driver="570.124.06", cuda_driver=12080, cuda_driver_version="12.8")


def conda_path(p: dict[str, dict[str, Any]]) -> None:
    p["libs"]["env"]["LD_LIBRARY_PATH"] = "/opt/conda/lib"


def h200_fleet() -> list[NodeRun]:
    """Four H200 nodes: gpu-1 and gpu-4 as recorded, gpu-2 on an older driver, gpu-3 with a conda
    LD_LIBRARY_PATH; and gpu-5, which ssh could not reach."""
    return [h200_node("gpu-1"), h200_node("gpu-2", older_driver), h200_node("gpu-3", conda_path),
            h200_node("gpu-4"),
            NodeRun("gpu-5", "unreachable", "ssh: connect to host gpu-5 port 22: Connection refused", 255,
                    argv=["ssh", "gpu-5"], stderr=["ssh: connect to host gpu-5 port 22: Connection refused"])]


def h200_report() -> FleetReport:
    return FleetReport.build(h200_fleet(), "ssh", "hostfile")
