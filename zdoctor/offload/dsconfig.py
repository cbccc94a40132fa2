"""Read a DeepSpeed config file exactly as DeepSpeed does, keeping where every value sits.

``deepspeed.initialize(config="ds.json")`` reads the file with ``hjson.load(open(path, "r"),
object_pairs_hook=dict_raise_error_on_duplicate_keys)`` (runtime/config.py, ``DeepSpeedConfig``): HJSON,
a superset of JSON (comments, optional commas, unquoted keys and strings, ``'''`` strings, a root object
without braces), and a duplicate key anywhere is a hard error. The Hugging Face Trainer and Accelerate
read the same file with the standard ``json.load`` instead (strict JSON; a duplicate key silently keeps
the last value) and hand DeepSpeed the resulting dict.

:func:`parse_text` ports hjson 3.1's decoder rule for rule (same values, same errors at the same places) and
records the span of every key and value; :func:`load_config` adds the file checks and reports whether
strict JSON parsers accept the file too. :func:`nvme_patch` and :func:`apply_config_patch` move offload
to NVMe by editing only the offload blocks of the original text, and write it back carefully.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..atomic import CheckedReplace, replace_checked
from ..errors import InputError

#: Larger files are refused: a ds_config is a few kilobytes.
MAX_BYTES = 16 * 1024 * 1024

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


@dataclass
class DsConfig:
    """A ds_config as DeepSpeed reads it, with the position of every value."""

    path: str
    text: str
    data: dict[str, Any]
    spans: dict[KeyPath, Span] = field(default_factory=dict)
    #: ``json``: strict JSON (every reader agrees); ``hjson``: only DeepSpeed's own reader accepts it.
    syntax: str = "json"
    #: Why strict JSON readers (the HF Trainer, Accelerate: ``json.load``) refuse it: ``line:col: msg``.
    json_error: str | None = None

    def get(self, path: KeyPath, default: Any = None) -> Any:
        cur: Any = self.data
        for part in path:
            try:
                cur = cur[part]
            except (KeyError, IndexError, TypeError):
                return default
        return cur

    def has(self, path: KeyPath) -> bool:
        return path in self.spans

    def pos(self, path: KeyPath) -> tuple[int, int] | None:
        """Line and column of the value at ``path`` (None when the file does not set it)."""
        span = self.spans.get(path)
        return line_col(self.text, span.start) if span else None

    def where(self, path: KeyPath) -> str:
        """``path:line:col`` of the value (the bare path when the file does not set it)."""
        p = self.pos(path)
        return f"{self.path}:{p[0]}:{p[1]}" if p else self.path


def _json_error(text: str) -> str | None:
    """Why a strict JSON reader refuses ``text`` (``line:col: msg``), or None when it accepts it."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{exc.lineno}:{exc.colno}: {exc.msg}"
    except (ValueError, RecursionError) as exc:
        return f"1:1: {exc}"
    return None


def parse_config(text: str, path: str = "<text>") -> DsConfig:
    """Parse ``text`` as DeepSpeed would; any problem is one :class:`InputError` line with a position."""
    try:
        data, spans = parse_text(text)
    except DuplicateKeyError as exc:
        line, col = line_col(text, exc.pos)
        fl, _fc = line_col(text, exc.first)
        where = f" in {dotted(exc.path)}" if exc.path else ""
        raise InputError(f"{path}:{line}:{col}: duplicate key {json.dumps(_key_at(text, exc.pos))}{where} "
                         f"(first at line {fl}); DeepSpeed refuses the file: {exc.msg}") from None
    except ParseError as exc:
        line, col = line_col(text, exc.pos)
        jerr = _json_error(text)
        strict = f"strict JSON readers fail too: line {jerr.replace(':', ' column ', 1)}" if jerr else \
            "strict JSON readers accept it"
        raise InputError(f"{path}:{line}:{col}: malformed config: {exc.msg} (DeepSpeed's HJSON reader; {strict})") \
            from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise InputError(f"{path}:1:1: the config is {kind}, not an object: DeepSpeed needs a JSON object at the top")
    jerr = _json_error(text)
    return DsConfig(path=path, text=text, data=data, spans=spans, syntax="json" if jerr is None else "hjson",
                    json_error=jerr)


