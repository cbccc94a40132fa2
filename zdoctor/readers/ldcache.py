"""Read ``/etc/ld.so.cache`` (old, compat and new formats) and look names up the way ld.so does.

Layouts follow glibc's ``dl-cache.h``:

- old: ``"ld.so-1.7.0"``, ``uint32 nlibs`` at 12, then 12-byte entries ``{int32 flags; uint32 key,
  value}``; string offsets are relative to the end of the entry table.
- new: a 48-byte header (``"glibc-ld.so.cache1.1"``, ``nlibs`` at 20, ``len_strings`` at 24, an
  endianness byte at 28, ``extension_offset`` at 32), then 24-byte entries ``{int32 flags; uint32 key,
  value, osversion; uint64 hwcap}``; string offsets are relative to the new header.
- compat: the old table, then the new header at the next 8-byte boundary (ld.so reads the new part).

The extension directory and the glibc-hwcaps name offsets are relative to the start of the file (as
ld.so and ``ldconfig -p`` read them); in a compat file that makes the hwcaps names unusable, exactly as
it does for ld.so.
"""

from __future__ import annotations

import errno
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from zdoctor.core.errors import InputError
from zdoctor.proc.userfile import open_regular

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
OLD_HEADER = 16
OLD_ENTRY = 12
NEW_HEADER = 48
NEW_ENTRY = 24
EXTENSION_MAGIC = 0xEAA42174
EXT_TAG_GENERATOR = 0
EXT_TAG_GLIBC_HWCAPS = 1
#: ``hwcap`` bit 62 marks an entry from a ``glibc-hwcaps/<name>/`` subdirectory.
HWCAP_EXTENSION = 1 << 62
#: x86_64's ``_DL_CACHE_DEFAULT_ID``: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64.
X86_64_FLAGS = 0x0303
FLAG_ELF_LIBC6 = 0x0003
#: Refuse absurd entry counts before allocating anything.
MAX_ENTRIES = 1 << 22

_TYPES = {0x00: "libc4", 0x01: "ELF", 0x02: "libc5", 0x03: "libc6"}
_ARCHES = {
    0x0000: "", 0x0100: ",64bit", 0x0200: ",IA-64", 0x0300: ",x86-64", 0x0400: ",64bit",
    0x0500: ",64bit", 0x0600: ",N32", 0x0700: ",64bit", 0x0800: ",x32", 0x0900: ",hard-float",
    0x0A00: ",AArch64", 0x0B00: ",soft-float", 0x0C00: ",nan2008", 0x0D00: ",N32,nan2008",
    0x0E00: ",64bit,nan2008", 0x0F00: ",soft-float", 0x1000: ",double-float",
}


@dataclass(frozen=True)
class CacheEntry:
    """One cache entry: the SONAME key, ldconfig's flags, the hwcap word and the library path."""

    soname: str
    flags: int
    hwcap: int
    path: str
    #: The glibc-hwcaps subdirectory name of an extension entry (``x86-64-v3``), else None.
    hwcap_name: str | None = None

    @property
    def is_hwcaps(self) -> bool:
        """Whether this entry comes from a ``glibc-hwcaps/<name>/`` subdirectory."""
        return bool(self.hwcap & HWCAP_EXTENSION)

    def ldconfig_line(self) -> str:
        """The line ``ldconfig -p`` prints for this entry (without the leading tab)."""
        kind = _TYPES.get(self.flags & 0xFF, "unknown")
        req = self.flags & 0xFF00
        arch = _ARCHES.get(req, f",{req}")
        if self.hwcap_name is not None:
            extra = f', hwcap: "{self.hwcap_name}"'
        elif self.hwcap:
            extra = f", hwcap: {self.hwcap:#018x}"
        else:
            extra = ""
        return f"{self.soname} ({kind}{arch}{extra}) => {self.path}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CacheEntry:
        return cls(**d)


def _cstr(data: bytes, off: int, what: str) -> str:
    if off < 0 or off >= len(data):
        raise InputError(f"ld.so.cache: {what} string offset {off} lies outside the file ({len(data)} bytes)")
    end = data.find(b"\0", off)
    if end < 0:
        raise InputError(f"ld.so.cache: unterminated {what} string at offset {off}")
    return data[off:end].decode("utf-8", "surrogateescape")


