"""Run ``zdoctor snapshot`` on every node through the launcher, in parallel, each node bounded in time.

Every node ends as a :class:`NodeRun`: ``ok`` with its snapshot, or ``unreachable``, ``no-zdoctor``,
``timeout``, ``error`` (zdoctor ran and failed) or ``bad-output``, each with the launcher's own words.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import typing
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from zdoctor.core.errors import InputError, UsageError
from zdoctor.fleet import launch
from zdoctor.fleet.armor import END, ArmorError, decode
from zdoctor.host import ReplayHost
from zdoctor.proc import children
from zdoctor.proc.runner import run, run_streaming

NODE_STATUSES = ("ok", "unreachable", "no-zdoctor", "timeout", "error", "bad-output")
#: Output kept per node: snapshots are a few hundred KiB armored at most; this only stops a flood.
OUTPUT_CAP = 64 * 1024 * 1024
_NOT_FOUND = re.compile(r"command not found|: not found|No such file or directory|cannot execute|"
                        r"Permission denied", re.I)


@dataclass
class NodeRun:
    """What one node gave back."""

    host: str
    status: str
    error: str | None = None
    exit_code: int | None = None
    duration_s: float = 0.0
    argv: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    #: Under ``--push``: "bundle" when the node ran the pushed zdoctor.pyz, "own" when it had this version.
    pushed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"host": self.host, "status": self.status, "error": self.error, "exit_code": self.exit_code,
               "duration_s": round(self.duration_s, 3), "argv": self.argv, "stderr": self.stderr,
               "snapshot": self.snapshot}
        if self.pushed:
            out["pushed"] = self.pushed
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeRun:
        if not isinstance(d, dict) or not isinstance(d.get("host"), str) or d.get("status") not in NODE_STATUSES:
            raise ValueError("not a fleet node record")
        snap = d.get("snapshot")
        return cls(host=d["host"], status=d["status"], error=d.get("error"), exit_code=d.get("exit_code"),
                   duration_s=float(d.get("duration_s") or 0.0), argv=list(d.get("argv") or []),
                   stderr=[str(s) for s in d.get("stderr") or []], snapshot=snap if isinstance(snap, dict) else None,
                   pushed=d.get("pushed") if d.get("pushed") in ("bundle", "own") else None)


def _tail(lines: Sequence[str], n: int = 6) -> list[str]:
    return [ln for ln in lines if ln.strip()][-n:]


def _valid_snapshot(doc: dict[str, Any], host: str) -> str | None:

    try:
        ReplayHost(doc, source=host)
    except InputError as exc:
        return str(exc)
    return None


def classify(host: str, launcher: str, exit_code: int | None, out: Sequence[str], err: Sequence[str],
             timed_out: bool, timeout: float, zdoctor_cmd: str = "zdoctor") -> NodeRun:
    """Turn what the launcher gave back for ``host`` into a :class:`NodeRun`."""
    tail = _tail(err)
    said = "; ".join(tail)
    try:
        doc = decode(list(out))
        problem = _valid_snapshot(doc, host)
        if problem is None:
            return NodeRun(host, "ok", exit_code=exit_code, stderr=tail, snapshot=doc)
        armor_error = problem
    except ArmorError as exc:
        armor_error = str(exc)
    if timed_out or (launcher in ("ssh", "pdsh") and exit_code in (124, 137)):  # 124/137: the node's own `timeout`
        return NodeRun(host, "timeout", f"no snapshot within {timeout:g} s" + (f": {said}" if said else ""),
                       exit_code, stderr=tail)
    ssh_like = launcher in ("ssh", "pdsh")
    if (ssh_like and exit_code == 255) or (launcher == "srun" and exit_code not in (0, 127) and
                                             any(ln.startswith("srun: error:") for ln in tail)):
        return NodeRun(host, "unreachable", said or f"{launcher} exited with {exit_code}", exit_code, stderr=tail)
    first = zdoctor_cmd.split()[0] if zdoctor_cmd.split() else "zdoctor"
    if exit_code in (126, 127) or any(_NOT_FOUND.search(ln) and first in ln for ln in tail):
        return NodeRun(host, "no-zdoctor", said or f"{first}: not found on the node (exit {exit_code})",
                       exit_code, stderr=tail)
    if exit_code not in (0, None):
        return NodeRun(host, "error", f"zdoctor exited with {exit_code}" + (f": {said}" if said else ""),
                       exit_code, stderr=tail)
    return NodeRun(host, "bad-output", f"{armor_error}" + (f" ({said})" if said else ""), exit_code, stderr=tail)


def require_launcher(opts: launch.FleetOptions) -> None:
    """A missing launcher program is a one-line usage error before anything runs."""
    if shutil.which(opts.launcher) is None:
        other = {"pdsh": "ssh", "srun": "pdsh or ssh", "ssh": "pdsh"}[opts.launcher]
        raise UsageError(f"zdoctor fleet: {opts.launcher} is not installed or not on PATH "
                         f"(install it, or use --launcher {other})")


OnNode = typing.Callable[[NodeRun], None]
#: Called with the pid of each launcher process as it starts (it leads its own process group), so a
#: caller can cancel the run by killing those groups.
OnStart = typing.Callable[[int], None]


def _one(host: str, argv: list[str], opts: launch.FleetOptions, on_start: OnStart | None) -> NodeRun:
    ev = run(argv, timeout=opts.timeout, cap=OUTPUT_CAP, label=f"{opts.launcher} {host}", on_start=on_start)
    timed_out = ev.error is not None and ev.error.startswith("timed out")
    if ev.error and not timed_out:  # the launcher could not be started at all
        node = NodeRun(host, "unreachable", ev.error)
    else:
        node = classify(host, opts.launcher, ev.exit_code, ev.stdout.splitlines(), ev.stderr.splitlines(),
                        timed_out, opts.timeout, opts.zdoctor)
    node.argv, node.duration_s = argv, ev.duration_s
    return node


def per_node(hosts: Sequence[str], opts: launch.FleetOptions, on_node: OnNode | None,
              on_start: OnStart | None) -> list[NodeRun]:
    build = launch.ssh_argv if opts.launcher == "ssh" else launch.srun_argv
    with ThreadPoolExecutor(max_workers=max(1, min(opts.parallel, len(hosts)))) as pool:
        futures = {pool.submit(_one, h, build(h, opts), opts, on_start): h for h in hosts}
        return gather(futures, hosts, on_node)


def gather(futures: dict[Any, str], hosts: Sequence[str], on_node: OnNode | None) -> list[NodeRun]:
    """Each node's run as it completes (told to ``on_node``), then all of them in host order."""
    results: dict[str, NodeRun] = {}
    for fut in children.as_completed(futures):
        h = futures[fut]
        results[h] = fut.result()
        if on_node:
            on_node(results[h])
    return [results[h] for h in hosts]


