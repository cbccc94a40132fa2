"""The GPU architectures a built library carries, read from its ``.nv_fatbin`` section (no CUDA tool needed).

NVIDIA does not document the fatbin data format. Its layout as nvcc writes it (read from nvcc 13.0's output,
and the same in the open readers of it): the section holds one or more fatbins, each a 16-byte header
(``uint32 magic 0xBA55ED50, uint16 version, uint16 header size, uint64 size of the entries``) followed by
entries, each ``uint16 kind (1 PTX, 2 ELF cubin), uint16, uint32 header size, uint64 payload size, ...,
uint32 arch (80 for sm_80) at offset 28``. Only the headers are read; a payload (compressed or not) is
skipped.
"""

from __future__ import annotations

import struct
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from zdoctor.proc.userfile import open_regular

MAGIC = 0xBA55ED50
SECTION = ".nv_fatbin"
MAX_ENTRIES = 4096


def read_archs(path: str) -> dict[str, Any]:
    """``{pairs: [[arch, code]], cuda: bool (has a fatbin), error}`` of the library at ``path``; a cubin for
    sm_80 is ``["compute_80", "sm_80"]``, PTX for 9.0 ``["compute_90", "compute_90"]``."""
    out: dict[str, Any] = {"pairs": [], "cuda": None, "error": None}
    try:
        with open_regular(path) as fh:
            try:
                elf = ELFFile(fh)
                sec = elf.get_section_by_name(SECTION)
            except (ELFError, struct.error, ValueError) as exc:
                out["error"] = f"not a readable ELF file: {exc}"
                return out
            if sec is None:
                out["cuda"] = False
                return out
            out["cuda"] = True
            base, size = sec["sh_offset"], sec["sh_size"]
            pairs: list[list[str]] = []
            pos, seen = 0, 0
            while pos + 16 <= size and seen < MAX_ENTRIES:
                fh.seek(base + pos)
                head = fh.read(16)
                if len(head) < 16:
                    break
                magic, _ver, hsize, body = struct.unpack("<IHHQ", head)
                if magic != MAGIC or hsize < 16:
                    pos += 8  # fatbins are 8-byte aligned in the section
                    continue
                off, end = pos + hsize, pos + hsize + body
                while off + 32 <= min(end, size) and seen < MAX_ENTRIES:
                    fh.seek(base + off)
                    entry = fh.read(32)
                    if len(entry) < 32:
                        break
                    kind, _x, ehs, esize = struct.unpack_from("<HHIQ", entry, 0)
                    (arch,) = struct.unpack_from("<I", entry, 28)
                    seen += 1
                    num = str(arch)
                    pair = [f"compute_{num}", f"sm_{num}"] if kind == 2 else [f"compute_{num}", f"compute_{num}"] \
                        if kind == 1 else None
                    if pair and pair not in pairs:
                        pairs.append(pair)
                    if ehs <= 0:
                        break
                    off += ehs + esize
                pos = end
            out["pairs"] = sorted(pairs)
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
    return out
