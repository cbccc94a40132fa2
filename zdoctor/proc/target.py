"""The training job zdoctor examines, as one object: the interpreter, the environment it runs with, the failing
command, the extensions it imports first, the time limit and the job's options (ds_config, model size,
offload path ...).

A :class:`Target` is built once from the command line (:meth:`Target.from_args`, which validates it), carried
by the host (``host.target``), recorded in the session's start event (:meth:`Target.to_info`), and rebuilt
from it on resume (:meth:`Target.from_info`). Probes read it with :func:`target_of`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zdoctor.core.errors import UsageError
from zdoctor.core.units import parse_count, parse_size
from zdoctor.proc.nodeload import budget_stretch, node_load

#: The interpreter looked up on the training PATH when none is named.
DEFAULT_PYTHON = "python3"
#: The job options the offload, storage and GPU probes read (``target.options``).
OPTION_KEYS = ("ds_config", "offload_path", "model_params", "model_config", "nodes", "gpus_per_node", "train_log",
               "io_size", "gpu_sample", "user", "p2p_test", "symptom", "pid", "as_root", "hostfile")
#: Options naming a file: made absolute, and they must exist.
FILE_OPTIONS = (("ds_config", "--ds-config"), ("model_config", "--model-config"), ("train_log", "--log"),
                ("hostfile", "--hostfile"))


@dataclass
class Target:
    """The training job: ``python`` (named with ``--python`` when ``python_explicit``), its environment
    ``env``, the failing ``command``, extensions ``ext`` imported before torch, the ``timeout`` of a traced
    run, and the job ``options``."""

    python: str = DEFAULT_PYTHON
    python_explicit: bool = False
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    command: str | None = None
    ext: list[str] = field(default_factory=list)
    timeout: float | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def limit(self, default: float, *, capped: bool = False) -> float:
        """The time limit of a run of the training's code: the user's ``--timeout`` as given (their limit),
        else ``default``, zdoctor's own budget, stretched on a node busier than its CPUs
        (:func:`~zdoctor.proc.nodeload.budget_stretch`): a slow run there is late, not stuck. ``capped``: the
        user's limit, but never longer than that stretched budget (a trial that needs only a part of the run)."""
        stretched = float(default) * budget_stretch(*node_load())
        if self.timeout:
            return min(float(self.timeout), stretched) if capped else float(self.timeout)
        return stretched

    @classmethod
    def of(cls, python: str | None = None, env: Mapping[str, str] | None = None, *, command: str | None = None,
           ext: Sequence[str] = (), timeout: float | None = None,
           options: Mapping[str, Any] | None = None) -> Target:
        """A target as given (no checks): ``python=None`` means the first ``python3`` on the training PATH."""
        return cls(python=python or DEFAULT_PYTHON, python_explicit=python is not None,
                   env=dict(os.environ if env is None else env), command=command, ext=list(ext), timeout=timeout,
                   options={k: v for k, v in (options or {}).items() if v is not None})

    @classmethod
    def from_args(cls, python: str | None, command: str | None, ext: Sequence[str], timeout: float | None,
                  options: Mapping[str, Any]) -> Target:
        """A target from the command line, validated once: a bad value is a one-line :class:`UsageError`
        (or :class:`InputError`) before anything is probed."""
        if command is not None and not command.strip():
            raise UsageError("zdoctor: --command is empty")
        if python is not None and not python.strip():
            raise UsageError("zdoctor: --python is empty")
        paths = [os.path.abspath(os.path.expanduser(p)) for p in ext]
        for p in paths:
            if not os.path.exists(p):
                raise UsageError(f"zdoctor: --ext {p}: no such file")
            mode = os.stat(p).st_mode
            if not stat.S_ISREG(mode):  # the import probe would dlopen it: a FIFO blocks it for good
                from zdoctor.proc.userfile import kind_of

                raise UsageError(f"zdoctor: --ext {p}: is {kind_of(mode)}, not a regular file; only regular "
                                 "files are loaded as an extension")
        for text in options.get("symptom") or []:
            if not str(text).strip():
                raise UsageError("zdoctor: --symptom is empty")
        if timeout is not None and not 0 < timeout <= 3600:
            raise UsageError("zdoctor: --timeout must be between 0 and 3600 seconds")
        opts = {k: options.get(k) for k in OPTION_KEYS}
        if opts["user"] is not None:
            import pwd

            try:
                pwd.getpwnam(opts["user"])
            except KeyError:
                raise UsageError(f"zdoctor: --user {opts['user']}: no such user on this machine") from None
        for key in ("nodes", "gpus_per_node", "pid"):
            count = opts[key]
            if count is not None and count < 1:
                raise UsageError(f"zdoctor: --{key.replace('_', '-')} must be at least 1")
        if opts["io_size"] is not None:
            parse_size(opts["io_size"])  # a bad size is a one-line InputError (exit 2) before any probing
        if opts["model_params"] is not None:
            parse_count(opts["model_params"])  # likewise for a count that is not one
        for key, flag in FILE_OPTIONS:
            given = opts[key]
            if given is not None:
                opts[key] = path = os.path.abspath(os.path.expanduser(given))
                if not os.path.exists(path):
                    raise UsageError(f"zdoctor: {flag} {path}: no such file")
        return cls.of(python, command=command, ext=paths, timeout=timeout, options=opts)

    def to_info(self) -> dict[str, Any]:
        """What the session's start event records of the target (the environment is not: it is redacted
        and recorded by the probes that read it)."""
        return {"python": self.python, "python_explicit": self.python_explicit, "command": self.command,
                "ext": list(self.ext), "timeout": self.timeout, "options": dict(self.options)}

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> Target:
        """The target a session recorded (:meth:`to_info`), for this process's environment; odd values are
        left out."""
        python = info.get("python") if info.get("python_explicit") else None
        options = info.get("options") if isinstance(info.get("options"), dict) else {}
        ext = [str(e) for e in info.get("ext") or [] if isinstance(e, str)]
        timeout = info.get("timeout") if isinstance(info.get("timeout"), (int, float)) else None
        command = info.get("command") if isinstance(info.get("command"), str) else None
        return cls.of(python if isinstance(python, str) else None, command=command, ext=ext, timeout=timeout,
                      options=options)

    def resolve_python(self) -> tuple[str | None, str | None, str | None]:
        """The interpreter to run: ``(path, problem, message)``. A bare name is looked up on the training
        PATH; a path is expanded (``~``) and must be an executable file. ``problem`` is ``missing`` or
        ``not_executable`` when it is not usable."""

        python = self.python
        if "/" not in python:
            from zdoctor.proc.runner import which_all  # the runner's imports wait for the first probe

            found = which_all(python, self.env.get("PATH"))
            if not found:
                return None, "missing", f"{python}: not found on the target PATH ({self.env.get('PATH', '')!r})"
            return found[0], None, None
        path = os.path.abspath(os.path.expanduser(python))
        if not os.path.exists(path):
            return None, "missing", f"{path}: no such file"
        if os.path.isdir(path):
            return None, "not_executable", f"{path}: is a directory, not an interpreter"
        if not os.access(path, os.X_OK):
            return None, "not_executable", f"{path}: not executable (permission denied)"
        return path, None, None


def target_of(host: Any) -> Target:
    """The target a host carries; a host without one (a test double) gets the default target."""
    target = getattr(host, "target", None)
    return target if isinstance(target, Target) else Target.of()
