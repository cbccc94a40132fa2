"""The NVMe parameter swapper's buffer limits, as the installed DeepSpeed release writes them.

With ``offload_param.device = nvme`` DeepSpeed's ``AsyncPartitionedParameterSwapper`` pins ``buffer_count``
buffers of ``buffer_size`` elements each; every parameter partition it swaps must fit one buffer
(``get_buffer``: ``assert numel <= self.elements_per_buffer``), and a swap-in of several parameters (a module's,
plus what prefetch asked for) needs as many free buffers (``swap_in``). A partition is
``ceil(numel / world size)`` elements (``partition_parameters``: the aligned size over the partition world);
partitions under ``MIN_AIO_BYTES`` are not swapped.

The assertions are read from the installed release's own source with :mod:`ast` (never imported): their
line, the condition and the message template, so the finding quotes the release the job runs.
"""

from __future__ import annotations

import ast
import math
import os
import re
from typing import Any

from zdoctor.proc.userfile import open_regular_text

SWAPPER = "runtime/swap_tensor/partitioned_param_swapper.py"
UTILS = "runtime/swap_tensor/utils.py"
#: Each limit and the words of its assertion's message that name it.
LIMITS = (("buffer_size", "than buffer size"), ("buffer_count", "enough buffers"),
          ("buffer_count", "No swap buffers"), ("buffer_count", "No buffer available"))
#: The message of each limit, in every release that has it: the numbers it names.
SIZE_MESSAGE = re.compile(r"More elements (?P<numel>\d+) than buffer size (?P<buffer_size>\d+)")
COUNT_MESSAGE = re.compile(r"Not enough buffers (?P<available>\d+) for swapping (?P<wanted>\d+)")
#: A new buffer_size is rounded up to a multiple of this (still at least the need).
ROUND = 1_000_000


class Source:
    """A file's text with its lines split once: ``ast.get_source_segment`` splits the whole file at every call."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = re.split(r"(?<=\r\n)|(?<=\r)(?!\n)|(?<=\n)", text)

    def segment(self, node: ast.AST) -> str:
        """The source text of ``node`` (its offsets are UTF-8 bytes into its lines), "" when it has none."""
        first, last = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        start, end = getattr(node, "col_offset", None), getattr(node, "end_col_offset", None)
        if first is None or last is None or start is None or end is None or not 0 < first <= last <= len(self.lines):
            return ""
        if first == last:
            return self.lines[first - 1].encode()[start:end].decode("utf-8", "replace")
        head = self.lines[first - 1].encode()[start:].decode("utf-8", "replace")
        tail = self.lines[last - 1].encode()[:end].decode("utf-8", "replace")
        return "".join([head, *self.lines[first:last - 1], tail])


def _template(node: ast.AST, source: Source) -> str:
    """An assertion's message as its f-string reads: literal text and ``{expression}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                parts.append("{" + (source.segment(v.value) or "?") + "}")
        return "".join(parts)
    return source.segment(node)


def _one_line(code: str) -> str:
    """Source text spread over lines by a formatter, on one line: ``len( x )`` -> ``len(x)``."""
    return re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", " ".join(code.split())))


def read_asserts(ds_dir: str) -> dict[str, Any]:
    """The swapper's buffer assertions in the DeepSpeed package at ``ds_dir`` (its ``deepspeed/`` folder):
    {file, asserts: [{limit, line, function, condition, message}], min_aio_bytes}. Raises OSError,
    SyntaxError or UnicodeDecodeError when the file cannot be read."""
    path = os.path.join(ds_dir, SWAPPER)
    with open_regular_text(path, encoding="utf-8") as fh:
        source = Source(fh.read())
    tree = ast.parse(source.text, filename=path)
    found: list[dict[str, Any]] = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        for node in ast.walk(func):
            if not isinstance(node, ast.Assert) or node.msg is None:
                continue
            message = _template(node.msg, source)
            limit = next((lim for lim, words in LIMITS if words in message), None)
            if limit:
                found.append({"limit": limit, "line": node.lineno, "function": func.name,
                              "condition": _one_line(source.segment(node.test)),
                              "message": message})
    return {"file": path, "asserts": sorted(found, key=lambda a: a["line"]), "min_aio_bytes": _min_aio(ds_dir)}


def _min_aio(ds_dir: str) -> int | None:
    """``MIN_AIO_BYTES`` of the release (``1024**2``), None when it is not written as a number."""
    try:
        with open_regular_text(os.path.join(ds_dir, UTILS), encoding="utf-8") as fh:
            m = re.search(r"^MIN_AIO_BYTES\s*=\s*(\d+)\s*(?:\*\*\s*(\d+))?\s*$", fh.read(), re.M)
    except (OSError, UnicodeDecodeError):
        return None
    return None if m is None else int(m.group(1)) ** int(m.group(2) or 1)


def partition(numel: int, world: int) -> int:
    """The elements of one rank's partition of a parameter of ``numel`` over ``world`` ranks."""
    return math.ceil(numel / max(world, 1))


def size_needed(*numels: int | None) -> int | None:
    """The smallest round buffer_size that holds every partition given (None: none known)."""
    known = [n for n in numels if isinstance(n, int)]
    return None if not known else math.ceil(max(known) / ROUND) * ROUND


def count_needed(buffer_count: int, available: int, wanted: int) -> int:
    """The buffer_count a swap-in of ``wanted`` parameters needs, when ``available`` of ``buffer_count`` were
    free: the buffers then in use stay in use."""
    return buffer_count - available + wanted
