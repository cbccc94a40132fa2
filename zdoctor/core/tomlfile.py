"""Reading a TOML file zdoctor ships (the glossary, the practice catalogue): its table, or one line that says
what is wrong with it and where."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from zdoctor.core.errors import InputError

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> InputError:
    """The decoder's complaint about ``path`` as ``PATH:LINE:COLUMN: invalid TOML: ...``."""
    m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
    where = f"{path}:{m.group(1)}:{m.group(2)}" if m else str(path)
    msg = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", str(exc))
    return InputError(f"{where}: invalid TOML: {msg}")


def load_toml_file(path: Path) -> dict[str, Any]:
    """The table of the TOML file ``path``; a missing, unreadable or malformed file is an :class:`InputError`."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise toml_error(path, exc) from None