def _u32(data: bytes, off: int, what: str) -> int:
    if off < 0 or off + 4 > len(data):
        raise InputError(f"ld.so.cache: truncated ({what} at offset {off}, file has {len(data)} bytes)")
    return int(struct.unpack_from("<I", data, off)[0])


def _hwcaps_names(data: bytes, ext_off: int) -> list[str | None]:
    """The glibc-hwcaps subdirectory names from the extension directory (empty when absent)."""
    if ext_off == 0:
        return []
    if ext_off + 8 > len(data):
        raise InputError(f"ld.so.cache: extension directory at offset {ext_off} lies past the end "
                         f"of the file ({len(data)} bytes; truncated?)")
    if _u32(data, ext_off, "extension") != EXTENSION_MAGIC:
        return []  # ld.so ignores a directory without its magic
    count = _u32(data, ext_off + 4, "extension count")
    if count > 64 or ext_off + 8 + 16 * count > len(data):
        raise InputError(f"ld.so.cache: extension directory at offset {ext_off} is truncated")
    names: list[str | None] = []
    for i in range(count):
        tag, _flags, off, size = struct.unpack_from("<IIII", data, ext_off + 8 + 16 * i)
        if off + size > len(data):
            raise InputError(f"ld.so.cache: extension section {tag} at offset {off} is truncated")
        if tag != EXT_TAG_GLIBC_HWCAPS:
            continue
        if size % 4:
            raise InputError(f"ld.so.cache: glibc-hwcaps section at offset {off} has a partial entry")
        for (str_off,) in struct.iter_unpack("<I", data[off:off + size]):
            # Offsets are taken relative to the file start, as ld.so does; a name that does not
            # decode (the compat format) can never match an active subdirectory.
            try:
                names.append(_cstr(data, str_off, "hwcaps"))
            except InputError:
                names.append(None)
    return names


def parse_ld_so_cache(data: bytes) -> list[CacheEntry]:
    """Every entry of an ld.so.cache image, in file (= lookup) order.

    Raises :class:`InputError` with a one-line message for a truncated, foreign or garbage image.
    """
    if data.startswith(OLD_MAGIC):
        if len(data) < OLD_HEADER:
            raise InputError("ld.so.cache: truncated old-format header")
        nlibs = _u32(data, 12, "entry count")
        end = OLD_HEADER + OLD_ENTRY * nlibs
        if nlibs > MAX_ENTRIES or end > len(data):
            raise InputError(f"ld.so.cache: {nlibs} old-format entries do not fit in {len(data)} bytes")
        base = (end + 7) & ~7
        if not data.startswith(NEW_MAGIC, base):  # old format only
            out = []
            for flags, key, value in struct.iter_unpack("<iII", data[OLD_HEADER:end]):
                out.append(CacheEntry(_cstr(data, end + key, "name"), flags, 0, _cstr(data, end + value, "path")))
            return out
    elif data.startswith(NEW_MAGIC):
        base = 0
    elif not data:
        raise InputError("ld.so.cache: empty file")
    else:
        raise InputError("ld.so.cache: not an ld.so.cache file (unknown magic)")
    if base + NEW_HEADER > len(data):
        raise InputError("ld.so.cache: truncated new-format header")
    nlibs = _u32(data, base + 20, "entry count")
    endian = data[base + 28]
    if endian == 3:
        raise InputError("ld.so.cache: big-endian cache; this reader handles little-endian files only")
    if endian not in (0, 2):
        raise InputError(f"ld.so.cache: invalid endianness byte {endian}")
    table = base + NEW_HEADER
    if nlibs > MAX_ENTRIES or table + NEW_ENTRY * nlibs > len(data):
        raise InputError(f"ld.so.cache: {nlibs} entries do not fit in {len(data)} bytes")
    names = _hwcaps_names(data, _u32(data, base + 32, "extension offset"))
    out = []
    for i in range(nlibs):
        flags, key, value, _osv, hwcap = struct.unpack_from("<iIIIQ", data, table + NEW_ENTRY * i)
        hwcap_name = None
        if hwcap & HWCAP_EXTENSION:
            index = hwcap & 0xFFFFFFFF
            hwcap_name = names[index] if index < len(names) else None
        out.append(CacheEntry(_cstr(data, base + key, "name"), flags, hwcap,
                              _cstr(data, base + value, "path"), hwcap_name))
    return out


