"""Read the ELF metadata the loader cares about, and nothing else.

Only the program/section headers, ``.dynamic`` (or ``PT_DYNAMIC``), ``.gnu.version_r``,
``.gnu.version_d`` and ``.comment`` are read; ``.dynsym`` is never walked. Results are cached by
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
    from elftools.common.exceptions import ELFError

    info = ElfInfo(path=path, size=size)
    try:
        _fill(fh, info, size)
    except (ELFError, ValueError, KeyError, IndexError, AssertionError, UnicodeDecodeError,
            OverflowError, MemoryError, RecursionError, TypeError, AttributeError) as exc:
        reason = str(exc).strip() or type(exc).__name__
        truncated = "stream" in reason.lower() or "end of" in reason.lower() or "EOF" in reason
        info.kind = "truncated" if truncated else "corrupt"
        info.error = f"{'truncated' if truncated else 'corrupt'} ELF: {reason}"[:300]
    except Exception as exc:  # construct/pyelftools raise assorted types on hostile input
        info.kind = "corrupt"
        info.error = f"corrupt ELF: {type(exc).__name__}: {exc}"[:300]
    return info


def _fill(fh: Any, info: ElfInfo, size: int) -> None:
    from elftools.elf.dynamic import DynamicSection, DynamicSegment
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

    elf = ELFFile(fh)
    info.elfclass = elf.elfclass
    info.machine = elf["e_machine"]
    info.elftype = elf["e_type"]
    shnum = elf["e_shnum"]
    if info.elftype not in ("ET_DYN", "ET_EXEC") or not elf["e_phnum"]:
        info.kind = "not-loadable"
        info.error = f"not a shared library or executable (type {info.elftype}, {elf['e_phnum']} program headers)"
        return
    if shnum > MAX_SECTIONS or elf["e_shoff"] > size or elf["e_phoff"] > size:
        raise ValueError("section or program header table lies outside the file")

    dyn_index = None
    for i in range(elf["e_phnum"]):
        hdr = elf._get_segment_header(i)
        ptype = hdr["p_type"]
        if hdr["p_offset"] + hdr["p_filesz"] > size:
            raise ValueError(f"{ptype} segment extends past the end of the file (truncated?)")
        if ptype == "PT_INTERP":
            seg = elf.get_segment(i)
            info.interp = seg.get_interp_name()
        elif ptype == "PT_DYNAMIC":
            dyn_index = i
    # Section objects are built only for the few types needed: building them all would parse the
    # (huge, on libtorch) hash tables.
    wanted = {"SHT_DYNAMIC", "SHT_GNU_verneed", "SHT_GNU_verdef", "SHT_PROGBITS"}
    sections = []
    for i in range(shnum):
        hdr = elf._get_section_header(i)
        if hdr["sh_type"] != "SHT_NOBITS" and hdr["sh_offset"] + hdr["sh_size"] > size:
            raise ValueError(f"section {i} extends past the end of the file (truncated?)")
        if hdr["sh_type"] not in wanted:
            continue
        if hdr["sh_type"] == "SHT_PROGBITS" and elf._get_section_name(hdr) != ".comment":
            continue
        sections.append(elf.get_section(i))
    dynamic = next((s for s in sections if isinstance(s, DynamicSection)), None)
    if dynamic is None and dyn_index is not None:  # section headers stripped: use PT_DYNAMIC
        seg = elf.get_segment(dyn_index)
        dynamic = seg if isinstance(seg, DynamicSegment) else None
    if dynamic is not None:
        for tag in dynamic.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                info.needed.append(tag.needed)
            elif kind == "DT_RPATH":
                info.rpath = tag.rpath
            elif kind == "DT_RUNPATH":
                info.runpath = tag.runpath
            elif kind == "DT_SONAME":
                info.soname = tag.soname
            elif kind == "DT_FLAGS_1":
                info.flags_1 = int(tag.entry.d_val)
            elif kind == "DT_NULL":
                break
    little = elf.little_endian
    for sec in sections:
        if isinstance(sec, GNUVerNeedSection):
            strtab = _strtab(elf, sec["sh_link"], size)
            for file, needs in _verneed(fh, sec.header, strtab, little):
                info.verneed.setdefault(file, []).extend(needs)
        elif isinstance(sec, GNUVerDefSection):
            strtab = _strtab(elf, sec["sh_link"], size)
            names = info.verdef if info.verdef is not None else []
            names.extend(_verdef(fh, sec.header, strtab, little))
            info.verdef = names
        elif sec.name == ".comment" and sec["sh_type"] == "SHT_PROGBITS":
            fh.seek(sec["sh_offset"])
            raw = fh.read(min(sec["sh_size"], MAX_COMMENT))
            seen: list[str] = []
            for part in raw.split(b"\0"):
                text = part.decode("utf-8", "replace").strip()
                if text and text not in seen:
                    seen.append(text)
            info.comment = seen


# -- symbol versions, read with every count bounded by the section's size -----------------------------
# pyelftools walks ``sh_info`` entries and each entry's ``vn_cnt`` auxiliaries as the file states them:
# a crafted section (``sh_info = 0xffffffff``, ``vn_next = 0``) makes it loop for ever on the same
# entry, growing without bound. ld.so walks the chain until a zero ``next``; so does this reader, and a
# count or offset that cannot fit in the section makes the file "corrupt".


def _strtab(elf: Any, index: int, size: int) -> tuple[int, int]:
    """(file offset, size) of the string table a version section links to."""
    if not 0 < index < elf["e_shnum"]:
        raise ValueError(f"version section links to string table {index}, which does not exist")
    hdr = elf._get_section_header(index)
    if hdr["sh_offset"] + hdr["sh_size"] > size:
        raise ValueError("the version string table extends past the end of the file (truncated?)")
    return hdr["sh_offset"], hdr["sh_size"]


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
