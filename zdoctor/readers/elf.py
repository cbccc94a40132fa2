"""Read the ELF metadata the loader cares about, and nothing else.

Only the program/section headers, ``.dynamic`` (or ``PT_DYNAMIC``), ``.gnu.version_r``,
``.gnu.version_d`` and ``.comment`` are read, with :mod:`struct` (pyelftools only names the machine);
``.dynsym`` is never walked. Results are cached by
(device, inode, mtime, size). Any input that is not a readable, well-formed ELF file becomes an
``ElfInfo`` whose ``error`` says why, never an exception.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from zdoctor.proc.userfile import open_regular
from zdoctor.readers.versions import newest

DF_1_NODEFLIB = 0x800
VER_FLG_BASE = 0x1
VER_FLG_WEAK = 0x2
#: Sanity bounds: a header claiming more than this is corrupt, not a real library.
MAX_SECTIONS = 1 << 16
MAX_COMMENT = 64 * 1024
#: A version name longer than this is not one.
MAX_VERSION_NAME = 256
VERNEED_SIZE = 16  # Elf{32,64}_Verneed and Elf{32,64}_Vernaux are both 16 bytes
VERDEF_SIZE = 20
VERDAUX_SIZE = 8
MAX_VERSION_SECTION = 4 * 1024 * 1024
ELF_MAGIC = b"\x7fELF"


@dataclass
class ElfInfo:
    """Loader-relevant metadata of one file; ``error`` set (and ``kind`` != "elf") when unusable."""

    path: str
    kind: str = "elf"  # elf | missing | unreadable | not-regular | not-elf | not-loadable | truncated | corrupt
    error: str | None = None
    elfclass: int | None = None  # 32 | 64
    machine: str | None = None  # e.g. EM_X86_64
    elftype: str | None = None  # ET_DYN | ET_EXEC
    interp: str | None = None
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: str | None = None
    runpath: str | None = None
    flags_1: int = 0
    verneed: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)  # file -> [(version, weak)]
    verdef: list[str] | None = None  # None: the file defines no versions (then every need passes)
    comment: list[str] = field(default_factory=list)
    size: int = 0
    dev_ino: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def nodeflib(self) -> bool:
        return bool(self.flags_1 & DF_1_NODEFLIB)

    def provides(self, version: str) -> bool:
        """Whether a need for ``version`` is satisfied by this file (set membership, as in ld.so)."""
        return self.verdef is None or version in self.verdef

    def newest(self, family: str) -> str | None:
        """The numerically newest defined version of ``family`` (``GLIBCXX``, ``CXXABI`` ...)."""
        return newest(self.verdef or (), family)

    def needs_from(self, soname: str) -> list[tuple[str, bool]]:
        """The (version, weak) needs this file records against the library named ``soname``."""
        return list(self.verneed.get(soname, []))

    def compilers(self) -> list[str]:
        """The compiler identification strings from ``.comment`` (``GCC: (...) 11.4.0``)."""
        return [c for c in self.comment if c.startswith(("GCC:", "clang", "Ubuntu clang", "Intel"))] or \
            list(self.comment)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verneed"] = {k: [[n, w] for n, w in v] for k, v in self.verneed.items()}
        d["dev_ino"] = list(self.dev_ino) if self.dev_ino else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ElfInfo:
        d = dict(d)
        d["verneed"] = {k: [(n, bool(w)) for n, w in v] for k, v in (d.get("verneed") or {}).items()}
        d["dev_ino"] = tuple(d["dev_ino"]) if d.get("dev_ino") else None
        return cls(**d)


_CACHE: dict[tuple[int, int, int, int], ElfInfo] = {}
_LOCK = threading.Lock()


def cache_clear() -> None:
    """Forget every cached result."""
    with _LOCK:
        _CACHE.clear()


def read_elf(path: str) -> ElfInfo:
    """Loader metadata of ``path`` (symlinks followed), cached by (dev, inode, mtime, size)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        kind = "missing" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else "unreadable"
        return ElfInfo(path=path, kind=kind, error=f"{exc.strerror or exc}")
    if not stat.S_ISREG(st.st_mode):
        return ElfInfo(path=path, kind="not-regular", error="not a regular file")
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit if hit.path == path else replace(hit, path=path)
    info = _read_uncached(path, st.st_size)
    info.dev_ino = (st.st_dev, st.st_ino)
    with _LOCK:
        _CACHE[key] = info
    return info


