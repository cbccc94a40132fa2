"""The NVIDIA kernel module files each installed kernel has on disk, and what ``dkms status`` says of them.

A kernel loads modules only from its own tree, ``/lib/modules/<release>/``. After a kernel upgrade the
NVIDIA module must be built for the new kernel (DKMS does it when the kernel's headers are installed); when
that did not happen the new kernel boots without one: ``modprobe nvidia`` fails with "Module nvidia not found
in directory /lib/modules/<release>" and nvidia-smi "couldn't communicate with the NVIDIA driver", while the
older kernel's tree still holds the module. Pure readers; the module root is a parameter.
"""

from __future__ import annotations

import os
import re
import struct
import time
from typing import Any

from zdoctor.proc.userfile import open_regular

MODULE_ROOT = "/lib/modules"
#: The file names of the NVIDIA core module, plain or compressed as kmod loads them.
MODULE_NAMES = ("nvidia.ko", "nvidia.ko.xz", "nvidia.ko.zst", "nvidia.ko.gz")
#: Kernels listed, directory entries visited per kernel, and seconds spent per kernel at most.
MAX_KERNELS = 32
MAX_ENTRIES = 200_000
TIME_LIMIT_S = 3.0
#: The largest ``.modinfo`` section read (a module's is a few KiB).
MODINFO_CAP = 256 * 1024
_DKMS_LINE = re.compile(r"^(?P<module>[\w.+-]+)[/,]\s*(?P<version>[^,:\s]+)(?:,\s*(?P<kernel>[^,:\s]+))?"
                        r"(?:,\s*(?P<arch>[^,:\s]+))?\s*:\s*(?P<state>.+)$")


def release_key(release: str) -> list[tuple[int, str]]:
    """A kernel release's sort key, numbers as numbers (6.8.0-100 after 6.8.0-45)."""
    return [(int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"(\d+)", release) if p]


def installed_kernels(root: str = MODULE_ROOT) -> tuple[list[str], str | None]:
    """The kernel releases with a module tree under ``root`` (oldest first), and why none could be listed."""
    try:
        names = sorted((e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)), key=release_key)
    except OSError as exc:
        return [], f"{root}: {exc.strerror or exc}"
    return names[-MAX_KERNELS:], None


def find_nvidia_modules(kernel_dir: str, *, max_entries: int = MAX_ENTRIES,
                        time_limit: float = TIME_LIMIT_S) -> tuple[list[str], str | None]:
    """Every NVIDIA core module file under ``kernel_dir`` at any depth (``updates/dkms``, ``extra``,
    ``kernel/drivers/video``...), symbolic links not followed (``build`` and ``source`` point at headers);
    and why the walk stopped early, if it did."""
    found: list[str] = []
    seen = 0
    deadline = time.monotonic() + time_limit
    for top, dirs, files in os.walk(kernel_dir, followlinks=False):
        seen += len(dirs) + len(files)
        found += [os.path.join(top, f) for f in files if f in MODULE_NAMES]
        if seen > max_entries:
            return sorted(found), f"stopped after {max_entries} entries"
        if time.monotonic() > deadline:
            return sorted(found), f"stopped after {time_limit:g} s"
        dirs.sort()
    return sorted(found), None


def modinfo(path: str) -> dict[str, str]:
    """The ``key=value`` pairs of an uncompressed module's ``.modinfo`` section (``version``, ``vermagic``...),
    read from its ELF section headers; empty for a compressed or unreadable file."""
    try:
        with open_regular(path) as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
                return {}
            end = "<" if head[5] == 1 else ">"
            shoff, = struct.unpack_from(end + "Q", head, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", head, 0x3A)
            if shentsize < 64 or not 0 < shnum <= 4096 or shstrndx >= shnum:
                return {}
            fh.seek(shoff)
            table = fh.read(shentsize * shnum)
            if len(table) < shentsize * shnum:
                return {}
            sections = [struct.unpack_from(end + "IIQQQQ", table, i * shentsize) for i in range(shnum)]
            _n, _t, _f, _a, str_off, str_size = sections[shstrndx]
            fh.seek(str_off)
            names = fh.read(min(str_size, MODINFO_CAP))
            for name_off, _type, _flags, _addr, off, size in sections:
                name = names[name_off:names.find(b"\0", name_off)] if name_off < len(names) else b""
                if name == b".modinfo":
                    fh.seek(off)
                    data = fh.read(min(size, MODINFO_CAP))
                    pairs = (p.decode("utf-8", "replace").partition("=") for p in data.split(b"\0") if b"=" in p)
                    return {k: v for k, _s, v in pairs}
    except (OSError, struct.error):
        return {}
    return {}


def kernel_tree(root: str, release: str) -> dict[str, Any]:
    """One kernel's tree: its NVIDIA module files (each with its ``version`` and ``vermagic`` where the file
    is uncompressed), whether its headers are there (``build``), and why the walk stopped early."""
    kdir = os.path.join(root, release)
    files, stopped = find_nvidia_modules(kdir)
    modules = []
    for path in files[:8]:
        info = modinfo(path)
        modules.append({"path": path, "version": info.get("version"), "vermagic": info.get("vermagic"),
                        "compressed": not path.endswith(".ko")})
    return {"release": release, "dir": kdir, "nvidia": modules, "truncated": stopped,
            "headers": os.path.isdir(os.path.join(kdir, "build"))}


def parse_dkms_status(text: str) -> list[dict[str, str | None]]:
    """``dkms status`` lines, old (``nvidia, 550.54.15, 6.5.0-21-generic, x86_64: installed``) and new
    (``nvidia/550.54.15, 6.5.0-21-generic, x86_64: installed``, ``nvidia/550.54.15: added``)."""
    out: list[dict[str, str | None]] = []
    for line in (text or "").splitlines()[:200]:
        m = _DKMS_LINE.match(line.strip())
        if m:
            state = m.group("state").strip()
            out.append({"module": m.group("module"), "version": m.group("version"), "kernel": m.group("kernel"),
                        "arch": m.group("arch"), "state": state.split()[0].rstrip(",") if state else state,
                        "line": line.strip()[:300]})
    return out
