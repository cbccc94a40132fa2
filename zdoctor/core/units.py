"""The units zdoctor's options are given in, parsed once for every command: byte sizes (``--io-size``) and
parameter counts (``--model-params``). A bad value is a one-line :class:`InputError`."""

from __future__ import annotations

import re

from zdoctor.core.errors import InputError

MIB = 1024**2
GIB = 1024**3
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_size(text: str | int) -> int:
    """``"256M"`` -> 268435456 (K/M/G/T are powers of 1024, an optional ``iB``/``B`` is ignored);
    ``"0"`` -> 0 (skip the test). Anything else raises :class:`InputError`."""
    if isinstance(text, int):
        if text < 0:
            raise InputError(f"io size {text}: must not be negative")
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"io size {text!r}: expected a size like 256M, 1G or 0 (skip)")
    mult = {"": 1, "K": 1024, "M": MIB, "G": GIB, "T": 1024 * GIB}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def parse_count(text: str | int | float) -> int:
    """``"2851M"``, ``"7e9"``, ``"70B"``, ``"1.5T"``, ``"125m"``, ``"7,000,000"`` -> a positive integer.

    K = thousand, M = million, B or G = billion, T = trillion (parameter counts, not bytes).
    """
    if isinstance(text, bool):
        raise InputError(f"model parameters {text!r}: not a number")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = str(text).strip()
        m = re.fullmatch(r"([0-9][0-9_,]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)", raw)
        if not m:
            raise InputError(f"model parameters {raw!r}: not a count (examples: 2851M, 7e9, 70B, 1.5T)")
        try:
            value = float(m.group(1).replace(",", "").replace("_", "")) * _SUFFIX[m.group(2).lower()]
        except ValueError:
            raise InputError(f"model parameters {raw!r}: not a count (examples: 2851M, 7e9, 70B, 1.5T)") from None
    if not value >= 1 or value > 1e16:
        raise InputError(f"model parameters {text!r}: out of range (1 to 1e16)")
    return int(round(value))
