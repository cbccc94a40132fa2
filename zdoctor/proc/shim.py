"""Where the keeper is: the small program (:mod:`zdoctor.scripts.keeper`) that stands between zdoctor and
every command it runs, joins the command's cgroup, runs it as its owner and ends whatever it leaves behind.

zdoctor never imports the keeper: it runs the file by path in an isolated interpreter with no site
packages, ``python -I -S keeper.py LIFE ENV STATUS CGROUP CREDS -- ARGV...``.
"""

from __future__ import annotations

from pathlib import Path

from zdoctor.scripts import script_path

#: The keeper's file name among zdoctor's scripts.
KEEPER = "keeper.py"


def keeper_path() -> Path:
    """The keeper's file (beside zdoctor's modules, or extracted from the one-file bundle)."""
    return script_path(KEEPER)


def keeper_command(python: str) -> list[str]:
    """The command line that starts the keeper under ``python``; its arguments follow."""
    return [python, "-I", "-S", str(keeper_path())]


def is_keeper_command(cmdline: list[str]) -> bool:
    """Whether a process's command line is zdoctor's keeper of a command it runs."""
    return len(cmdline) > 3 and cmdline[1:3] == ["-I", "-S"] and cmdline[3] == str(keeper_path())
