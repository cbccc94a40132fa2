"""Apply a remedy the user said yes to: run its commands in ``bash``, stream the output, tell what changed.

Nothing here asks; the caller (the guided UI) must have had an explicit yes. Commands run in
``bash -c`` with ``set -e -x`` (stop at the first failing line, echo each line as it runs), in the
training environment, in a process group of their own (a cancel ends the whole group). ``export`` and
``unset`` lines cannot reach the user's shell from here: they are also written to a file to
``source`` before the launch, and the outcome says so; a remedy of such lines alone runs nothing, it is
only written to that file. Files named by absolute paths in the
commands are compared before and after, so the outcome lists what was created, modified or removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from zdoctor.core.errors import InputError
from zdoctor.core.model import Remedy, cap_text
from zdoctor.core.present import only_changes_the_shell
from zdoctor.edit.core_apply import action_argv as replace_argv
from zdoctor.edit.core_apply import remove_action_argv
from zdoctor.edit.sysfile import action_argv as create_argv
from zdoctor.layers.offload.fstab_apply import action_argv
from zdoctor.proc import codeowner, contain
from zdoctor.proc.systools import system_tool
from zdoctor.proc.target import Target
from zdoctor.walk.session import ensure_private_dir

ENV_LINE = re.compile(r"^\s*(export|unset)\s+")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OUTPUT_CAP = 64 * 1024
#: The last line a core action prints for its caller (``zdoctor-replace-record: {json}``): not output to show.
CORE_RECORD = re.compile(r"^zdoctor-[a-z]+-record: ")


@dataclass
class ApplyPlan:
    """How a remedy would be applied."""

    remedy: Remedy
    interactive: bool
    env_lines: list[str]
    reasons: list[str] = field(default_factory=list)


def plan(remedy: Remedy, is_root: bool | None = None) -> ApplyPlan:
    """Decide how to run ``remedy``: in the terminal (root needed and not root, or a ``sudo`` line, which
    may ask for a password) or in the background with its output streamed."""
    root = os.geteuid() == 0 if is_root is None else is_root
    reasons = []
    if remedy.requires_root and not root:
        reasons.append("it needs root: it runs under sudo, which may ask for your password")
    if any(re.match(r"^\s*sudo\b", c) for c in remedy.commands):
        reasons.append("a line runs sudo, which may ask for your password")
    env_lines = [c for c in remedy.commands if ENV_LINE.match(c)]
    return ApplyPlan(remedy=remedy, interactive=bool(reasons), env_lines=env_lines, reasons=reasons)


def core_action(remedy: Remedy) -> str | None:
    """What the guide runs instead of the remedy's lines, in words (None: the lines, in bash)."""
    action = remedy.action or {}
    if action.get("kind") == "fstab-add":
        return (f"zdoctor's careful fstab apply: a copy of {action.get('fstab')} with the new line is checked "
                f"with findmnt --verify, the file is backed up to {action.get('backup')}, replaced in one "
                "rename" + (", and the mount point mounted; a failed mount puts the old file back"
                             if action.get("mount", True) else ""))
    if action.get("kind") == "file-create":
        checked = f", checked as {action['check']} first" if action.get("check") else ""
        return (f"zdoctor's careful create: {action.get('path')} is written beside its name and linked into place "
                f"only while no file has that name{checked}; nothing that is there is replaced")
    if action.get("kind") == "file-edit":
        then = f", then `{action['then']}` (a failure puts the old file back)" if action.get("then") else ""
        return (f"zdoctor's careful edit: {action.get('path')} is read without following links, the edit checked, "
                f"the old file backed up to {action.get('backup')} and the new one renamed into place{then}")
    if action.get("kind") == "file-replace":
        return (f"zdoctor's careful file replace: only while {action.get('path')} is still the regular file shown "
                "(not a link, same bytes), the new text is written beside it, the old file kept as "
                f"{action.get('backup')} (or the next free name), and the new one moved into place in one rename; "
                "in a folder of the file's owner it is written as that owner")
    if action.get("kind") == "remove-lock":
        return (f"zdoctor's careful remove: {action.get('path')} is removed only if no link is on the way (its op "
                "folder reached without following links)" + (", after the dead build's compilers have exited"
                                                              if action.get("wait_pids") else ""))
    return None


def script(remedy: Remedy, trace: bool = True) -> str:
    """The bash script that applies ``remedy``: stop at the first failure, echo each line."""
    return "\n".join([f"set -e{'x' if trace else ''}", *remedy.commands, ""])


def _expands(line: str) -> bool:
    """Whether bash would expand something in ``line`` (a ``$`` or backtick outside single quotes)."""
    quoted = escaped = False
    for ch in line:
        if escaped:
            escaped = False
        elif quoted:
            quoted = ch != "'"
        elif ch == "\\":
            escaped = True
        elif ch == "'":
            quoted = True
        elif ch in "$`":
            return True
    return False


