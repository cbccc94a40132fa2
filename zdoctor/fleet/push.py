"""``zdoctor fleet --push``: bring the one-file bundle to nodes that lack zdoctor of this version.

Per node, three steps (through ssh or srun; pdsh asks every node the first question at once):

1. **Ask.** The node runs its own zdoctor when ``zdoctor --version`` there is this version (the snapshot
   comes back as without ``--push``); otherwise it makes a private directory (``mktemp -d``, mode 0700)
   and says where.
2. **Copy.** ``scp`` puts ``zdoctor.pyz`` into that directory (ssh, pdsh).
3. **Run and remove.** The node runs ``python3 DIR/zdoctor.pyz snapshot ...`` with its cache and state
   inside DIR, then removes DIR whatever the outcome. A copy that fails removes DIR too.

Under srun, steps 2 and 3 are one job step, ``srun --bcast=DIR/zdoctor.pyz``: Slurm copies the bundle (the
step's executable, run through its ``#!/usr/bin/env python3`` line) into DIR and runs it there, with the
cache and state in DIR (``--export``); a last step removes DIR.

Every remote line is built with :func:`shlex.join`; the directory a node names is accepted only in the
shape ``mktemp`` gives, so nothing it says reaches a local or remote shell unquoted.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zdoctor import __version__
from zdoctor.core.errors import UsageError
from zdoctor.fleet import launch
from zdoctor.fleet.collect import OUTPUT_CAP, NodeRun, OnNode, OnStart, classify, gather, split_pdsh
from zdoctor.proc.runner import run

MARK = "@@zdoctor-push-dir"
#: What ``mktemp -d "$TMPDIR/zdoctor-push.XXXXXXXXXX"`` makes: an absolute path of plain characters.
_DIR = re.compile(r"^/[A-Za-z0-9._/-]{1,200}/zdoctor-push\.[A-Za-z0-9]{10}$")
ASK_TIMEOUT = 20


def _sh(script: str, *args: str) -> str:
    """A line for any login shell that runs ``script`` under ``sh`` with positional ``args``."""
    return shlex.join(["sh", "-c", script, "sh", *args])


def ask_line(opts: launch.FleetOptions) -> str:
    """Step 1: run the node's zdoctor if it is this version, else make a private directory and name it."""
    version = shlex.join(["timeout", str(ASK_TIMEOUT), *shlex.split(opts.zdoctor), "--version"])
    script = (f'case "$({version} 2>/dev/null)" in "zdoctor {__version__}"|"zdoctor {__version__} "*) '
              f"exec {launch.remote_line(opts)};; esac; "
              'd=$(mktemp -d "${TMPDIR:-/tmp}/zdoctor-push.XXXXXXXXXX") && echo "' + MARK + ' $d"')
    return _sh(script)


def run_line(opts: launch.FleetOptions, directory: str) -> str:
    """Step 3: the pushed bundle under the system ``python3``, everything it writes inside ``directory``,
    which is removed afterwards (also when the bundle fails or is stopped by ``timeout``)."""
    snapshot = launch.remote_argv(dataclasses.replace(opts, zdoctor="zdoctor"))[1:]
    limit = str(max(1, int(opts.timeout)))
    script = ('d=$1; shift; XDG_CACHE_HOME="$d/cache" XDG_STATE_HOME="$d/state" '
              f'timeout -k 5 {limit} python3 "$d/zdoctor.pyz" "$@"; rc=$?; rm -rf -- "$d"; exit $rc')
    return _sh(script, directory, *snapshot)


def cleanup_line(directory: str) -> str:
    return _sh('rm -rf -- "$1"', directory)


def pushed_dir(stdout: str) -> str | None:
    """The private directory a node named in step 1, if it named one in the expected shape."""
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            d = line[len(MARK) + 1:].strip()
            return d if _DIR.match(d) else None
    return None


