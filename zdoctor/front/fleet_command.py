"""`zdoctor fleet`: from arguments to a recorded, printed (or shown) fleet report."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from zdoctor.core.errors import UsageError
from zdoctor.fleet.collect import NodeRun, require_launcher
from zdoctor.fleet.launch import FleetOptions
from zdoctor.fleet.live import LiveFleet
from zdoctor.fleet.record import runs_from_events
from zdoctor.fleet.result import FleetReport
from zdoctor.layers.launch.hosts import Node, expand_nodelist, read_hostfile
from zdoctor.report.console import print_whatever_is_read

SLURM_NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")


def _nodes(args: argparse.Namespace, environ: dict[str, str]) -> tuple[list[Node], str, str]:
    """The nodes, where they came from, and the launcher to use."""
    launcher = args.launcher
    if args.hostfile:
        nodes = read_hostfile(args.hostfile)
        if launcher is None:
            from shutil import which

            launcher = "pdsh" if which("pdsh") else "ssh"
        return nodes, os.path.abspath(args.hostfile), launcher  # absolute: the slots remedy edits it
    var = next((v for v in SLURM_NODELIST_VARS if environ.get(v)), None)
    if launcher in (None, "srun") and var:
        return expand_nodelist(environ[var], var), f"${var}", "srun"
    raise UsageError("zdoctor fleet: name the nodes with --hostfile FILE (or run inside a Slurm allocation, "
                     "where $SLURM_JOB_NODELIST lists them)")


def options_from(args: argparse.Namespace, launcher: str) -> FleetOptions:
    """Validated :class:`FleetOptions` from the arguments."""
    if not 1 <= args.parallel <= 1024:
        raise UsageError("zdoctor fleet: --parallel must be between 1 and 1024")
    if not 1 <= args.timeout <= 3600:
        raise UsageError("zdoctor fleet: --timeout must be between 1 and 3600 seconds")
    extra: list[str] = []
    for path in args.ext:
        extra += ["--ext", os.path.abspath(path)]
    for flag, key in (("--ds-config", "ds_config"), ("--model-config", "model_config"),
                      ("--offload-path", "offload_path")):
        if getattr(args, key):
            extra += [flag, os.path.abspath(getattr(args, key))]
    if args.model_params is not None:
        from zdoctor.core.units import parse_count

        parse_count(args.model_params)  # a count that is not one fails here, not on every node
        extra += ["--model-params", args.model_params]
    if args.io_size is not None:
        from zdoctor.core.units import parse_size

        parse_size(args.io_size)
        extra += ["--io-size", args.io_size]
    if args.gpu_sample is not None:
        if not 0 < args.gpu_sample <= 600:
            raise UsageError("zdoctor fleet: --gpu-sample must be between 0 and 600 seconds")
        extra += ["--gpu-sample", f"{args.gpu_sample:g}"]
    if args.ssh_config and not os.path.isfile(args.ssh_config):
        raise UsageError(f"zdoctor fleet: --ssh-config {args.ssh_config}: no such file")
    return FleetOptions(launcher=launcher, zdoctor=args.zdoctor, python=args.sub_python, parallel=args.parallel,
                        timeout=args.timeout, ssh_config=os.path.abspath(args.ssh_config) if args.ssh_config else None,
                        snapshot_args=extra, push=_push_bundle(args))


def node_pids(values: Sequence[str], hosts: Sequence[str]) -> dict[str, list[str]]:
    """``--pid PID`` (every node) and ``--pid HOST=PID`` (one node, before the one for every node) as each
    node's snapshot arguments; a pid that is no number or a host not in the job is a usage error."""
    every: str | None = None
    own: dict[str, str] = {}
    for value in values:
        host, sep, pid = value.rpartition("=")
        if not pid.isdigit() or int(pid) < 1:
            raise UsageError(f"zdoctor fleet: --pid {value!r}: expected PID or HOST=PID (a process id)")
        if not sep:
            every = pid
        elif host not in hosts:
            raise UsageError(f"zdoctor fleet: --pid {value!r}: {host!r} is not one of the job's nodes")
        else:
            own[host] = pid
    out = {}
    for h in hosts:
        chosen = own.get(h, every)
        if chosen is not None:
            out[h] = ["--pid", chosen]
    return out


