"""Start zdoctor's own interpreter isolated from the caller's Python environment.

zdoctor often runs as root on a node whose shell exports the training's ``PYTHONPATH``. Python reads
that variable before any line of zdoctor runs: a ``sitecustomize.py`` there runs inside the
interpreter, a ``json.py`` or ``psutil.py`` there would be imported in place of the real one, and
whatever they print lands ahead of ``check --json``. Where zdoctor controls its start (``python -m
zdoctor``, and the console script), it re-executes itself as ``python -I`` (isolated mode: no
``PYTHON*`` variables, no user site directory, neither the current directory nor the script's on
``sys.path``) before importing anything else of its own. The environment itself is left as it is: the
training interpreter zdoctor probes still sees its ``PYTHONPATH``.

What this cannot undo: the console script's interpreter has already run a ``sitecustomize.py`` found on
``PYTHONPATH`` once, before the re-exec (its buffered output is dropped by the exec, output it flushed
is not). Started as ``python3 -I -m zdoctor`` (or with ``PYTHONPATH`` unset, as sudo's ``env_reset``
does), nothing from it runs at all. ``ZDOCTOR_NO_ISOLATE=1`` turns the re-exec off.
"""

from __future__ import annotations

import os
import sys

#: Variables through which the caller's environment reaches zdoctor's own imports.
IMPORT_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "PYTHONINSPECT",
                    "PYTHONPLATLIBDIR", "PYTHONSAFEPATH")
#: The isolated interpreter finds this zdoctor (a checkout, a wheel, a user-site install) by the folder
#: that holds the package, passed as the first argument, then runs the command line.
_BOOT = ("import sys\nhome = sys.argv.pop(1)\nsys.path.insert(0, home)\nsys.argv[0] = 'zdoctor'\n"
         "from zdoctor.front.cli import main\nraise SystemExit(main())\n")


def _needed(from_module: bool) -> bool:
    if sys.flags.isolated or os.environ.get("ZDOCTOR_NO_ISOLATE") or not sys.executable:
        return False
    if from_module and sys.path and sys.path[0] in ("", os.getcwd()):
        return True  # ``python -m zdoctor`` puts the current directory first on sys.path
    return any(os.environ.get(name) for name in IMPORT_VARIABLES)


def restart_isolated(argv: list[str], *, from_module: bool = False) -> None:
    """Replace this process by ``python -I`` running zdoctor with ``argv``, when the caller's
    environment could reach zdoctor's imports; return without doing anything otherwise."""
    if not _needed(from_module):
        return
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-c", _BOOT, home, *argv])
    except OSError:  # no exec (an embedded interpreter): carry on unisolated rather than fail
        return


def console() -> int:
    """The ``zdoctor`` console script."""
    restart_isolated(sys.argv[1:])
    from zdoctor.front.cli import main

    return main()
