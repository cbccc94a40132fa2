"""Reading JSON zdoctor is given or captured: a whole document (a snapshot, a model config), whose faults are one
line that names the place, and JSON lines (a journal, a helper's records), of which only the objects count."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from zdoctor.core.errors import InputError


def json_document(text: str, path: str) -> Any:
    """``text``, the contents of ``path``, parsed as one JSON document; what cannot be read is an
    :class:`InputError` naming the file (and the line and column of a syntax error)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}") from None
    except ValueError as exc:  # an integer past the interpreter's digit limit
        raise InputError(f"{path}: unreadable JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read") from None


def json_objects(lines: Iterable[str | bytes]) -> Iterator[dict[str, Any]]:
    """The lines that hold a JSON object, parsed; any other line (text, a number, broken JSON) is passed over."""
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            yield d


def value_at(doc: Any, path: Iterable[str | int], default: Any = None) -> Any:
    """The value at ``path`` (keys and list indexes) inside a parsed document, or ``default`` where a step is
    missing or its container is not one."""
    cur = doc
    for step in path:
        try:
            cur = cur[step]
        except (KeyError, IndexError, TypeError):
            return default
    return cur
