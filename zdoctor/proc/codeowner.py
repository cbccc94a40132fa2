"""Whose code a command runs, read from what it starts: the rule the runner applies to every command.

A command zdoctor starts as root runs code from the program it names, the interpreter of a ``#!`` script,
and, for a Python, everything that interpreter imports at start-up: its prefix, its site-packages and their
``.pth`` files, the user site of the ``HOME`` it is given, ``PYTHONPATH`` and the folder of its script (or
the working directory for ``-c``/``-m``). When any of these can be changed by an account other than root,
the command runs as that account (the first one found), never as root. A Python started with ``-I -S``
(isolated, no site at all) reads none of the site places: zdoctor's own queries run that way, and stay root
when the interpreter and its prefix are root's.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import shutil
import stat
from collections.abc import Iterator, Mapping, Sequence

from zdoctor.proc.runas import RunAs
from zdoctor.proc.userfile import NOBODY, controller, read_prefix

_PYTHON = re.compile(r"python[0-9.]*[a-z]*$")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "perl"})
#: Python options that take the next argument as their value.
_VALUED = frozenset("WXQ")
#: Site places below a prefix that a Python reads at start-up.
_SITE_GLOBS = ("lib*/python*/site-packages", "lib*/python*/dist-packages", "local/lib*/python*/dist-packages",
               "local/lib*/python*/site-packages")


def _changer(path: str) -> int | None:
    """The non-root uid that can change ``path`` (a file or folder) or the way to it; None for root alone."""
    who = controller(path)
    if who is not None:
        return who
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid != 0:
        return st.st_uid
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return NOBODY
    return None


def _both(path: str) -> list[str]:
    """``path`` as given (absolute) and with its links resolved, once each."""
    full = os.path.abspath(path)
    real = os.path.realpath(full)
    return [full] if real == full else [full, real]


def _program(name: str, env: Mapping[str, str]) -> str | None:
    if "/" in name:
        return name
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _shebang(path: str) -> list[str]:
    """The ``#!`` line of a regular file, split (``[]`` for none or an unreadable file)."""
    try:
        head, _cut = read_prefix(path, 256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    return head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()


def _python_options(args: Sequence[str]) -> tuple[set[str], str | None]:
    """The one-letter options before the script, and the script (None for ``-c``, ``-m``, ``-`` or none)."""
    flags: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-" or not arg.startswith("-") or arg.startswith("--"):
            return flags, None if arg.startswith("-") else arg
        letters = arg[1:]
        for pos, letter in enumerate(letters):
            flags.add(letter)
            if letter in "cm":
                return flags, None
            if letter in _VALUED:
                if pos == len(letters) - 1:
                    i += 1
                break
        i += 1
    return flags, None


def _prefixes(python: str) -> list[str]:
    """The prefixes an interpreter reads site places from: a venv's (``pyvenv.cfg``) and the base ones."""
    found: list[str] = []
    for path in _both(python):
        bindir = os.path.dirname(path)
        for candidate in (bindir, os.path.dirname(bindir)):
            cfg = os.path.join(candidate, "pyvenv.cfg")
            if os.path.isfile(cfg):
                found.append(candidate)
                try:
                    text = read_prefix(cfg, 65536)[0].decode("utf-8", "replace")
                except OSError:
                    text = ""
                for line in text.splitlines():
                    key, _eq, value = line.partition("=")
                    if key.strip() == "home" and value.strip():
                        found.append(os.path.dirname(value.strip().rstrip("/")))
        found.append(os.path.dirname(bindir))
    return list(dict.fromkeys(p for p in found if p))


def _site_places(folder: str) -> Iterator[str]:
    """A site folder, its ``.pth`` files and the customize modules it may hold."""
    yield folder
    yield from sorted(glob.glob(os.path.join(glob.escape(folder), "*.pth")))
    for name in ("sitecustomize.py", "usercustomize.py"):
        yield os.path.join(folder, name)


def _python_places(python: str, args: Sequence[str], env: Mapping[str, str], cwd: str | None) -> Iterator[str]:
    flags, script = _python_options(args)
    isolated = "I" in flags
    no_site = "S" in flags
    for prefix in _prefixes(python):
        yield prefix
        if not no_site:
            for pattern in _SITE_GLOBS:
                for folder in sorted(glob.glob(os.path.join(glob.escape(prefix), pattern))):
                    yield from _site_places(folder)
    ignore_env = isolated or "E" in flags
    if not no_site and not isolated and "s" not in flags and not (not ignore_env and env.get("PYTHONNOUSERSITE")):
        home = env.get("HOME")
        if home:
            for folder in sorted(glob.glob(os.path.join(glob.escape(home), ".local/lib/python*/site-packages"))):
                yield from _site_places(folder)
    if not ignore_env:
        for entry in (env.get("PYTHONPATH") or "").split(os.pathsep):
            if entry:
                yield entry
    if not isolated and "P" not in flags and not (not ignore_env and env.get("PYTHONSAFEPATH")):
        yield os.path.dirname(os.path.abspath(script)) if script else (cwd or os.getcwd())
    if script:
        yield script


def _shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a ``sh -c`` script (split at new lines, ``;``, ``&&``, ``|``...), each without its leading
    ``VAR=value`` words and ``exec``/``command``; a line shlex cannot split is one command of its words."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars="();<>|&\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:
        words = script.split()
    commands: list[list[str]] = [[]]
    for word in words:
        if word and set(word) <= set("();&|<>\n"):
            commands.append([])
            continue
        current = commands[-1]
        if not current and ("=" in word.split("/")[0] or word in ("exec", "command", "nohup", "time")):
            continue
        current.append(word)
    return [c for c in commands if c]


def code_places(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
                depth: int = 0) -> Iterator[str]:
    """Every file and folder whose contents the command ``argv`` runs as code (see the module's rule)."""
    argv = list(argv)
    if depth > 3:
        return
    for _hop in range(4):  # env and #! interpreters, a few deep
        if not argv:
            return
        program = _program(argv[0], env)
        if program is None:
            return
        yield from _both(program)
        name = os.path.basename(os.path.realpath(program))
        base = os.path.basename(program)
        if name == "env" or base == "env":
            rest = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
            argv = rest
            continue
        if _PYTHON.match(base) or _PYTHON.match(name):
            yield from _python_places(program, argv[1:], env, cwd)
            return
        if name in _SHELLS or base in _SHELLS:
            if "-c" in argv[1:-1]:
                for command in _shell_commands(argv[argv.index("-c", 1) + 1]):
                    yield from code_places(command, env, cwd, depth + 1)
                return
            script = next((a for a in argv[1:] if not a.startswith("-")), None)
            if script is not None:
                yield os.path.abspath(script)
            return
        interpreter = _shebang(program)
        if not interpreter:
            return
        argv = [*interpreter, program, *argv[1:]]
    return


def _account(uid: int) -> RunAs:
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return RunAs(uid=uid, gid=uid, name=str(uid), home="/")
    return RunAs(uid=pw.pw_uid, gid=pw.pw_gid, name=pw.pw_name, home=pw.pw_dir or "/")


def runs_as(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> RunAs | None:
    """The account ``argv`` must run as: the first non-root account that can change code it runs, or None
    (zdoctor's own account) when zdoctor is not root or only root can change all of it."""
    if os.geteuid() != 0:
        return None
    env = os.environ if env is None else env
    for place in code_places(argv, env, cwd):
        uid = _changer(place)
        if uid is not None and uid != 0:
            return _account(uid)
    return None
