"""An HJSON reader that reads a DeepSpeed config exactly as DeepSpeed does, keeping where every value sits.

``deepspeed.initialize(config="ds.json")`` reads the file with ``hjson.load(open(path, "r"),
object_pairs_hook=dict_raise_error_on_duplicate_keys)`` (runtime/config.py, ``DeepSpeedConfig``): HJSON,
a superset of JSON (comments, optional commas, unquoted keys and strings, ``'''`` strings, a root object
without braces), and a duplicate key anywhere is a hard error.

:func:`parse_text` ports hjson 3.1's decoder rule for rule (same values, same errors at the same places) and
records the span of every key and value.
"""

from __future__ import annotations

import json
import re
import typing
from collections import Counter
from dataclasses import dataclass
from typing import Any

KeyPath = typing.Tuple[typing.Union[str, int], ...]

_WHITESPACE = " \t\n\r"
_PUNCTUATOR = "{}[],:"
_NUMBER_RE = re.compile(r"[\t ]*(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?[\t ]*")
_STRINGCHUNK = re.compile(r"(.*?)(['\"\\\x00-\x1f])", re.VERBOSE | re.MULTILINE | re.DOTALL)
_BACKSLASH = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class ParseError(ValueError):
    """A syntax error at character offset ``pos`` of the text."""

    def __init__(self, msg: str, pos: int):
        super().__init__(msg)
        self.msg = msg
        self.pos = pos


class DuplicateKeyError(ParseError):
    """An object repeats a key: DeepSpeed's ``dict_raise_error_on_duplicate_keys`` refuses the file."""

    def __init__(self, keys: list[str], pos: int, first: int, path: KeyPath):
        super().__init__(f"Duplicate keys in DeepSpeed config: {keys}", pos)
        self.keys = keys
        self.first = first
        self.path = path


@dataclass(frozen=True)
class Span:
    """Character offsets of one member: its key (None for array items and the root) and its value."""

    key: int | None
    start: int
    end: int


def dotted(path: KeyPath) -> str:
    """``("zero_optimization", "offload_param", "device")`` -> ``zero_optimization.offload_param.device``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def line_col(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column of offset ``pos``, counted like Python's json module."""
    line = text.count("\n", 0, pos) + 1
    return line, pos - text.rfind("\n", 0, pos)


class _NotPlainJson(ValueError):
    """An array the strict JSON reader would read differently from DeepSpeed's HJSON reader."""


def _hjson_float(text: str) -> Any:
    """A JSON fraction as hjson returns it: an integral value below 1e10 becomes an int."""
    res = float(text)
    if res != res or res in (float("inf"), float("-inf")):
        raise _NotPlainJson(text)
    return int(res) if int(res) == res and abs(res) < 1e10 else res


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _v in pairs}) != len(pairs):
        raise _NotPlainJson("duplicate key")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise _NotPlainJson(name)


#: Reads a strict-JSON array at C speed, the values as DeepSpeed's HJSON reader gives them; anything
#: where the two could differ (duplicate keys, NaN, comments, trailing commas) falls back to :class:`_Decoder`.
_FAST_ARRAY = json.JSONDecoder(parse_float=_hjson_float, parse_constant=_no_constant,
                               object_pairs_hook=_no_duplicates)


