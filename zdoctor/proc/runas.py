"""The account a child of zdoctor runs as, and how the child takes it on (groups, gid, uid, in that order).
Below the runner, which starts children as it: who that account is, is :mod:`zdoctor.proc.privilege`'s
decision."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RunAs:
    """The account a child runs as: ``uid``, primary ``gid``, ``name`` and ``home``."""

    uid: int
    gid: int
    name: str
    home: str

    def describe(self) -> str:
        """``user NAME (uid N)``, for evidence labels."""
        return f"user {self.name} (uid {self.uid})"

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with HOME, USER and LOGNAME naming this account (root's home is not the user's)."""
        return {**dict(env), "HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def drop(self) -> None:
        """In the child before exec: leave every supplementary group, then set gid and uid (in that order:
        after ``setuid`` the others are no longer allowed)."""
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)
        if os.getuid() != self.uid or os.geteuid() != self.uid:  # never run on as root
            os._exit(126)