def _read_uncached(path: str, size: int) -> ElfInfo:
    try:
        fh = open_regular(path)  # noqa: SIM115 - closed in finally
    except OSError as exc:
        return ElfInfo(path=path, kind="unreadable", error=f"{exc.strerror or exc}", size=size)
    try:
        head = fh.read(64)
        if head[:4] != ELF_MAGIC:
            what = "empty file" if not head else "not an ELF file"
            return ElfInfo(path=path, kind="not-elf", error=what, size=size)
        if len(head) < 52:
            return ElfInfo(path=path, kind="truncated", error="truncated ELF header", size=size)
        fh.seek(0)
        return _parse(fh, path, size)
    except OSError as exc:
        return ElfInfo(path=path, kind="unreadable", error=f"{exc.strerror or exc}", size=size)
    finally:
        fh.close()


def _parse(fh: Any, path: str, size: int) -> ElfInfo:
    info = ElfInfo(path=path, size=size)
    try:
        _fill(fh, info, size)
    except (ValueError, KeyError, IndexError, struct.error, UnicodeDecodeError, OverflowError, MemoryError) as exc:
        reason = str(exc).strip() or type(exc).__name__
        truncated = "truncated" in reason or "end of" in reason.lower()
        info.kind = "truncated" if truncated else "corrupt"
        info.error = f"{'truncated' if truncated else 'corrupt'} ELF: {reason}"[:300]
    return info


# -- the headers, read with struct: the few fields the loader reads ------------------------------------
ET_NAMES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
PT_NAMES = {0: "PT_NULL", PT_LOAD: "PT_LOAD", PT_DYNAMIC: "PT_DYNAMIC", PT_INTERP: "PT_INTERP", 4: "PT_NOTE",
            6: "PT_PHDR", 7: "PT_TLS"}
SHT_PROGBITS, SHT_DYNAMIC, SHT_NOBITS = 1, 6, 8
SHT_GNU_VERDEF, SHT_GNU_VERNEED = 0x6FFFFFFD, 0x6FFFFFFE
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
DT_FLAGS_1 = 0x6FFFFFFB
#: A dynamic section holds far fewer entries than this; more is a corrupt header.
MAX_DYNAMIC_ENTRIES = 1 << 16
#: A program or section header entry is 32 to 64 bytes; a header claiming more than this is corrupt.
MAX_ENTRY = 256
#: The longest string (a path list, a library name) read from the dynamic string table.
MAX_DYNAMIC_STRING = 64 * 1024
_MACHINES: dict[int, str] = {}


def machine_name(value: int) -> str | int:
    """``62`` -> ``"EM_X86_64"``: the names pyelftools gives (its table), the number where it has none."""
    if not _MACHINES:
        from elftools.elf.enums import ENUM_E_MACHINE

        _MACHINES.update({v: k for k, v in ENUM_E_MACHINE.items() if isinstance(v, int)})
    return _MACHINES.get(value, value)


@dataclass(frozen=True)
class _Section:
    name: int
    type: int
    offset: int
    size: int
    link: int
    info: int

    def __getitem__(self, key: str) -> int:  # the field names the version readers use
        return {"sh_offset": self.offset, "sh_size": self.size, "sh_info": self.info, "sh_link": self.link}[key]


class _Reader:
    """Fixed-size reads at file offsets, a short read being a truncated file."""

    def __init__(self, fh: Any, size: int, little: bool, wide: bool) -> None:
        self.fh, self.size = fh, size
        self.end = "<" if little else ">"
        self.word = "Q" if wide else "I"

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"{what} extends past the end of the file (truncated?)")
        self.fh.seek(offset)
        data = self.fh.read(length)
        if len(data) != length:
            raise ValueError(f"{what} extends past the end of the file (truncated?)")
        return data

    def string(self, offset: int, limit: int, what: str) -> str:
        """The NUL-terminated string at ``offset``, read up to ``limit`` bytes (or the file's end)."""
        if offset < 0 or offset >= self.size:
            raise ValueError(f"{what} lies outside the file")
        self.fh.seek(offset)
        raw = self.fh.read(min(limit, self.size - offset))
        end = raw.find(b"\0")
        return (raw if end < 0 else raw[:end]).decode("utf-8", "replace")


