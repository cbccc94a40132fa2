"""Whose code runs as whom: the training environment's code runs as its owner, never as root.

When zdoctor runs as root and the training environment (the ``--python`` interpreter's prefix) belongs
to another user, anything that executes that environment's code (the probe interpreter, the traced
command, every remedy trial) runs as the training user, with that user's uid and primary gid and no
supplementary groups. The runner applies the same rule to every command it starts, from what the command
runs (:mod:`zdoctor.proc.codeowner`), so no caller can keep root for such code. System tools zdoctor runs as root
itself are
named by absolute paths in the system directories (:func:`system_tool`), never looked up on a PATH the
caller or the training user controls (:func:`zdoctor.proc.systools.system_tool`).
"""

from __future__ import annotations

import os
import pwd
from typing import Any

from zdoctor.proc import codeowner
from zdoctor.proc.runas import RunAs
from zdoctor.proc.target import Target
from zdoctor.proc.trainuser import env_prefix, training_user


def _owner_uid(path: str | None) -> int | None:
    if not path:
        return None
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def environment_owner(target: Target) -> int | None:
    """The uid that owns the training environment (the interpreter's prefix, else the interpreter itself)."""
    resolved, _kind, _err = target.resolve_python()
    if resolved is None:
        return None
    return _owner_uid(env_prefix(resolved)) if env_prefix(resolved) else _owner_uid(resolved)


def code_runs_as(target: Target) -> RunAs | None:
    """The account the training environment's code runs as, or None for zdoctor's own.

    None unless zdoctor runs as root and the environment belongs to a user other than root (then the
    training user: ``--user``, else the environment's owner) or its interpreter reads code another account
    can change at start-up (then that account, :func:`zdoctor.proc.codeowner.runs_as`).
    """
    if os.geteuid() != 0:
        return None
    owner = environment_owner(target)
    if owner in (None, 0):
        # A root-owned interpreter still runs another user's code from its site (a user site of the HOME it
        # is given, a .pth another user can change): the runner's rule, known ahead for folders to share.
        resolved = target.resolve_python()[0]
        return codeowner.runs_as([resolved, "-P"], dict(target.env), "/") if resolved else None
    chosen = training_user(dict(target.env), user=target.options.get("user"), python=target.python,
                           python_explicit=target.python_explicit)
    try:
        pw = pwd.getpwnam(chosen["name"])
    except KeyError:
        pw = None
    if pw is None or pw.pw_uid == 0:
        try:
            pw = pwd.getpwuid(owner)
        except KeyError:
            return RunAs(uid=owner, gid=owner, name=str(owner), home="/")
    return RunAs(uid=pw.pw_uid, gid=pw.pw_gid, name=pw.pw_name, home=pw.pw_dir or "/")


def runs_as_of(host: Any) -> RunAs | None:
    """:func:`code_runs_as` for the target a host carries (None for a host without one)."""
    target = getattr(host, "target", None)
    return code_runs_as(target) if isinstance(target, Target) else None


def share_dir(path: str, run_as: RunAs | None, *, writable: bool = False) -> None:
    """Let ``run_as`` use a directory zdoctor created: enter and read it, or (``writable``) own it."""
    if run_as is None:
        return
    if writable:
        os.chown(path, run_as.uid, run_as.gid)
    else:
        os.chmod(path, 0o755)
