"""Start the Textual UI; the only place the core hands over to `screens`."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zdoctor.fleet.live import LiveFleet
    from zdoctor.fleet.result import FleetReport


def _screens(module: str) -> ModuleType:
    """A UI module: inside zdoctor in an installed wheel, at the top level in a source checkout."""
    try:
        return importlib.import_module(f"zdoctor.screens.{module}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("zdoctor.screens", f"zdoctor.screens.{module}"):
            raise
    return importlib.import_module(f"screens.{module}")


def _screens_app() -> ModuleType:
    """The guided session's app module."""
    return _screens("app")


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    """``--resume [ID]`` and ``--demo [SCENARIO]``, for the top-level parser and for ``zdoctor tui``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--resume", metavar="ID", nargs="?", const="", default=None,
                       help="continue the newest interrupted guided session (or session ID) where it stopped")
    group.add_argument("--demo", metavar="SCENARIO", nargs="?", const="", default=None,
                       help="learn mode: replay a bundled practice scenario (without one: choose from the list)")


def session_options(args: argparse.Namespace) -> dict[str, str | None]:
    """``{"resume": ..., "demo": ...}`` from parsed arguments; a bare flag gives ``""``, absent ``None``."""
    return {"resume": getattr(args, "resume", None), "demo": getattr(args, "demo", None)}


def run_tui(python: str | None, argv: list[str], host: object = None, *, resume: str | None = None,
            demo: str | None = None) -> int:
    """Run the guided session; returns the process exit code.

    ``resume``: ``""`` for the newest resumable session, or a session id. ``demo``: ``""`` for the list of
    practice scenarios, or a scenario id. A session or scenario that does not exist raises a
    :class:`~zdoctor.core.errors.ZdoctorError` before the terminal is taken over.
    """
    app = _screens_app().make_app(python=python, argv=argv, host=host, resume=resume, demo=demo)
    result = app.run()
    return int(result or 0)


def _screens_fleet() -> ModuleType:
    """The fleet screens' module."""
    return _screens("fleet")


def run_fleet_tui(report: FleetReport | None = None, exporter: Callable[[str], Path] | None = None, *,
                  live: LiveFleet | None = None) -> int:
    """Show a fleet report (the node x check matrix, the skew table, each node's findings); returns the
    report's exit code when the user quits. ``exporter`` writes the report as md, html or json and returns
    the path written.

    Give either ``report`` or ``live``: with ``live``, each node is shown as it answers while the fleet is
    collected, then the report; quitting before every node has answered kills the launchers and returns 130
    (2 when the collection itself failed, as for a usage error).
    """
    if (report is None) == (live is None):
        raise TypeError("run_fleet_tui: give either a fleet report or a live fleet (live=), not both or neither")
    app = _screens_fleet().make_fleet_app(report, exporter, live=live)
    result = app.run()
    if result is not None:
        return int(result)
    shown = report if report is not None else app.report
    return shown.exit_code if shown is not None else 130
