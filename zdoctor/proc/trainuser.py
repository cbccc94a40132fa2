"""Who runs the training: the account zdoctor works out from ``--user``, the owner of the ``--python``
environment, ``SUDO_USER`` or itself, with the rule that chose it. The probes judge access as that user, and
zdoctor runs the user's own code as that user."""

from __future__ import annotations

import grp
import os
import pwd


def env_prefix(python: str) -> str | None:
    """The environment an interpreter path belongs to: ``<prefix>`` of ``<prefix>/bin/python`` (a venv or
    conda env; the path as given, links not followed, since a venv's python links to the base one)."""
    path = os.path.abspath(python)
    bindir = os.path.dirname(path)
    if os.path.basename(bindir) not in ("bin", "Scripts"):
        return None
    return os.path.dirname(bindir)


def account(uid_or_name: int | str) -> dict[str, str] | None:
    try:
        pw = pwd.getpwnam(uid_or_name) if isinstance(uid_or_name, str) else pwd.getpwuid(uid_or_name)
    except (KeyError, OSError):
        return None
    try:
        group = grp.getgrgid(pw.pw_gid).gr_name
    except KeyError:
        group = str(pw.pw_gid)
    return {"name": pw.pw_name, "group": group}


def training_user(env: dict[str, str] | None = None, *, user: str | None = None, python: str | None = None,
                  python_explicit: bool = False) -> dict[str, str]:
    """Who runs the training, and the rule that chose it (``rule``), first match wins:

    1. ``--user NAME``; 2. the owner of the ``--python`` interpreter's environment, when that is not
    root; 3. ``SUDO_USER`` when zdoctor runs as root under sudo; 4. the user zdoctor runs as.
    An unknown ``--user`` is kept by name with ``error`` set.
    """
    env = env or dict(os.environ)
    if user:
        found = account(user)
        if found:
            return {**found, "rule": "--user"}
        return {"name": user, "group": user, "rule": "--user", "error": f"no user {user!r} on this machine"}
    if python and python_explicit:
        prefix = env_prefix(python)
        try:
            owner = os.stat(prefix).st_uid if prefix else None
        except OSError:
            owner = None
        found = account(owner) if owner not in (None, 0) else None
        if found and prefix:
            return {**found, "rule": f"owner of the training environment {prefix} (--python)"}
    name = env.get("SUDO_USER") if os.geteuid() == 0 else None
    found = account(name) if name else None
    if found:
        return {**found, "rule": "SUDO_USER (zdoctor runs under sudo)"}
    found = account(os.geteuid())
    rule = ("the user zdoctor runs as (root: nothing names another training user; name it with --user)"
            if os.geteuid() == 0 else "the user zdoctor runs as")
    if found:
        return {**found, "rule": rule}
    return {"name": str(os.geteuid()), "group": str(os.getegid()), "rule": rule}
