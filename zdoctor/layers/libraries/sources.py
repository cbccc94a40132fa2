"""Name why a libstdc++ copy won: the LD_LIBRARY_PATH entry, a preload, an RPATH, or an earlier import."""

from __future__ import annotations

import os
import re
from typing import Any

#: Source kinds, most actionable first.
KINDS = ("ld_library_path", "ld_preload", "etc_preload", "interpreter_rpath", "earlier_import", "rpath",
         "runpath", "system", "direct", "unknown")

#: Sources that decide the copy for every library in the process, whoever asked first.
PROCESS_WIDE = ("ld_library_path", "ld_preload", "etc_preload")

_LABEL = re.compile(r"^\[(?P<kind>rpath|runpath) of (?P<obj>.+)\]$")


def _same_file(a: str | None, b: str | None) -> bool:
    """Paths equal as recorded (normalised): sources are named from facts, also when replayed elsewhere."""
    if not a or not b:
        return False
    return os.path.normpath(a) == os.path.normpath(b)


def how_found(via: str, *, dir: str | None, via_object: str | None, path: str,  # noqa: A002 - ld.so's word
              interpreter: str | None, interpreter_rpath: str | None = None) -> dict[str, Any]:
    """A source record from one resolution (static ``via`` words or a live ``[label]``)."""
    m = _LABEL.match(via)
    if m:
        via, via_object = m.group("kind"), m.group("obj")
    v = via.strip("[]")
    if v == "LD_LIBRARY_PATH":
        entry = dir or os.path.dirname(path)
        return {"kind": "ld_library_path", "entry": entry,
                "text": f"found through the LD_LIBRARY_PATH entry {entry}"}
    if v == "LD_PRELOAD":
        return {"kind": "ld_preload", "entry": path, "text": f"forced by LD_PRELOAD ({path})"}
    if v == "/etc/ld.so.preload":
        return {"kind": "etc_preload", "entry": path, "text": f"forced by /etc/ld.so.preload ({path})"}
    if v == "rpath":
        if via_object and (_same_file(via_object, interpreter) or os.path.basename(via_object).startswith("python")):
            rp = f" ({interpreter_rpath})" if interpreter_rpath else ""
            return {"kind": "interpreter_rpath", "entry": dir or os.path.dirname(path), "object": via_object,
                    "text": f"found through the interpreter's DT_RPATH{rp} of {via_object}"}
        return {"kind": "rpath", "entry": dir or os.path.dirname(path), "object": via_object,
                "text": f"found through the DT_RPATH of {via_object}"}
    if v == "runpath":
        return {"kind": "runpath", "entry": dir or os.path.dirname(path), "object": via_object,
                "text": f"found through the DT_RUNPATH of {via_object}"}
    if v in ("ld.so.cache", "default", "cache", "system search path"):
        return {"kind": "system", "entry": os.path.dirname(path),
                "text": "found in the ld.so cache / system library dirs"}
    if v in ("direct path", "path"):
        return {"kind": "direct", "entry": path, "text": f"loaded by its path {path}"}
    if v == "already loaded":
        return {"kind": "earlier_import", "entry": path, "text": "already loaded by the time it was needed"}
    return {"kind": "unknown", "entry": path, "text": f"found via {via}"}


def static_source(served: dict[str, Any], target: str, interpreter: str | None,
                  interpreter_rpath: str | None = None) -> dict[str, Any]:
    """Why the emulated process uses ``served`` (an audit ``Served`` dict) for ``target``."""
    how = how_found(served.get("via") or "?", dir=served.get("dir"), via_object=served.get("via_object"),
                    path=served.get("path") or "", interpreter=interpreter, interpreter_rpath=interpreter_rpath)
    first = served.get("first_target")
    if first and not _same_file(first, target) and how["kind"] not in PROCESS_WIDE:
        return {"kind": "earlier_import", "entry": how.get("entry"), "import": first, "how": how,
                "text": f"already loaded by an earlier import of {first}, which {how['text']}"}
    return how


def live_source(label: str, path: str, needed_by: str | None, required_by: str | None,
                interpreter: str | None, interpreter_rpath: str | None = None) -> dict[str, Any]:
    """Why the real process loaded ``path`` (from the LD_DEBUG trace)."""
    how = how_found(label, dir=os.path.dirname(path), via_object=None, path=path, interpreter=interpreter,
                    interpreter_rpath=interpreter_rpath)
    if needed_by and required_by and not _same_file(needed_by, required_by) and how["kind"] not in PROCESS_WIDE:
        return {"kind": "earlier_import", "entry": how.get("entry"), "import": needed_by, "how": how,
                "text": f"already loaded for {needed_by}, which {how['text']}"}
    return how