def _key_at(text: str, pos: int) -> str:
    """The member name that starts at ``pos`` (quoted or not), for messages."""
    try:
        dec = _Decoder(text)
        return dec.key_name(pos)[0]
    except ParseError:
        return text[pos:pos + 40].split(":")[0].strip()


def read_text(path: str, what: str = "file", cap: int = MAX_BYTES) -> str:
    """The UTF-8 text of ``path``; missing, unreadable, huge, binary or undecodable files are InputErrors,
    and so is anything but a regular file (see :mod:`zdoctor.userfile`)."""
    from ..userfile import read_user_file

    raw = read_user_file(path, what, cap)
    if b"\x00" in raw:
        off = raw.index(b"\x00")
        before = raw[:off].decode("utf-8", "replace")
        line, col = line_col(before, len(before))
        raise InputError(f"{path}:{line}:{col}: not a text file (NUL byte at offset {off})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[:exc.start].decode("utf-8", "replace")
        line, col = line_col(before, len(before))
        raise InputError(f"{path}:{line}:{col}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                         "DeepSpeed and json.load read configs as UTF-8") from None


def load_config(path: str) -> DsConfig:
    """Read and parse the ds_config at ``path`` (see :func:`parse_config`)."""
    return parse_config(read_text(path, "ds_config"), path)


# -- moving offload to NVMe ----------------------------------------------------------------------------

@dataclass
class ConfigPatch:
    """The edited config text and a unified diff against the original."""

    path: str
    old_text: str
    new_text: str
    diff: str
    changed: list[str]


def _indent_unit(text: str) -> str:
    """The indentation step the file uses (two spaces when it cannot tell)."""
    widths = sorted({len(m.group(1)) for m in re.finditer(r"\n([ ]+)\S", text)})
    if "\n\t" in text and not widths:
        return "\t"
    return " " * (widths[0] if widths else 2)


def _line_indent(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    m = re.match(r"[ \t]*", text[start:])
    return m.group(0) if m else ""


def _plain(value: Any) -> Any:
    """Integral floats (``1e8`` read as 100000000.0 by json) rendered as integers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _render(value: dict[str, Any], indent: str, unit: str) -> str:
    body = json.dumps(_plain(value), indent=unit or 2, ensure_ascii=False)
    return body.replace("\n", "\n" + indent)


def _set_member(text: str, cfg_spans: dict[KeyPath, Span], parent: KeyPath, key: str, value: dict[str, Any],
                unit: str) -> str:
    """Replace ``parent.key``'s value in ``text``, or insert the member as the first one of ``parent``."""
    span = cfg_spans.get((*parent, key))
    if span is not None:
        indent = _line_indent(text, span.key if span.key is not None else span.start)
        return text[:span.start] + _render(value, indent, unit) + text[span.end:]
    pspan = cfg_spans.get(parent)
    if pspan is None:
        raise InputError(f"cannot place {dotted((*parent, key))}: {dotted(parent) or 'the root'} is not in the file")
    braces = text[pspan.start:pspan.start + 1] == "{"
    at = pspan.start + 1 if braces else pspan.start
    inner = text[at:pspan.end - 1 if braces else pspan.end]
    empty = not re.sub(r"/\*.*?\*/|(?:#|//)[^\n]*", "", inner, flags=re.S).strip()
    outer = _line_indent(text, pspan.key if pspan.key is not None else pspan.start)
    indent = outer + unit if braces else outer
    member = f"{json.dumps(key)}: {_render(value, indent, unit)}"
    if braces:
        if empty:
            return text[:at] + f"\n{indent}{member}\n{outer}" + text[at:].lstrip(" \t")
        return text[:at] + f"\n{indent}{member}," + ("" if text[at:at + 1].isspace() else " ") + text[at:]
    return text[:at] + f"{member}\n{indent}" + text[at:]


def nvme_patch(cfg: DsConfig, nvme_path: str, block_size: int | None = None,
               params: bool | None = None) -> ConfigPatch:
    """Move ``offload_optimizer`` (and, at stage 3, ``offload_param``) to ``device: nvme`` at ``nvme_path``.

    Only the offload blocks (and ``aio.block_size`` when ``block_size`` is given) are rewritten; every
    other byte of the file, comments included, stays. Settings already in the blocks are kept.
    ``params`` forces whether offload_param moves too (default: at stage 3 only, where it exists).
    """
    text, unit = cfg.text, _indent_unit(cfg.text)
    zero = cfg.get(("zero_optimization",))
    if not isinstance(zero, dict):
        raise InputError(f"{cfg.path}: no zero_optimization block: offloading needs ZeRO (stage 1-3 for the "
                         "optimizer, 3 for parameters); choose a stage first")
    if params is None:
        params = zero.get("stage") == 3
    changed: list[str] = []
    for key in ["offload_optimizer"] + (["offload_param"] if params else []):
        cur = parse_config(text, cfg.path)  # fresh spans after every edit
        old = cur.get(("zero_optimization", key))
        kept = {k: v for k, v in old.items() if v != "auto" and k not in ("device", "nvme_path")} \
            if isinstance(old, dict) else {}
        block = {"device": "nvme", "nvme_path": nvme_path, **kept}
        text = _set_member(text, cur.spans, ("zero_optimization",), key, block, unit)
        changed.append(f"zero_optimization.{key}")
    if block_size is not None:
        cur = parse_config(text, cfg.path)
        aio = cur.get(("aio",))
        block = dict(aio) if isinstance(aio, dict) else {}
        block["block_size"] = int(block_size)
        text = _set_member(text, cur.spans, (), "aio", block, unit)
        changed.append("aio.block_size")
    check = parse_config(text, cfg.path)  # the edit must read back as a valid config
    for key in ("offload_optimizer",) + (("offload_param",) if params else ()):
        if check.get(("zero_optimization", key, "device")) != "nvme":
            raise InputError(f"{cfg.path}: the patched config does not read back with {key}.device nvme")
    diff = "".join(difflib.unified_diff(cfg.text.splitlines(keepends=True), text.splitlines(keepends=True),
                                        fromfile=f"{cfg.path} (now)", tofile=f"{cfg.path} (patched)"))
    return ConfigPatch(path=cfg.path, old_text=cfg.text, new_text=text, diff=diff, changed=changed)


def apply_config_patch(path: str, new_text: str,
                       validate: Callable[[DsConfig], None] | None = None) -> dict[str, Any]:
    """Replace the ds_config at ``path`` with ``new_text``, carefully (through
    :class:`zdoctor.atomic.CheckedReplace`).

    The new text must parse as a DeepSpeed config before anything is touched. A symbolic link or a
    file that is not regular is refused; the old bytes are kept as ``path.bak`` (``.bak-2``... when
    taken, never overwritten), the new text is written beside the file with its mode (and owner, as
    root) and renamed into place, then read back through :func:`load_config` and ``validate`` (a
    callable raising on a bad config). If that fails the original bytes are put back the same way.
    Returns what was done: {path, backup, written, validated, rolled_back, error}.
    """
    out: dict[str, Any] = {"path": path, "backup": None, "written": False, "validated": False,
                           "rolled_back": False, "error": None}
    parse_config(new_text, path)  # refuse a broken edit before touching anything
    new = new_text.encode("utf-8")
    rep = CheckedReplace.stage(path, new, what="ds_config")
    original = rep.original
    out["backup"] = rep.commit(f"{path}.bak")
    out["written"] = True
    try:
        back = load_config(path)
        if back.text != new_text:
            raise InputError(f"{path}: reads back different from what was written")
        if validate is not None:
            validate(back)
        out["validated"] = True
    except Exception as exc:  # noqa: BLE001 - any failed validation rolls back
        out["error"] = str(exc) or type(exc).__name__
        try:
            replace_checked(path, original, expect=new, backup=None, what="ds_config")
            out["rolled_back"] = True
        except InputError as rexc:
            out["error"] += f"; rolling back failed ({rexc}): the original is in {out['backup']}"
    return out


__all__ = ["MAX_BYTES", "ConfigPatch", "DsConfig", "DuplicateKeyError", "ParseError", "Span", "apply_config_patch",
           "dotted", "line_col", "load_config", "nvme_patch", "parse_config", "parse_text", "read_text"]
