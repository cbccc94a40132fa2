"""A value inside nested records, named by its path of keys (``("torch", "import", "state")``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def value_at(data: Any, path: Iterable[Any], default: Any = None) -> Any:
    """The value at ``path`` inside ``data`` (mappings and lists), or ``default`` when a step is missing."""
    cur = data
    for key in path:
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            return default
    return cur
