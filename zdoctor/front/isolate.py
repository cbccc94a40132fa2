"""Start zdoctor's own interpreter isolated from the caller's Python environment.

zdoctor often runs as root on a node whose shell exports the training's ``PYTHONPATH``. Python reads
that variable before any line of zdoctor runs: a ``sitecustomize.py`` there runs inside the
interpreter, a ``json.py`` or ``psutil.py`` there would be imported in place of the real one, and
whatever they print lands ahead of ``check --json``. Where zdoctor controls its start (``python -m
zdoctor``, and the console script), it re-executes itself as ``python -I`` (isolated mode: no
``PYTHON*`` variables, no user site directory, neither the current directory nor the script's on
``sys.path``) before importing anything else of its own. The environment itself is left as it is: the
training interpreter zdoctor probes still sees its ``PYTHONPATH``.

When ``PYTHONPATH`` is the only such variable, no user site directory is on ``sys.path`` and nothing the
interpreter loaded before zdoctor's first line came from ``PYTHONPATH`` (no ``sitecustomize``, no shadowed
module), the console script drops its folders from ``sys.path`` in place instead: what ``-I`` would keep
out is then out, without a second interpreter start (about 30 ms of every start on a node that exports
``PYTHONPATH``).

What this cannot undo: the console script's interpreter has already run a ``sitecustomize.py`` found on
``PYTHONPATH`` once, before the re-exec (its buffered output is dropped by the exec, output it flushed
is not). Started as ``python3 -I -m zdoctor`` (or with ``PYTHONPATH`` unset, as sudo's ``env_reset``
does), nothing from it runs at all. A user site directory on ``sys.path`` that another account owns or may
write (``sudo`` keeping HOME) re-executes too, with or without ``PYTHONPATH``; the ``.pth`` files in it
have run once by then, as a ``sitecustomize`` has. ``ZDOCTOR_NO_ISOLATE=1`` turns the re-exec off.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

#: Variables through which the caller's environment reaches zdoctor's own imports.
IMPORT_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "PYTHONINSPECT",
                    "PYTHONPLATLIBDIR", "PYTHONSAFEPATH")
#: The isolated interpreter finds this zdoctor (a checkout, a wheel, a user-site install) by the folder
#: that holds the package, passed as the first argument, then runs the command line.
_BOOT = ("import sys\nhome = sys.argv.pop(1)\nsys.path.insert(0, home)\nsys.argv[0] = 'zdoctor'\n"
         "from zdoctor.front.cli import main\nfrom zdoctor.front.finish import finish\nfinish(main())\n")


def _needed(from_module: bool) -> bool:
    if sys.flags.isolated or os.environ.get("ZDOCTOR_NO_ISOLATE") or not sys.executable:
        return False
    if from_module and sys.path and sys.path[0] in ("", os.getcwd()):
        return True  # ``python -m zdoctor`` puts the current directory first on sys.path
    return any(os.environ.get(name) for name in IMPORT_VARIABLES) or _foreign_user_site()


def _user_site() -> str | None:
    """The user site directory when it is on ``sys.path``, else None."""
    import site

    user_site = getattr(site, "USER_SITE", None)
    if user_site and any(isinstance(p, str) and _real(p) == _real(user_site) for p in sys.path):
        return user_site
    return None


def _foreign_user_site() -> bool:
    """Running as root, a user site directory on ``sys.path`` that another account owns or may write
    (``sudo`` that keeps HOME: the training user's ``~/.local``): its modules would be imported by root.
    An account's own user site is its own business (a private group may write it under umask 002)."""
    user_site = _user_site() if os.geteuid() == 0 else None
    if user_site is None:
        return False
    try:
        st = os.stat(user_site)
    except OSError:
        return False
    return st.st_uid != os.geteuid() or bool(st.st_mode & 0o022)


def _real(path: str) -> str:
    return os.path.realpath(path or os.curdir)


def _under(path: str, folders: list[str]) -> bool:
    real = _real(path)
    return any(real == f or real.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _loaded_from(folders: list[str], own: str) -> list[str]:
    """The modules already imported whose file (or package folder) lies in ``folders``, zdoctor's own
    package (``own``) aside."""
    found = []
    for name, module in list(sys.modules.items()):
        places = [getattr(module, "__file__", None), *list(getattr(module, "__path__", None) or ())]
        if any(isinstance(p, str) and _under(p, folders) and not _under(p, [own]) for p in places):
            found.append(name)
    return found


def drop_caller_paths(home: str) -> bool:
    """Take the folders ``PYTHONPATH`` put on ``sys.path`` off it, in this process, when ``PYTHONPATH`` is
    the only import variable set and nothing loaded so far came from those folders; ``home`` (the folder
    that holds zdoctor) stays reachable. False, changing nothing, where only a re-exec isolates."""
    if any(os.environ.get(name) for name in IMPORT_VARIABLES if name != "PYTHONPATH"):
        return False
    if _user_site() is not None:
        return False  # a user site directory (HOME kept by sudo: the training user's) only -I leaves out
    folders = [_real(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    if _loaded_from(folders, _real(os.path.join(home, "zdoctor"))):
        return False
    kept = [p for p in sys.path if not (isinstance(p, str) and _real(p) in folders)]
    if _real(home) not in {_real(p) for p in kept if isinstance(p, str)}:
        kept.insert(0, home)
    sys.path[:] = kept
    import importlib

    importlib.invalidate_caches()
    return True


def restart_isolated(argv: list[str], *, from_module: bool = False) -> None:
    """Keep the caller's environment out of zdoctor's imports: drop ``PYTHONPATH``'s folders in place where
    that is enough (:func:`drop_caller_paths`), else replace this process by ``python -I`` running zdoctor
    with ``argv``; return without doing anything where nothing could reach them."""
    if not _needed(from_module):
        return
    home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not from_module and drop_caller_paths(home):
        return
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-c", _BOOT, home, *argv])
    except OSError:  # no exec (an embedded interpreter): carry on unisolated rather than fail
        return


def console() -> NoReturn:
    """The ``zdoctor`` console script."""
    restart_isolated(sys.argv[1:])
    from zdoctor.front.cli import main
    from zdoctor.front.finish import finish

    finish(main())