def env_effect(commands: list[str], env: Mapping[str, str]) -> list[tuple[str, str | None, str | None]] | None:
    """``(variable, now, after)`` for each variable the ``export``/``unset`` lines change, computed
    without running anything; None when a line is not a plain literal export/unset (it would need a
    shell to tell)."""
    after: dict[str, str | None] = {}
    order: list[str] = []
    for line in commands:
        if not ENV_LINE.match(line):
            continue
        if _expands(line):
            return None
        try:
            words = shlex.split(line, comments=False, posix=True)
        except ValueError:
            return None
        verb, args = words[0], words[1:]
        for arg in args:
            if verb == "unset":
                if not NAME.match(arg):
                    return None
                name, value = arg, None
            else:
                name, eq, value = arg.partition("=")
                if not NAME.match(name) or not eq:
                    return None
            if name not in order:
                order.append(name)
            after[name] = value
    return [(n, env.get(n), after[n]) for n in order]


def known_env(host: object) -> dict[str, str]:
    """The training environment as far as it is known: a live host's own, else what the snapshot's
    interpreter and library probes recorded."""
    target = getattr(host, "target", None)
    if isinstance(target, Target):
        return dict(target.env)
    out: dict[str, str] = {}
    for probe in ("pyenv", "libs"):
        try:
            facts = host.result(probe).facts  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - an unknown host answers what it can
            continue
        for k, v in (facts.get("env") or {}).items():
            if isinstance(v, str):
                out.setdefault(k, v)
    return out


def watched_paths(commands: list[str]) -> list[str]:
    """Absolute paths named as words of the commands (what a before/after comparison looks at)."""
    out: list[str] = []
    for line in commands:
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        for w in words:
            value = w.partition("=")[2] if "=" in w and not w.startswith("/") else w
            for part in value.split(":"):
                if part.startswith("/") and part not in out and "\n" not in part:
                    out.append(part)
    return out


def _state(path: str) -> tuple[bool, int, int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return True, st.st_mtime_ns, st.st_size, st.st_mode


def file_states(paths: list[str]) -> dict[str, tuple[bool, int, int, int] | None]:
    return {p: _state(p) for p in paths}


def changes(before: Mapping[str, tuple | None], after: Mapping[str, tuple | None]) -> list[str]:
    """``removed X`` / ``created X`` / ``modified X`` for every path whose state differs."""
    out = []
    for p, old in before.items():
        new = after.get(p)
        if old == new:
            continue
        out.append(f"removed {p}" if new is None else f"created {p}" if old is None else f"modified {p}")
    return out


@dataclass
class ApplyOutcome:
    """What applying a remedy did."""

    exit_code: int | None
    output: str = ""
    changed: list[str] = field(default_factory=list)
    env_file: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    interactive: bool = False
    cancelled: bool = False
    #: The record a core action printed last (its ``zdoctor-...-record: {json}`` line), never shown as output.
    record: dict[str, object] | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.cancelled and self.error is None

    def to_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "exit_code": self.exit_code, "output": cap_text(self.output, OUTPUT_CAP)[0],
                "changed": list(self.changed), "env_file": self.env_file, "error": self.error,
                "duration_s": round(self.duration_s, 3), "interactive": self.interactive,
                "cancelled": self.cancelled}


def write_env_file(lines: list[str], folder: Path, name: str) -> Path:
    """Write the ``export``/``unset`` lines to the new file ``folder/name`` (mode 0600) for the user to
    source. ``folder`` (zdoctor's ``fixes`` folder) is checked like the sessions folder: a symbolic link
    or another user's folder is refused, never written through; the file is created with ``O_EXCL``
    and ``O_NOFOLLOW`` in that folder's descriptor."""

    ensure_private_dir(folder, "fix file directory")
    text = "# Written by zdoctor: source this file in the shell (or job script) that launches training.\n"
    data = (text + "\n".join(lines) + "\n").encode("utf-8", "backslashreplace")
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(dir_fd).st_uid != os.getuid():
            raise InputError(f"{folder}: not the current user's folder; nothing written")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    return folder / name