_PDSH_SELF = re.compile(r"^pdsh@[^:]*: ")
_PDSH_EXIT = re.compile(r"(?:ssh|exec) exited with exit code (\d+)")
_PDSH_SIGNAL = re.compile(r"^sending (?:SIGTERM to \S+ |signal \d+ to )(\S+)")


def _host_prefix(line: str, hosts: dict[str, None]) -> tuple[str | None, str]:
    host, sep, rest = line.partition(": ")
    if sep and host in hosts:
        return host, rest
    if line.endswith(":") and line[:-1] in hosts:
        return line[:-1], ""
    return None, line


def split_pdsh(hosts: Sequence[str], stdout: str, stderr: str) -> tuple[dict[str, list[str]], dict[str, list[str]],
                                                                     dict[str, int], set[str], list[str]]:
    """Demultiplex pdsh's output: per host stdout lines, stderr lines, exit codes, timeouts; and lines of no host."""
    known = dict.fromkeys(hosts)
    out: dict[str, list[str]] = {h: [] for h in hosts}
    err: dict[str, list[str]] = {h: [] for h in hosts}
    codes: dict[str, int] = {}
    timed_out: set[str] = set()
    stray: list[str] = []
    for line in stdout.splitlines():
        host, rest = _host_prefix(line, known)
        (out[host] if host else stray).append(rest if host else line)
    for line in stderr.splitlines():
        own = bool(_PDSH_SELF.match(line))
        host, rest = _host_prefix(_PDSH_SELF.sub("", line), known)
        sig = _PDSH_SIGNAL.match(line)
        if host is None and sig and sig.group(1) in known:
            continue  # pdsh narrating the kill of a timed-out host: "command timeout" already says it
        if host is None:
            stray.append(line)
            continue
        m = _PDSH_EXIT.search(rest) if own else None
        if m:
            codes[host] = int(m.group(1))
        elif own and rest.strip() == "command timeout":
            timed_out.add(host)
            err[host].append("pdsh: command timeout")
        else:
            err[host].append(rest)
    return out, err, codes, timed_out, stray


def pdsh_nodes(hosts: Sequence[str], opts: launch.FleetOptions, on_node: OnNode | None,
          on_start: OnStart | None) -> list[NodeRun]:
    """One pdsh over every host; a node whose snapshot arrives whole is reported at once, the rest at the end."""
    argv = launch.pdsh_argv(hosts, opts)
    waves = -(-len(hosts) // max(1, opts.parallel))
    limit = waves * (opts.timeout + opts.connect_timeout) + 30
    known = dict.fromkeys(hosts)
    seen: dict[str, list[str]] = {h: [] for h in hosts}
    early: dict[str, NodeRun] = {}
    lock = threading.Lock()
    t0 = time.monotonic()

    def on_line(line: str) -> None:
        host, rest = _host_prefix(line, known)
        if host is None or host in early:
            return
        seen[host].append(rest)
        if rest.strip() != END:
            return
        node = classify(host, "pdsh", 0, seen[host], [], False, opts.timeout, opts.zdoctor)
        if node.status == "ok":
            node.argv, node.duration_s = argv, time.monotonic() - t0
            with lock:
                early[host] = node
            if on_node:
                on_node(node)

    ev = run_streaming(argv, on_line, env=launch.pdsh_env(opts), timeout=limit, cap=OUTPUT_CAP * 4, label="pdsh",
                       on_start=on_start)
    out, err, codes, timed_out, stray = split_pdsh(hosts, ev.stdout, ev.stderr)
    whole_timeout = bool(ev.error and ev.error.startswith("timed out"))
    nodes: list[NodeRun] = []
    for h in hosts:
        if h in early:
            nodes.append(early[h])
            continue
        code = codes.get(h, 0 if (out[h] or err[h]) else None)
        lines = err[h] or ([] if out[h] else _tail(stray) or ([ev.error] if ev.error else []))
        node = classify(h, "pdsh", code, out[h], lines, h in timed_out or (whole_timeout and not out[h]),
                        opts.timeout, opts.zdoctor)
        node.argv, node.duration_s = argv, ev.duration_s
        nodes.append(node)
        if on_node:
            on_node(node)
    return nodes