def _push_bundle(args: argparse.Namespace) -> str | None:
    """``--push``: the bundle named by ``--bundle``, else the zdoctor.pyz this zdoctor runs from."""
    if not getattr(args, "push", False):
        if getattr(args, "bundle", None):
            raise UsageError("zdoctor fleet: --bundle goes with --push")
        return None
    from zdoctor.core.resources import BUNDLE

    path = args.bundle or (str(BUNDLE) if BUNDLE is not None else None)
    if path is None:
        raise UsageError("zdoctor fleet: --push needs the one-file bundle: --bundle zdoctor.pyz (made by "
                         "`zdoctor build-bundle`), or run the fleet from zdoctor.pyz itself")
    if not os.path.isfile(path):
        raise UsageError(f"zdoctor fleet: --bundle {path}: no such file")
    return os.path.abspath(path)


def _progress(total: int) -> Callable[[NodeRun], None] | None:
    if not sys.stderr.isatty():
        return None
    done = [0]

    def show(node: NodeRun) -> None:
        done[0] += 1
        tail = "" if node.status == "ok" else f": {node.error or ''}"[:100]
        print(f"zdoctor fleet: [{done[0]}/{total}] {node.host} {node.status} ({node.duration_s:.1f} s){tail}",
              file=sys.stderr)

    return show


def _exporter(session: str | None) -> Callable[[str], Any] | None:
    """Export the recorded fleet session into the working directory (None when it was not recorded)."""
    if session is None:
        return None

    from functools import partial

    from zdoctor.report.export import export_session

    return partial(export_session, session)


def _replay(args: argparse.Namespace) -> FleetReport:
    from zdoctor.walk.session import last_session_id, load_events

    sid = last_session_id() if args.replay == "last" else args.replay
    runs, launcher, source, slots = runs_from_events(load_events(sid), f"session {sid}")
    report = FleetReport.build(runs, launcher, source, slots)
    report.source = f"{source} (replayed from session {sid})"
    report.session = sid
    return report


def run_fleet(args: argparse.Namespace, argv: Sequence[str], open_log: Callable[..., Any]) -> int:
    """Collect (or replay), evaluate, record and print; the exit code is the report's."""
    if args.tui and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("zdoctor fleet: --tui needs a terminal")
    if args.replay:
        given = [args.hostfile, args.launcher, args.sub_python, args.ext, args.ds_config, args.model_params,
                 args.model_config, args.offload_path, args.io_size, args.gpu_sample, args.pid]
        if any(v not in (None, []) for v in given):
            raise UsageError("zdoctor fleet: --replay takes none of the options that describe the nodes or "
                             "the job (a recorded fleet is evaluated as it was collected)")
        report = _replay(args)
    else:
        nodes, source, launcher = _nodes(args, dict(os.environ))
        opts = options_from(args, launcher)
        require_launcher(opts)
        hosts = [n.name for n in nodes]
        slots = {n.name: n.slots for n in nodes}
        opts.snapshot_args += ["--nodes", str(len(hosts))]  # the job spans them all (memlock, offload plan)
        opts.node_args = node_pids(args.pid, hosts)
        info = {"kind": "fleet", "hostname": socket.gethostname(), "launcher": launcher, "source": source,
                "nodes": len(hosts)}
        log = open_log("fleet", argv, info, not args.no_log)
        fleet = LiveFleet(hosts, opts, source, slots, log.record if log else (lambda _t, _d: None),
                          log.id if log else None)
        if args.tui:
            from zdoctor.front.tui import run_fleet_tui

            code = run_fleet_tui(live=fleet, exporter=_exporter(fleet.session))
            if log:
                log.close(code)
            return code
        report = fleet.run(_progress(len(hosts)))
        if log:
            log.close(report.exit_code)
    if args.json:
        print_whatever_is_read(lambda: sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n"))
    elif args.tui:
        from zdoctor.front.tui import run_fleet_tui

        run_fleet_tui(report, _exporter(report.session))
    else:
        from zdoctor.report.fleettext import print_fleet

        print_whatever_is_read(lambda: print_fleet(report, verbose=args.verbose))
    return report.exit_code
