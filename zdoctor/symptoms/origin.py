"""Where a seen line comes from: the message sites of an :class:`~.origin_index.EnvIndex` whose template
matches it, found through a word index (one dictionary look-up per word of the line, never a scan).

A template's wildcards match any text; it matches a line when its literal text appears there in order.
The sites whose templates match the most literal text win; ties are all given (a few at most).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from zdoctor.symptoms.origin_index import EnvIndex
from zdoctor.symptoms.origin_templates import MIN_LITERAL, Template, literal_chars

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
#: At most this many sites are named for one line.
MAX_ORIGINS = 3
#: Words that key too many templates to narrow anything.
COMMON = frozenset({"error", "with", "that", "this", "from", "should", "must", "have", "cannot", "does",
                    "expected", "value", "found", "failed", "invalid", "were", "when", "which", "only", "than",
                    "none", "true", "false", "type", "supported", "tensor"})


def segments(t: Template) -> list[Template]:
    """The template's lines, each without wildcards at its ends (a seen line holds one line of a message)."""
    out: list[Template] = []
    cur: Template = []
    for p in t:
        if p is None:
            cur.append(None)
            continue
        pieces = p.split("\n")
        for i, piece in enumerate(pieces):
            if i:
                out.append(cur)
                cur = []
            if piece:
                cur.append(piece)
    out.append(cur)
    trimmed = []
    for seg in out:
        while seg and (seg[0] is None or not str(seg[0]).strip()):
            seg = seg[1:]
        while seg and (seg[-1] is None or not str(seg[-1]).strip()):
            seg = seg[:-1]
        if literal_chars(seg) >= MIN_LITERAL:
            trimmed.append(seg)
    return trimmed


def key_word(seg: Template) -> str | None:
    """The longest uncommon whole word of the segment's literal text (a word touching a wildcard is not
    whole: the value may extend it)."""
    best = ""
    for i, p in enumerate(seg):
        if p is None:
            continue
        for m in WORD.finditer(p):
            if m.start() == 0 and i > 0 and seg[i - 1] is None:
                continue
            if m.end() == len(p) and i + 1 < len(seg) and seg[i + 1] is None:
                continue
            w = m.group().lower()
            if w not in COMMON and len(w) > len(best):
                best = w
    return best or None


def pattern(seg: Template) -> re.Pattern[str]:
    """The regular expression of a segment: literals with any run of spaces, wildcards as any text."""
    out = []
    for p in seg:
        if p is None:
            out.append(".*?")
        else:
            out.append(r"\s+".join(re.escape(w) for w in p.strip(" ").split(" ")) if p.strip(" ") else r"\s*")
    return re.compile("".join(out))


def shown(t: Template) -> str:
    """A template as text, ``{…}`` where a value goes."""
    return "".join("{…}" if p is None else p for p in t)


@dataclass
class _Entry:
    seg: Template
    literal: int
    site: dict[str, Any]
    package: str
    version: str
    site_dir: str
    library: bool
    compiled: re.Pattern[str] | None = None


class OriginIndex:
    """Every segment of every template of an environment, keyed by its key word."""

    def __init__(self, env: EnvIndex):
        self.by_word: dict[str, list[_Entry]] = {}
        for site_dir, pkg in env.packages.values():
            for rows, library in ((pkg.sites, False), (pkg.strings, True)):
                for site in rows:
                    for seg in segments(site.get("template") or []):
                        word = key_word(seg)
                        if word:
                            self.by_word.setdefault(word, []).append(
                                _Entry(seg, literal_chars(seg), site, pkg.name, pkg.version, site_dir, library))

    def find(self, line: str) -> list[dict[str, Any]]:
        """The sites whose template matches ``line`` best (none when no template does)."""
        text = " ".join(line.split())
        seen: set[int] = set()
        best: list[_Entry] = []
        for w in dict.fromkeys(m.group().lower() for m in WORD.finditer(text)):
            for e in self.by_word.get(w, ()):
                if id(e) in seen:
                    continue
                seen.add(id(e))
                if best and e.literal < best[0].literal:
                    continue
                if e.compiled is None:
                    e.compiled = pattern(e.seg)
                if not e.compiled.search(text):
                    continue
                if best and e.literal > best[0].literal:
                    best = []
                best.append(e)
        return [_describe(e) for e in best[:MAX_ORIGINS]]


def _describe(e: _Entry) -> dict[str, Any]:
    rel = str(e.site.get("file") or "")
    out: dict[str, Any] = {"file": rel, "path": os.path.join(e.site_dir, rel), "package": e.package,
                           "version": e.version, "template": shown(e.seg)}
    if e.library:
        soname = os.path.basename(rel)
        out.update({"in": "library", "offset": e.site.get("offset"), "kind": "format string",
                    "library_version": soname.split(".so.", 1)[1] if ".so." in soname else ""})
    else:
        reads = e.site.get("reads") or {}
        out.update({"in": "python", "line": e.site.get("line"), "kind": e.site.get("kind"),
                    "guard": e.site.get("guard") or "",
                    "reads": {k: list(reads.get(k) or []) for k in ("config", "env", "attrs")}})
    return out


def located(o: dict[str, Any]) -> str:
    """One origin in words: ``raised at deepspeed/runtime/config.py:596 when `train_batch > 0` fails``."""
    if o.get("in") == "library":
        ver = o.get("library_version") or o.get("version") or "version unknown"
        return f"format string in {o.get('file')} ({ver}) at .rodata offset {o.get('offset')}"
    kind = str(o.get("kind") or "")
    where = f"{o.get('file')}:{o.get('line')}"
    guard = str(o.get("guard") or "")
    pkg = f" ({o.get('package')} {o.get('version')})" if o.get("version") else ""
    if kind == "assert":
        return f"asserted at {where}{pkg}: fails when `{guard}` is false"
    verb = "logged" if kind.startswith("logger.") else "raised"
    what = kind.split(" ", 1)[1] if kind.startswith("raise ") else kind
    return f"{verb} ({what}) at {where}{pkg}" + (f" when `{guard}`" if guard else "")