def _fill(fh: Any, info: ElfInfo, size: int) -> None:
    head = fh.read(64)
    if len(head) < 16:
        raise ValueError("truncated ELF header")
    elfclass, data = head[4], head[5]
    if elfclass not in (1, 2) or data not in (1, 2):
        raise ValueError(f"invalid ELF class or data encoding ({elfclass}, {data})")
    wide = elfclass == 2
    rd = _Reader(fh, size, data == 1, wide)
    e, w = rd.end, rd.word
    if len(head) < (64 if wide else 52):
        raise ValueError("truncated ELF header")
    e_type, e_machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize, shnum, \
        shstrndx = struct.unpack_from(f"{e}HHI{w}{w}{w}IHHHHHH", head, 16)
    info.elfclass = 64 if wide else 32
    info.machine = machine_name(e_machine)  # type: ignore[assignment]
    info.elftype = ET_NAMES.get(e_type, str(e_type))
    if info.elftype not in ("ET_DYN", "ET_EXEC") or not phnum:
        info.kind = "not-loadable"
        info.error = f"not a shared library or executable (type {info.elftype}, {phnum} program headers)"
        return
    if shnum > MAX_SECTIONS or shoff > size or phoff > size:
        raise ValueError("section or program header table lies outside the file")
    ph_format = f"{e}IIQQQQQQ" if wide else f"{e}IIIIIIII"
    if not struct.calcsize(ph_format) <= phentsize <= MAX_ENTRY:
        raise ValueError(f"program header entries of {phentsize} bytes")
    table = rd.read(phoff, phnum * phentsize, "the program header table")
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz) of each PT_LOAD
    dyn_segment: tuple[int, int] | None = None
    for i in range(phnum):
        fields = struct.unpack_from(ph_format, table, i * phentsize)
        if wide:
            ptype, _pflags, poffset, vaddr, _paddr, filesz, _memsz, _align = fields
        else:
            ptype, poffset, vaddr, _paddr, filesz, _memsz, _pflags, _align = fields
        if poffset + filesz > size:
            raise ValueError(f"{PT_NAMES.get(ptype, ptype)} segment extends past the end of the file (truncated?)")
        if ptype == PT_INTERP:
            info.interp = rd.read(poffset, filesz, "PT_INTERP").split(b"\0", 1)[0].decode("utf-8", "replace")
        elif ptype == PT_DYNAMIC:
            dyn_segment = (poffset, filesz)
        elif ptype == PT_LOAD:
            loads.append((vaddr, poffset, filesz))
    sections = _sections(rd, shoff, shnum, shentsize, size)
    names = _names_table(rd, sections, shstrndx)
    wanted = [sec for sec in sections
              if sec.type in (SHT_DYNAMIC, SHT_GNU_VERNEED, SHT_GNU_VERDEF)
              or (sec.type == SHT_PROGBITS and names is not None and _section_name(rd, names, sec) == ".comment")]
    dynamic = next((sec for sec in wanted if sec.type == SHT_DYNAMIC), None)
    if dynamic is not None:
        _dynamic(rd, info, dynamic.offset, dynamic.size, _string_table(sections, dynamic.link, size))
    elif dyn_segment is not None:  # section headers stripped: use PT_DYNAMIC, its strings found by address
        _dynamic(rd, info, dyn_segment[0], dyn_segment[1], None, loads)
    little = data == 1
    for sec in wanted:
        if sec.type == SHT_GNU_VERNEED:
            strtab = _strtab_of(sections, sec.link, size)
            for file, needs in _verneed(fh, sec, strtab, little):
                info.verneed.setdefault(file, []).extend(needs)
        elif sec.type == SHT_GNU_VERDEF:
            strtab = _strtab_of(sections, sec.link, size)
            defined = info.verdef if info.verdef is not None else []
            defined.extend(_verdef(fh, sec, strtab, little))
            info.verdef = defined
        elif sec.type == SHT_PROGBITS:
            fh.seek(sec.offset)
            raw = fh.read(min(sec.size, MAX_COMMENT))
            seen: list[str] = []
            for part in raw.split(b"\0"):
                text = part.decode("utf-8", "replace").strip()
                if text and text not in seen:
                    seen.append(text)
            info.comment = seen