def scp_argv(host: str, opts: launch.FleetOptions, bundle: Path, directory: str) -> list[str]:
    target = f"[{host}]" if ":" in host else host
    argv = ["scp", "-q", "-B", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={opts.connect_timeout}"]
    if opts.ssh_config:
        argv += ["-F", opts.ssh_config]
    return [*argv, "--", str(bundle), f"{target}:{directory}/zdoctor.pyz"]


def _ssh(host: str, opts: launch.FleetOptions, line: str, timeout: float, on_start: OnStart | None):  # noqa: ANN202
    return run(launch.ssh_argv(host, opts, line), timeout=timeout, cap=OUTPUT_CAP, label=f"ssh {host}",
               on_start=on_start)


def _push(host: str, directory: str, opts: launch.FleetOptions, bundle: Path, on_start: OnStart | None,
          spent: float) -> NodeRun:
    """Steps 2 and 3 for one node that asked for the bundle."""
    cp = run(scp_argv(host, opts, bundle, directory), timeout=opts.timeout, label=f"scp {host}", on_start=on_start)
    if cp.exit_code != 0 or cp.error:
        _ssh(host, opts, cleanup_line(directory), opts.timeout, on_start)
        said = "; ".join(ln for ln in (cp.stderr or "").splitlines() if ln.strip())[-300:]
        node = NodeRun(host, "unreachable", f"scp of zdoctor.pyz failed: {cp.error or said or cp.exit_code}",
                       cp.exit_code)
    else:
        ev = _ssh(host, opts, run_line(opts, directory), opts.timeout, on_start)
        timed_out = bool(ev.error and ev.error.startswith("timed out"))
        node = classify(host, "ssh", ev.exit_code, ev.stdout.splitlines(), ev.stderr.splitlines(), timed_out,
                        opts.timeout, "python3")
        node.argv = launch.ssh_argv(host, opts, run_line(opts, directory))
        spent += cp.duration_s + ev.duration_s
    node.pushed = "bundle"
    node.duration_s = spent
    return node


def srun_push_argv(host: str, opts: launch.FleetOptions, bundle: Path, directory: str) -> list[str]:
    """Steps 2 and 3 under srun: the bundle broadcast into ``directory`` and run from there."""
    snapshot = launch.remote_argv(dataclasses.replace(opts, zdoctor="zdoctor"))[1:]
    flags = [f"--bcast={directory}/zdoctor.pyz",
             f"--export=ALL,XDG_CACHE_HOME={directory}/cache,XDG_STATE_HOME={directory}/state"]
    return launch.srun_argv(host, opts, [str(bundle), *snapshot], flags)


def _srun_push(host: str, directory: str, opts: launch.FleetOptions, bundle: Path, on_start: OnStart | None,
               spent: float) -> NodeRun:
    argv = srun_push_argv(host, opts, bundle, directory)
    ev = run(argv, timeout=opts.timeout, cap=OUTPUT_CAP, label=f"srun {host}", on_start=on_start)
    run(launch.srun_argv(host, opts, ["rm", "-rf", "--", directory]), timeout=opts.timeout,
        label=f"srun {host} (clean-up)")
    timed_out = bool(ev.error and ev.error.startswith("timed out"))
    node = classify(host, "srun", ev.exit_code, ev.stdout.splitlines(), ev.stderr.splitlines(), timed_out,
                    opts.timeout, str(bundle))
    node.argv, node.pushed, node.duration_s = argv, "bundle", spent + ev.duration_s
    return node


def _finish(host: str, opts: launch.FleetOptions, bundle: Path, exit_code: int | None, out: str, err: str,
            timed_out: bool, argv: list[str], spent: float, on_start: OnStart | None) -> NodeRun:
    directory = pushed_dir(out)
    if directory is not None and opts.launcher == "srun":
        return _srun_push(host, directory, opts, bundle, on_start, spent)
    if directory is not None:
        return _push(host, directory, opts, bundle, on_start, spent)
    node = classify(host, opts.launcher, exit_code, out.splitlines(), err.splitlines(), timed_out, opts.timeout,
                    opts.zdoctor)
    if MARK in out:
        node.status, node.error = "error", "the node named a private directory zdoctor does not accept"
    node.pushed = "own" if node.status == "ok" else None
    node.argv, node.duration_s = argv, spent
    return node


def collect_with_push(hosts: Sequence[str], opts: launch.FleetOptions, bundle: Path,
                      on_node: OnNode | None = None, on_start: OnStart | None = None) -> list[NodeRun]:
    """Snapshot every host, pushing the bundle to those without zdoctor of this version."""
    if not bundle.is_file():
        raise UsageError(f"zdoctor fleet: --push: {bundle}: no such file (build one with zdoctor build-bundle)")
    if opts.launcher == "srun" and not os.access(bundle, os.X_OK):
        raise UsageError(f"zdoctor fleet: --push: srun runs the bundle as the step's program: chmod +x {bundle}")
    launch.remote_argv(opts)
    line = ask_line(opts)
    with ThreadPoolExecutor(max_workers=max(1, min(opts.parallel, len(hosts)))) as pool:
        futures = {}
        if opts.launcher == "pdsh":
            argv = launch.pdsh_argv(hosts, opts, line)
            ev = run(argv, env=launch.pdsh_env(opts), timeout=opts.timeout + opts.connect_timeout + 30,
                     cap=OUTPUT_CAP * 4, label="pdsh", on_start=on_start)
            out, err, codes, timed, _stray = split_pdsh(hosts, ev.stdout, ev.stderr)
            for h in hosts:
                code = codes.get(h, 0 if (out[h] or err[h]) else None)
                futures[pool.submit(_finish, h, opts, bundle, code, "\n".join(out[h]), "\n".join(err[h]),
                                    h in timed, argv, ev.duration_s, on_start)] = h
        else:
            def ask(h: str) -> NodeRun:
                argv = launch.ssh_argv(h, opts, line) if opts.launcher == "ssh" else \
                    launch.srun_argv(h, opts, shlex.split(line))
                ev = run(argv, timeout=opts.timeout, cap=OUTPUT_CAP, label=f"ssh {h}", on_start=on_start)
                timed_out = bool(ev.error and ev.error.startswith("timed out"))
                if ev.error and not timed_out:
                    return NodeRun(h, "unreachable", ev.error)
                return _finish(h, opts, bundle, ev.exit_code, ev.stdout, ev.stderr, timed_out, argv,
                               ev.duration_s, on_start)

            futures = {pool.submit(ask, h): h for h in hosts}
        return gather(futures, hosts, on_node)