class _Decoder:
    """hjson 3.1's decoder (hjson/decoder.py), with the span of every value recorded by key path."""

    def __init__(self, s: str):
        self.s = s
        self.spans: dict[KeyPath, Span] = {}

    # -- helpers -------------------------------------------------------------------------------------
    def next(self, end: int) -> tuple[str, int]:
        """Skip whitespace and comments (``#``, ``//``, ``/* */``); the next character and its offset."""
        s = self.s
        while True:
            ch = s[end:end + 1]
            while ch in _WHITESPACE:
                if ch == "":
                    return ch, end
                end += 1
                ch = s[end:end + 1]
            ch2 = s[end + 1:end + 2]
            if ch == "#" or ch == "/" and ch2 == "/":
                end = self.eol(end)
            elif ch == "/" and ch2 == "*":
                close = s.find("*/", end + 2)
                if close < 0:  # hjson itself dies here with IndexError: string index out of range
                    raise ParseError("Unterminated /* comment", end)
                end = close + 2
            else:
                return ch, end

    def eol(self, end: int) -> int:
        while True:
            ch = self.s[end:end + 1]
            if ch in ("\r", "\n", ""):
                return end
            end += 1

    def skip_indent(self, end: int, n: int) -> int:
        s = self.s
        ch = s[end:end + 1]
        while ch != "" and ch in " \t\r" and n != 0:
            end += 1
            n -= 1
            ch = s[end:end + 1]
        return end

    # -- scalars -------------------------------------------------------------------------------------
    def string(self, end: int) -> tuple[str, int]:
        """A quoted string; ``end`` is just past the opening quote (``"`` or ``'``)."""
        s = self.s
        chunks: list[str] = []
        begin = end - 1
        exit_ch = s[begin]
        while True:
            chunk = _STRINGCHUNK.match(s, end)
            if chunk is None:
                raise ParseError("Unterminated string starting at", begin)
            end = chunk.end()
            content, terminator = chunk.groups()
            if content:
                chunks.append(content)
            if terminator == exit_ch:
                break
            if terminator in ('"', "'"):
                chunks.append(terminator)
                continue
            if terminator != "\\":
                raise ParseError(f"Invalid control character {terminator!r} at", end)
            try:
                esc = s[end]
            except IndexError:
                raise ParseError("Unterminated string starting at", begin) from None
            if esc != "u":
                if esc not in _BACKSLASH:
                    raise ParseError(f"Invalid \\X escape sequence {esc!r}", end)
                char = _BACKSLASH[esc]
                end += 1
            else:
                msg = "Invalid \\uXXXX escape sequence"
                esc = s[end + 1:end + 5]
                if len(esc) != 4 or esc[1:2] in ("x", "X"):
                    raise ParseError(msg, end - 1)
                try:
                    uni = int(esc, 16)
                except ValueError:
                    raise ParseError(msg, end - 1) from None
                end += 5
                if uni & 0xFC00 == 0xD800 and s[end:end + 2] == "\\u":
                    esc2 = s[end + 2:end + 6]
                    if len(esc2) == 4 and esc2[1:2] not in ("x", "X"):
                        try:
                            uni2 = int(esc2, 16)
                        except ValueError:
                            raise ParseError(msg, end) from None
                        if uni2 & 0xFC00 == 0xDC00:
                            uni = 0x10000 + (((uni - 0xD800) << 10) | (uni2 - 0xDC00))
                            end += 6
                char = chr(uni)
            chunks.append(char)
        return "".join(chunks), end

    def mlstring(self, end: int) -> tuple[str, int]:
        """A ``'''`` multiline string starting at ``end``; indentation of its first line is removed."""
        s = self.s
        string = ""
        triple = 0
        indent = 0
        while end - indent - 1 >= 0 and s[end - indent - 1] != "\n":
            indent += 1
        end = self.skip_indent(end + 3, -1)
        if s[end:end + 1] == "\n":
            end = self.skip_indent(end + 1, indent)
        while True:
            ch = s[end:end + 1]
            if ch == "":
                raise ParseError("Bad multiline string", end)
            if ch == "'":
                triple += 1
                end += 1
                if triple == 3:
                    if string and string[-1] == "\n":
                        string = string[:-1]
                    return string, end
                continue
            while triple > 0:
                string += "'"
                triple -= 1
            if ch == "\n":
                string += ch
                end = self.skip_indent(end + 1, indent)
            else:
                if ch != "\r":
                    string += ch
                end += 1

    def tfnns(self, end: int) -> tuple[Any, int]:
        """true/false/null, a number, or a quoteless string running to the end of the line."""
        s = self.s
        chf, begin = self.next(end)
        end = begin
        if chf in _PUNCTUATOR:  # also true for "" (end of input), as in hjson
            raise ParseError("Found a punctuator character when expecting a quoteless string "
                             "(check your syntax)", end)
        while True:
            ch = s[end:end + 1]
            is_eol = ch in ("\r", "\n", "")
            if (is_eol or ch in (",", "}", "]", "#")
                    or ch == "/" and s[end + 1:end + 2] in ("/", "*")):
                word = s[begin:end].strip()
                if chf == "n" and word == "null":
                    return None, end
                if chf == "t" and word == "true":
                    return True, end
                if chf == "f" and word == "false":
                    return False, end
                m = _NUMBER_RE.match(s, begin) if chf == "-" or "0" <= chf <= "9" else None
                if m is not None and m.end() == end:
                    integer, frac, exp = m.groups()
                    if frac or exp:
                        res: Any = float(integer + (frac or "") + (exp or ""))
                        try:
                            if int(res) == res and abs(res) < 1e10:
                                res = int(res)
                        except (OverflowError, ValueError):  # hjson dies here with OverflowError
                            raise ParseError(f"number {word} is out of range", begin) from None
                    else:
                        try:
                            res = int(integer)
                        except ValueError:  # past the interpreter's digit limit (4300 by default)
                            raise ParseError(f"integer of {len(integer)} digits is too long to read", begin) \
                                from None
                    return res, end
                if is_eol:
                    return s[begin:end].strip(), end
            end += 1

    def key_name(self, end: int) -> tuple[str, int, int]:
        """A member name, quoted or not: (name, offset after it, offset where it starts)."""
        s = self.s
        ch, end = self.next(end)
        if ch in ('"', "'"):
            name, after = self.string(end + 1)
            return name, after, end
        begin = end
        space = -1
        while True:
            ch = s[end:end + 1]
            if ch == "":
                raise ParseError("Bad key name (eof)", end)
            if ch == ":":
                if begin == end:
                    raise ParseError("Found ':' but no key name (for an empty key name use quotes)", begin)
                if space >= 0:
                    if space != end - 1:
                        raise ParseError("Found whitespace in your key name (use quotes to include)", space)
                    return s[begin:end].rstrip(), end, begin
                return s[begin:end], end, begin
            if ch in _WHITESPACE:
                if space < 0 or space == end - 1:
                    space = end
            elif ch in "{}[],":
                raise ParseError(f"Found '{ch}' where a key name was expected (check your syntax or use quotes "
                                 "if the key name includes {}[],: or whitespace)", begin)
            end += 1

    # -- containers ----------------------------------------------------------------------------------
    def value(self, idx: int, path: KeyPath, key_pos: int | None, record: bool = True) -> tuple[Any, int]:
        """The value at ``idx``; its span is kept when ``record`` (never inside an array: a position
        kept per element made a 14 MB array cost gigabytes)."""
        s = self.s
        if idx < 0 or idx >= len(s):
            raise ParseError("Expecting value", idx)
        ch = s[idx]
        if ch in ('"', "'"):
            if s[idx:idx + 3] == "'''":
                val, end = self.mlstring(idx)
            else:
                val, end = self.string(idx + 1)
        elif ch == "{":
            val, end = self.obj(idx + 1, path, braces=True, record=record)
        elif ch == "[":
            try:  # members of arrays have no recorded span: the C reader can take a strict-JSON array whole
                val, end = _FAST_ARRAY.raw_decode(s, idx)
            except (ValueError, RecursionError):
                val, end = self.array(idx + 1, path)
        else:
            val, end = self.tfnns(idx)
        if record:
            self.spans[path] = Span(key_pos, idx, end)
        return val, end

    def obj(self, end: int, path: KeyPath, braces: bool, record: bool = True) -> tuple[dict[str, Any], int]:
        pairs: list[tuple[str, Any, int]] = []
        ch, end = self.next(end)
        if braces and ch == "}":
            return {}, end + 1
        while True:
            key, end, key_pos = self.key_name(end)
            ch, end = self.next(end)
            if ch != ":":
                raise ParseError("Expecting ':' delimiter", end)
            ch, end = self.next(end + 1)
            val, end = self.value(end, (*path, key), key_pos, record)
            pairs.append((key, val, key_pos))
            ch, end = self.next(end)
            if ch == ",":
                ch, end = self.next(end + 1)
            if not braces:
                if ch == "":
                    break
            elif ch == "}":
                end += 1
                break
            ch, end = self.next(end)
        counts = Counter(k for k, _v, _p in pairs)
        dups = [k for k, n in counts.items() if n > 1]
        if dups:
            seen: dict[str, int] = {}
            for k, _v, p in pairs:
                if k in seen:
                    raise DuplicateKeyError(dups, p, seen[k], path)
                seen[k] = p
        return {k: v for k, v, _p in pairs}, end

    def array(self, end: int, path: KeyPath) -> tuple[list[Any], int]:
        values: list[Any] = []
        ch, end = self.next(end)
        if ch == "]":
            return values, end + 1
        if ch == "":
            raise ParseError("End of input while parsing an array (did you forget a closing ']'?)", end)
        while True:
            val, end = self.value(end, (*path, len(values)), None, record=False)
            values.append(val)
            ch, end = self.next(end)
            if ch == ",":
                ch, end = self.next(end + 1)
            if ch == "]":
                return values, end + 1
            ch, end = self.next(end)

    def decode(self) -> Any:
        s = self.s
        idx = 1 if s[:1] == "\ufeff" else 0
        start = idx
        ch, idx = self.next(idx)
        if start == 0 and ch == "":
            return {}
        if ch in ("{", "["):
            obj, end = self.value(idx, (), None)
        else:
            try:
                obj, end = self.obj(idx, (), braces=False)
                self.spans[()] = Span(None, idx, end)
            except DuplicateKeyError:
                raise
            except ParseError as first:
                try:
                    obj, end = self.value(idx, (), None)
                except Exception:  # noqa: BLE001 - hjson re-raises the first error, whatever the second was
                    raise first from None
        ch, end = self.next(end)
        if end != len(s):
            raise ParseError("Extra data", end)
        return obj


def parse_text(text: str) -> tuple[Any, dict[KeyPath, Span]]:
    """Decode HJSON ``text`` as DeepSpeed's reader does: (value, spans by key path).

    Raises :class:`ParseError` (offset ``pos``) or :class:`DuplicateKeyError`.
    """
    dec = _Decoder(text)
    return dec.decode(), dec.spans


def key_at(text: str, pos: int) -> str:
    """The member name that starts at ``pos`` (quoted or not), for messages."""
    try:
        dec = _Decoder(text)
        return dec.key_name(pos)[0]
    except ParseError:
        return text[pos:pos + 40].split(":")[0].strip()