def _sections(rd: _Reader, shoff: int, shnum: int, shentsize: int, size: int) -> list[_Section]:
    if not shnum or not shoff:
        return []
    sh_format = f"{rd.end}II{rd.word}{rd.word}{rd.word}{rd.word}II"
    if not struct.calcsize(sh_format) <= shentsize <= MAX_ENTRY:
        raise ValueError(f"section header entries of {shentsize} bytes")
    table = rd.read(shoff, shnum * shentsize, "the section header table")
    out = []
    for i in range(shnum):
        name, stype, _flags, _addr, offset, length, link, sinfo = struct.unpack_from(sh_format, table, i * shentsize)
        if stype != SHT_NOBITS and offset + length > size:
            raise ValueError(f"section {i} extends past the end of the file (truncated?)")
        out.append(_Section(name, stype, offset, length, link, sinfo))
    return out


def _names_table(rd: _Reader, sections: list[_Section], index: int) -> _Section | None:
    return sections[index] if 0 < index < len(sections) else None


def _section_name(rd: _Reader, names: _Section, sec: _Section) -> str:
    if sec.name >= names.size:
        return ""
    return rd.string(names.offset + sec.name, min(256, names.size - sec.name), "a section name")


def _string_table(sections: list[_Section], index: int, size: int) -> tuple[int, int] | None:
    """(offset, size) of the string table the dynamic section links to, None when it links to none."""
    if not 0 < index < len(sections):
        return None
    sec = sections[index]
    if sec.offset + sec.size > size:
        raise ValueError("the dynamic string table extends past the end of the file (truncated?)")
    return sec.offset, sec.size


def _strtab_of(sections: list[_Section], index: int, size: int) -> tuple[int, int]:
    """(file offset, size) of the string table a version section links to."""
    if not 0 < index < len(sections):
        raise ValueError(f"version section links to string table {index}, which does not exist")
    sec = sections[index]
    if sec.offset + sec.size > size:
        raise ValueError("the version string table extends past the end of the file (truncated?)")
    return sec.offset, sec.size


def _dynamic(rd: _Reader, info: ElfInfo, offset: int, length: int, strtab: tuple[int, int] | None,
             loads: list[tuple[int, int, int]] | None = None) -> None:
    """The dynamic entries the loader reads (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH, DT_FLAGS_1), up to
    DT_NULL; the strings come from ``strtab``, else from DT_STRTAB's address mapped through ``loads``."""
    entry = struct.Struct(f"{rd.end}{'qQ' if rd.word == 'Q' else 'iI'}")
    count = min(length // entry.size, MAX_DYNAMIC_ENTRIES)
    raw = rd.read(offset, count * entry.size, "the dynamic section")
    tags: list[tuple[int, int]] = []
    for i in range(count):
        tag, value = entry.unpack_from(raw, i * entry.size)
        if tag == DT_NULL:
            break
        tags.append((tag, value))
    if strtab is None:
        address = next((v for t, v in tags if t == DT_STRTAB), None)
        length_of = next((v for t, v in tags if t == DT_STRSZ), None)
        where = next((off + address - vaddr for vaddr, off, filesz in loads or ()
                      if address is not None and vaddr <= address < vaddr + filesz), None)
        if where is None:
            if any(t in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH) for t, _v in tags):
                raise ValueError("the dynamic string table is not in any loaded segment")
            strtab = (0, 0)
        else:
            strtab = (where, length_of if length_of is not None else rd.size - where)

    def text(value: int) -> str:
        base, limit = strtab  # type: ignore[misc]
        if value >= limit:
            raise ValueError(f"dynamic string offset {value} lies outside its string table ({limit} bytes)")
        return rd.string(base + value, min(MAX_DYNAMIC_STRING, limit - value), "a dynamic string")

    for tag, value in tags:
        if tag == DT_NEEDED:
            info.needed.append(text(value))
        elif tag == DT_RPATH:
            info.rpath = text(value)
        elif tag == DT_RUNPATH:
            info.runpath = text(value)
        elif tag == DT_SONAME:
            info.soname = text(value)
        elif tag == DT_FLAGS_1:
            info.flags_1 = int(value)


