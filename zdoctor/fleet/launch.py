"""Launcher command lines: argv lists for pdsh, ssh and srun, never a local shell.

Host names are validated before they get here (:mod:`zdoctor.layers.launch.hosts`). The command the node
runs is one string for pdsh and ssh, because both hand it to the remote login shell; it is built with
:func:`shlex.join`, so a path with spaces or quotes reaches zdoctor on the node as one argument.
srun execs the argv itself, so it gets the list.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from zdoctor.core.errors import UsageError

LAUNCHERS = ("pdsh", "ssh", "srun")
DEFAULT_TIMEOUT = 180.0
DEFAULT_PARALLEL = 32
#: Seconds a launcher may spend connecting before the node counts as unreachable.
CONNECT_TIMEOUT = 10.0


@dataclass
class FleetOptions:
    """How to reach the nodes and what to run there."""

    launcher: str = "pdsh"
    zdoctor: str = "zdoctor"
    python: str | None = None
    parallel: int = DEFAULT_PARALLEL
    timeout: float = DEFAULT_TIMEOUT
    ssh_config: str | None = None
    snapshot_args: list[str] = field(default_factory=list)
    #: ``--push``: the zdoctor.pyz to copy to nodes that lack zdoctor of this version.
    push: str | None = None
    #: Further snapshot arguments of single nodes (``fleet --pid HOST=PID``: that node's job).
    node_args: dict[str, list[str]] = field(default_factory=dict)

    @property
    def connect_timeout(self) -> int:
        return max(1, math.ceil(min(CONNECT_TIMEOUT, self.timeout / 2)))

    @property
    def probe_timeout(self) -> int:
        """The node's own ``--timeout`` (traced command, remedy re-runs): a third of the node's budget."""
        return int(min(120, max(1, self.timeout // 3)))


def remote_argv(opts: FleetOptions) -> list[str]:
    """What runs on each node: ``zdoctor snapshot -o - --armor`` with the interpreter and time limit."""
    try:
        base = shlex.split(opts.zdoctor)
    except ValueError as exc:
        raise UsageError(f"zdoctor fleet: --zdoctor {opts.zdoctor!r}: {exc}") from None
    if not base:
        raise UsageError("zdoctor fleet: --zdoctor is empty")
    argv = [*base, "snapshot", "-o", "-", "--armor", "--timeout", str(opts.probe_timeout)]
    if opts.python:
        argv += ["--python", opts.python]
    return argv + list(opts.snapshot_args)


def remote_line(opts: FleetOptions) -> str:
    """The line pdsh and ssh hand to the node's login shell: zdoctor under coreutils ``timeout``.

    Killing ssh does not stop a command that has no terminal on the node, so the node bounds it itself:
    SIGTERM at the node's budget, SIGKILL 5 s later.
    """
    return shlex.join(["timeout", "-k", "5", str(max(1, math.ceil(opts.timeout))), *remote_argv(opts)])


def ssh_argv(host: str, opts: FleetOptions, line: str | None = None) -> list[str]:
    """``ssh`` to one host: no password prompts, a connect timeout, the remote line (default
    :func:`remote_line`) shell-quoted."""
    argv = ["ssh", "-n", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={opts.connect_timeout}"]
    if opts.ssh_config:
        argv += ["-F", opts.ssh_config]
    return [*argv, "--", host, remote_line(opts) if line is None else line]


def pdsh_argv(hosts: Sequence[str], opts: FleetOptions, line: str | None = None) -> list[str]:
    """One ``pdsh`` over every host with its ssh module, fan-out, connect and command timeouts."""
    return ["pdsh", "-R", "ssh", "-f", str(max(1, opts.parallel)), "-t", str(opts.connect_timeout),
            "-u", str(max(1, math.ceil(opts.timeout))), "-w", ",".join(hosts),
            remote_line(opts) if line is None else line]


def pdsh_env(opts: FleetOptions, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for pdsh: the caller's, with ssh told never to prompt (and the config, if given).

    pdsh splits ``PDSH_SSH_ARGS_APPEND`` on white space, so a config path containing any is refused.
    """
    env = dict(os.environ if environ is None else environ)
    extra = ["-o", "BatchMode=yes"]
    if opts.ssh_config:
        if any(c.isspace() for c in opts.ssh_config):
            raise UsageError(f"zdoctor fleet: --ssh-config {opts.ssh_config!r}: pdsh cannot pass a path "
                             "with white space to ssh (use --launcher ssh, or move the file)")
        extra += ["-F", opts.ssh_config]
    env["PDSH_SSH_ARGS_APPEND"] = " ".join(filter(None, [env.get("PDSH_SSH_ARGS_APPEND", "").strip(), *extra]))
    return env


def srun_argv(host: str, opts: FleetOptions, argv: Sequence[str] | None = None,
              flags: Sequence[str] = ()) -> list[str]:
    """One ``srun`` job step on one node; ``--overlap`` so it runs beside a job that holds the node. The step
    runs ``argv`` (default :func:`remote_argv`), with any further srun ``flags``."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap", "--quiet",
            f"--immediate={opts.connect_timeout}", "--job-name=zdoctor-fleet", *flags, "--",
            *(remote_argv(opts) if argv is None else argv)]
