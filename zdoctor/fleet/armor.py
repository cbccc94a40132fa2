"""The snapshot's transport encoding: gzip + base64 between marker lines.

Launchers mangle long lines (pdsh splits them and prefixes every piece with the host) and login
shells may print banners around the output; an armored snapshot survives both and is several times
smaller than its JSON. :func:`decode` finds the last complete block in whatever came back.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from typing import Any

BEGIN = "-----BEGIN ZDOCTOR SNAPSHOT-----"
END = "-----END ZDOCTOR SNAPSHOT-----"
WIDTH = 76
#: Largest snapshot accepted after decompression (a hostile node must not exhaust memory).
MAX_JSON = 256 * 1024 * 1024


class ArmorError(ValueError):
    """The output holds no complete, valid armored snapshot."""


def encode(document: dict[str, Any]) -> str:
    """``document`` as armored text, ending in a newline."""
    raw = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    b64 = base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")
    lines = [b64[i:i + WIDTH] for i in range(0, len(b64), WIDTH)]
    return "\n".join([BEGIN, *lines, END]) + "\n"


def decode(lines: list[str]) -> dict[str, Any]:
    """The document in the last complete armored block among ``lines`` (already stripped of any prefix)."""
    end = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == END), None)
    if end is None:
        raise ArmorError("no snapshot in the output" if not any(ln.strip() == BEGIN for ln in lines)
                         else "the snapshot was cut off before its end marker")
    begin = next((i for i in range(end - 1, -1, -1) if lines[i].strip() == BEGIN), None)
    if begin is None:
        raise ArmorError("snapshot end marker without a begin marker")
    body = "".join(ln.strip() for ln in lines[begin + 1:end])
    try:
        packed = base64.b64decode(body, validate=True)
        inflater = zlib.decompressobj(wbits=31)
        raw = inflater.decompress(packed, MAX_JSON)
        if inflater.unconsumed_tail:
            raise ArmorError(f"snapshot larger than {MAX_JSON // 2**20} MiB when unpacked")
        doc = json.loads(raw.decode("utf-8"))
    except (binascii.Error, zlib.error, EOFError, UnicodeDecodeError) as exc:
        raise ArmorError(f"the snapshot is corrupt ({type(exc).__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise ArmorError(f"the snapshot is not valid JSON ({exc.msg} at {exc.lineno}:{exc.colno})") from None
    if not isinstance(doc, dict):
        raise ArmorError("the snapshot is not a JSON object")
    return doc
