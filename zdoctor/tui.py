"""Start the Textual UI; the only place the core hands over to `screens`."""

from __future__ import annotations

import importlib
from types import ModuleType


def _screens_app() -> ModuleType:
    """The UI package: inside zdoctor in an installed wheel, at the top level in a source checkout."""
    try:
        return importlib.import_module("zdoctor.screens.app")
    except ModuleNotFoundError as exc:
        if exc.name not in ("zdoctor.screens", "zdoctor.screens.app"):
            raise
    return importlib.import_module("screens.app")


def run_tui(python: str | None, argv: list[str], host: object = None) -> int:
    """Run the guided session; returns the process exit code."""
    app = _screens_app().make_app(python=python, argv=argv, host=host)
    result = app.run()
    return int(result or 0)