def _as_code_owner(argv: list[str], env: dict[str, str],
                   cwd: str | None) -> tuple[list[str], dict[str, str]] | None:
    """``argv`` for a step run on the terminal (not through the runner), under the runner's rule: code another
    account can change runs as that account, through the system's ``setpriv`` (None when there is none)."""
    who = codeowner.runs_as(argv, env, cwd)
    if who is None:
        return argv, env
    tool = system_tool("setpriv")
    if tool is None:
        return None
    return ([tool, f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups", "--", *argv],
            who.child_env(env))


def run_remedy(remedy: Remedy, env: Mapping[str, str], *, on_output: Callable[[str], None] | None = None,
               cancel: threading.Event | None = None, timeout: float | None = None, cwd: str | None = None,
               env_file: tuple[Path, str] | None = None,
               terminal: Callable[[list[str], dict[str, str]], int] | None = None) -> ApplyOutcome:
    """Run ``remedy``'s commands and report what happened (never raises for a failing command).

    ``terminal``, when given, runs the argv itself with the terminal attached (an interactive step) and
    returns its exit code; otherwise output is read line by line and passed to ``on_output``.
    ``env_file`` is ``(folder, name)`` for the file the export/unset lines are written to.
    """
    p = plan(remedy)
    # the core's own actions name what they change; only lines run in bash are read for the paths they name
    watch = watched_paths(remedy.commands) if core_action(remedy) is None else []
    before = file_states(watch)
    started = time.monotonic()
    outcome = ApplyOutcome(exit_code=None, interactive=terminal is not None)
    staged = contextlib.ExitStack()  # what a step needs while it runs (the new text of a file-replace)
    argv = ["bash", "-c", script(remedy)]
    if remedy.action and remedy.action.get("kind") == "fstab-add":

        argv = action_argv(remedy.action)  # the safe core, not the copyable lines
        watch = [p for p in (remedy.action.get("fstab"), remedy.action.get("backup")) if p]
        before = file_states(watch)
    elif remedy.action and remedy.action.get("kind") in ("file-create", "file-edit"):
        argv = create_argv(remedy.action)
        watch = [str(p) for p in (remedy.action.get("path"), remedy.action.get("backup")) if p]
        before = file_states(watch)
    elif remedy.action and remedy.action.get("kind") == "file-replace":

        argv = staged.enter_context(replace_argv(remedy.action))  # the safe core, not the copyable lines
        watch = [p for p in (remedy.action.get("path"), remedy.action.get("backup")) if p]
        before = file_states(watch)
    elif remedy.action and remedy.action.get("kind") == "remove-lock":

        argv = remove_action_argv(remedy.action)
        watch = [str(remedy.action.get("path"))]
        before = file_states(watch)
    if remedy.requires_root and os.geteuid() != 0:
        argv = ["sudo", "--", *argv]
    run_env = dict(env)
    with staged:
        if env_file is not None and p.env_lines and remedy.action is None and only_changes_the_shell(remedy.commands):
            outcome.exit_code = 0  # nothing to run here: the lines only reach a shell by being sourced there
        elif terminal is not None:
            try:
                handed = _as_code_owner(argv, run_env, cwd)
                if handed is None:
                    outcome.error = (f"{argv[0]}: runs code another user can change, and there is no setpriv "
                                     "to run it as that user; not run as root")
                else:
                    outcome.exit_code = terminal(*handed)
            except OSError as exc:
                outcome.error = f"{argv[0]}: {exc.strerror or exc}"
        else:
            _stream(argv, run_env, cwd, on_output, cancel, timeout, outcome)
    outcome.duration_s = time.monotonic() - started
    outcome.changed = changes(before, file_states(watch))
    if p.env_lines and outcome.ok and env_file is not None:
        try:
            path = write_env_file(p.env_lines, *env_file)
            outcome.env_file = str(path)
            outcome.changed.append(f"wrote {path}")
        except (OSError, InputError) as exc:
            outcome.error = f"could not write the environment file: {getattr(exc, 'strerror', None) or exc}"
    return outcome


def _stream(argv: list[str], env: dict[str, str], cwd: str | None, on_output: Callable[[str], None] | None,
            cancel: threading.Event | None, timeout: float | None, outcome: ApplyOutcome) -> None:
    chunks: list[str] = []
    try:
        child = contain.popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    except OSError as exc:
        outcome.error = f"{argv[0]}: {exc.strerror or exc}"
        return
    proc = child.proc
    if child.error is not None:
        proc.communicate()
        child.finish()
        outcome.error = f"{argv[0]}: {child.error.strerror or child.error}"
        return
    deadline = None if timeout is None else time.monotonic() + timeout

    def stop() -> None:
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                outcome.cancelled = True
            elif deadline is not None and time.monotonic() > deadline:
                outcome.error = f"timed out after {timeout:g} s"
            else:
                time.sleep(0.05)
                continue
            child.stop(grace=2)
            return

    watcher = threading.Thread(target=stop, daemon=True)
    watcher.start()
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        if CORE_RECORD.match(line):
            with contextlib.suppress(ValueError):
                found = json.loads(line.partition(": ")[2])
                outcome.record = found if isinstance(found, dict) else None
            continue
        chunks.append(line)
        if on_output is not None:
            on_output(line)
    proc.wait()
    child.finish()
    watcher.join(3)
    outcome.exit_code = proc.returncode
    outcome.output = "\n".join(chunks)