# -- symbol versions, read with every count bounded by the section's size -----------------------------
# pyelftools walks ``sh_info`` entries and each entry's ``vn_cnt`` auxiliaries as the file states them:
# a crafted section (``sh_info = 0xffffffff``, ``vn_next = 0``) makes it loop for ever on the same
# entry, growing without bound. ld.so walks the chain until a zero ``next``; so does this reader, and a
# count or offset that cannot fit in the section makes the file "corrupt".


def _name(fh: Any, strtab: tuple[int, int], offset: int) -> str:
    base, length = strtab
    if offset >= length:
        raise ValueError(f"version name offset {offset} lies outside its string table ({length} bytes)")
    fh.seek(base + offset)
    raw = fh.read(min(MAX_VERSION_NAME, length - offset))
    end = raw.find(b"\0")
    if end < 0:
        raise ValueError("unterminated version name")
    return raw[:end].decode("utf-8", "replace")


def _section_bytes(fh: Any, hdr: Any) -> bytes:
    if hdr["sh_size"] > MAX_VERSION_SECTION:
        raise ValueError(f"version section of {hdr['sh_size']} bytes (real ones are a few KiB)")
    fh.seek(hdr["sh_offset"])
    data = fh.read(hdr["sh_size"])
    if len(data) != hdr["sh_size"]:
        raise ValueError("version section extends past the end of the file (truncated?)")
    return data


def _verneed(fh: Any, hdr: Any, strtab: tuple[int, int], little: bool) -> list[tuple[str, list[tuple[str, bool]]]]:
    """``.gnu.version_r``: [(file, [(version, weak)])], each count bounded by the section's size."""
    data = _section_bytes(fh, hdr)
    end = "<" if little else ">"
    limit = len(data) // VERNEED_SIZE
    if hdr["sh_info"] > limit:
        raise ValueError(f".gnu.version_r claims {hdr['sh_info']} entries; {len(data)} bytes hold at most {limit}")
    out: list[tuple[str, list[tuple[str, bool]]]] = []
    off = 0
    for _ in range(hdr["sh_info"]):
        if off + VERNEED_SIZE > len(data):
            raise ValueError(f".gnu.version_r entry at offset {off} lies outside the section")
        _ver, cnt, file_off, aux, nxt = struct.unpack_from(end + "HHIII", data, off)
        if cnt > limit:
            raise ValueError(f".gnu.version_r entry claims {cnt} versions; the section holds at most {limit}")
        needs: list[tuple[str, bool]] = []
        a = off + aux
        for _j in range(cnt):
            if a + VERNEED_SIZE > len(data):
                raise ValueError(f".gnu.version_r version at offset {a} lies outside the section")
            _hash, flags, _other, name, anext = struct.unpack_from(end + "IHHII", data, a)
            needs.append((_name(fh, strtab, name), bool(flags & VER_FLG_WEAK)))
            if anext == 0:
                break
            a += anext
        out.append((_name(fh, strtab, file_off), needs))
        if nxt == 0:
            break
        off += nxt
    return out


def _verdef(fh: Any, hdr: Any, strtab: tuple[int, int], little: bool) -> list[str]:
    """``.gnu.version_d``: the version names defined (the base entry left out), counts bounded."""
    data = _section_bytes(fh, hdr)
    end = "<" if little else ">"
    limit = len(data) // VERDAUX_SIZE
    if hdr["sh_info"] > len(data) // VERDEF_SIZE:
        raise ValueError(f".gnu.version_d claims {hdr['sh_info']} entries; {len(data)} bytes cannot hold them")
    names: list[str] = []
    off = 0
    for _ in range(hdr["sh_info"]):
        if off + VERDEF_SIZE > len(data):
            raise ValueError(f".gnu.version_d entry at offset {off} lies outside the section")
        _ver, flags, _ndx, cnt, _hash, aux, nxt = struct.unpack_from(end + "HHHHIII", data, off)
        if cnt > limit:
            raise ValueError(f".gnu.version_d entry claims {cnt} names; the section holds at most {limit}")
        if not flags & VER_FLG_BASE and cnt:
            a = off + aux
            if a + VERDAUX_SIZE > len(data):
                raise ValueError(f".gnu.version_d name at offset {a} lies outside the section")
            name, _anext = struct.unpack_from(end + "II", data, a)
            names.append(_name(fh, strtab, name))
        if nxt == 0:
            break
        off += nxt
    return names