def _strip_prefix(text: str, prefix: str) -> str:
    return text[len(prefix):] if text.startswith(prefix) else text


def read_ld_so_cache(path: str = "/etc/ld.so.cache") -> list[CacheEntry]:
    """Parse the cache file at ``path``; a missing file is an empty cache, an unreadable one an error."""
    try:
        with open_regular(path) as fh:
            data = fh.read()
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return []
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return parse_ld_so_cache(data)
    except InputError as exc:
        raise InputError(f"{path}: {_strip_prefix(str(exc), 'ld.so.cache: ')}") from None


_DIGITS = re.compile(r"\d+")


def libcmp_key(name: str) -> str:
    """A key under which two names are equal exactly when ``_dl_cache_libcmp`` calls them equal."""
    return _DIGITS.sub(lambda m: str(int(m.group())), name) if any(c.isdigit() for c in name) else name


def _flags_ok(flags: int, x86_64: bool) -> bool:
    return flags == X86_64_FLAGS if x86_64 else flags in (1, FLAG_ELF_LIBC6)


def lookup(entries: Iterable[CacheEntry], soname: str, *, x86_64: bool = True,
           skip_dirs: Sequence[str] = (), active_hwcaps: Sequence[str] | None = None) -> CacheEntry | None:
    """The entry ld.so's ``search_cache`` picks for ``soname``, or None.

    Entries must be in file order. glibc-hwcaps entries count only when their subdirectory is in
    ``active_hwcaps`` (best first); the best-ranked one wins over plain entries. Plain entries with a
    legacy hwcap word are skipped (glibc >= 2.37 behaviour). ``skip_dirs`` models ``DF_1_NODEFLIB``:
    when the chosen path lies under one of these directories, the cache yields nothing.
    """
    key = libcmp_key(soname)
    rank = {name: i for i, name in enumerate(active_hwcaps or ())}
    best: CacheEntry | None = None
    best_rank = len(rank)
    for e in entries:
        if e.soname != soname and libcmp_key(e.soname) != key:
            continue
        if not _flags_ok(e.flags, x86_64):
            continue
        if e.is_hwcaps:
            r = rank.get(e.hwcap_name or "")
            if r is None or (best is not None and r >= best_rank):
                continue
            best, best_rank = e, r
            continue
        if best is not None:  # hwcaps entries come first; a usable one beats any plain entry
            break
        if e.hwcap:
            continue
        best = e
        if not x86_64 and e.flags != FLAG_ELF_LIBC6:
            continue  # an acceptable but non-default entry: a better one may follow
        break
    if best is not None and skip_dirs:
        for d in skip_dirs:
            prefix = d if d.endswith("/") else d + "/"
            if best.path.startswith(prefix):
                return None
    return best


def runtime_soname(entries: Iterable[CacheEntry], name: str, *, x86_64: bool = True) -> str | None:
    """The soname ``ctypes.util.find_library(name)`` takes from ``ldconfig -p``: the first entry of this
    architecture named ``lib<name>.<something>`` (``libaio.so.1``), read from the cache itself, so no
    ``ldconfig`` (or the compiler it falls back to) runs. None when the cache has none."""
    prefix = f"lib{name}."
    for e in entries:
        if e.soname.startswith(prefix) and _flags_ok(e.flags, x86_64):
            return e.soname
    return None


def index_entries(entries: Iterable[CacheEntry]) -> dict[str, list[CacheEntry]]:
    """Entries grouped by :func:`libcmp_key` of their name, each group in file order (fast lookups)."""
    out: dict[str, list[CacheEntry]] = {}
    for e in entries:
        out.setdefault(libcmp_key(e.soname), []).append(e)
    return out


def format_ldconfig_p(entries: Sequence[CacheEntry], path: str) -> list[str]:
    """The entry lines and the count line of ``ldconfig -p`` for ``entries`` (no generator line)."""
    return [f"{len(entries)} libs found in cache `{path}'"] + ["\t" + e.ldconfig_line() for e in entries]
