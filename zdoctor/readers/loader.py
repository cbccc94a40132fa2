"""Emulate glibc ld.so: which file each library name resolves to, and the symbol-version check.

Nothing is executed or mapped: the emulator reads ELF metadata (:func:`read_elf`) and the ld.so cache,
and follows glibc's rules (``elf/dl-load.c``, ``dl-deps.c``, ``dl-open.c``, ``dl-version.c``):

- a name already loaded (``l_name``, a ``DT_NEEDED`` string that resolved to it, or its SONAME) wins;
- otherwise names with ``/`` are opened directly, others are searched in order: the ``DT_RPATH``
  chain (the loader, its ``l_loader`` and upwards, then the executable; only when the loader has no
  ``DT_RUNPATH``), ``LD_LIBRARY_PATH``, the loader's own ``DT_RUNPATH``, the ld.so cache, the system
  directories; each directory is tried with its glibc-hwcaps (and, before glibc 2.37, legacy)
  subdirectories first;
- a file of the wrong ELF class or machine is skipped; any other unusable file ends the search (a file
  whose header passes but whose metadata cannot be read is reported with the reader's error);
- dependencies load breadth-first; ``dlopen`` gives the new object no ``l_loader``;
- version needs are checked against the *loaded* provider by exact name.

Secure-execution (setuid) rules are out of scope.
"""

from __future__ import annotations

import errno
import os
import re
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from zdoctor.core.errors import InputError
from zdoctor.proc.runner import run
from zdoctor.proc.userfile import open_regular, read_system_table
from zdoctor.readers.elf import ElfInfo, read_elf
from zdoctor.readers.ldcache import CacheEntry, index_entries, libcmp_key, lookup, read_ld_so_cache

DEFAULT_LD_SO = "/lib64/ld-linux-x86-64.so.2"
DEFAULT_CACHE = "/etc/ld.so.cache"
DEFAULT_PRELOAD = "/etc/ld.so.preload"
EM_X86_64 = 62
DEBIAN_SYSTEM_DIRS = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"]
RHEL_SYSTEM_DIRS = ["/lib64", "/usr/lib64"]

VIAS = ("already loaded", "direct path", "LD_PRELOAD", "/etc/ld.so.preload", "rpath", "LD_LIBRARY_PATH",
        "runpath", "ld.so.cache", "default")
NOT_FOUND = "cannot open shared object file"


# --------------------------------------------------------------------------------------------------
# configuration


def _unquote(value: str) -> str | None:
    """A ``--list-diagnostics`` value: a quoted string (with ``\\ooo`` escapes) or None for others."""
    if len(value) < 2 or not (value.startswith('"') and value.endswith('"')):
        return None
    body, out, i = value[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            octal = re.match(r"[0-7]{3}", body[i + 1:i + 4])
            if octal:
                out.append(int(octal.group(), 8) & 0xFF)
                i += 4
                continue
            out.extend(body[i + 1].encode())
            i += 2
            continue
        out.extend(c.encode())
        i += 1
    return out.decode("utf-8", "surrogateescape")


def parse_list_diagnostics(text: str) -> dict[str, str | None]:
    """``ld.so --list-diagnostics`` as key -> value (quoted strings unescaped, numbers kept as text)."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = _unquote(value.strip()) if value.startswith('"') else value.strip()
    return out


def parse_ld_so_help(text: str) -> dict[str, list[tuple[str, str]]]:
    """The search-path and hwcaps sections of ``ld.so --help``: section -> [(name, parenthetical)]."""
    sections: dict[str, list[tuple[str, str]]] = {"system_dirs": [], "hwcaps": [], "legacy": []}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("Shared library search path:"):
            current = "system_dirs"
        elif line.startswith("Subdirectories of glibc-hwcaps directories"):
            current = "hwcaps"
        elif line.startswith("Legacy HWCAP subdirectories"):
            current = "legacy"
        elif not line.startswith("  "):
            current = None
        elif current:
            m = re.match(r"^  (\S.*?)(?: \((.*)\))?$", line)
            if m and not m.group(1).startswith("("):
                sections[current].append((m.group(1), m.group(2) or ""))
    return sections


# x86 legacy hwcap bit names (glibc ``sysdeps/x86/dl-hwcap.h``), by bit number.
X86_HWCAP_NAMES = ("sse2", "x86_64", "avx512_1")
X86_64_HWCAP_IMPORTANT = 0x6  # HWCAP_X86_64 | HWCAP_X86_AVX512_1


def legacy_subdirs(names: Sequence[str], platform: str | None) -> list[str]:
    """glibc 2.26-2.36 legacy hwcap subdirectories, best first (``tls/haswell/avx512_1/x86_64`` ...).

    ``names`` are the searched hwcap names, highest bit first, as ``ld.so --help`` lists them (a
    ``tls`` or platform entry among them is ignored: pass the platform separately). This is
    ``_dl_important_hwcaps``: the components are the hwcap names (lowest bit first), the platform,
    then ``tls``; every subset is tried, largest first, each written from the last component to the
    first. A platform equal to a hwcap name (``x86_64`` on AMD) is a component of its own, so
    ``tls/x86_64/x86_64`` is searched and ``tls/x86_64`` twice, as ld.so does.
    """
    rest = list(names)
    for special in ("tls", platform):
        if special in rest:
            rest.remove(special)  # one entry each; a second ``x86_64`` is the hwcap bit of that name
    return _subsets(rest[::-1] + ([platform] if platform else []) + ["tls"])


def _subsets(comps: Sequence[str]) -> list[str]:
    """Every non-empty subset of ``comps``, largest first, each joined from the last component down."""
    count = len(comps)
    return ["/".join(comps[i] for i in range(count - 1, -1, -1) if mask & (1 << i))
            for mask in range((1 << count) - 1, 0, -1)]


def legacy_subdirs_from_hwcap(hwcap: int, platform: str | None, mask: int = X86_64_HWCAP_IMPORTANT,
                              bit_names: Sequence[str] = X86_HWCAP_NAMES) -> list[str]:
    """The legacy subdirectories from ld.so's own inputs: ``dl_hwcap``, the hwcap mask, the platform."""
    masked = hwcap & mask
    names = [bit_names[n] for n in range(len(bit_names)) if masked & (1 << n)]
    return _subsets(names + ([platform] if platform else []) + ["tls"])


def x86_64_hwcap_and_platform(flags: set[str], vendor: str) -> tuple[int, str]:
    """``dl_hwcap`` and ``dl_platform`` as glibc's ``init_cpu_features`` sets them on x86_64 (< 2.37).

    Every x86_64 CPU has the ``x86_64`` bit; only Intel CPUs get ``avx512_1`` (AVX512CD, BW, DQ, VL and
    no AVX512ER) and a platform other than AT_PLATFORM's ``x86_64`` (``xeon_phi``, ``haswell``).
    """
    hwcap, platform = 1 << 1, "x86_64"
    if vendor != "GenuineIntel":
        return hwcap, platform
    chosen = None
    if "avx512cd" in flags:
        if "avx512er" in flags:
            if "avx512pf" in flags:
                chosen = "xeon_phi"
        elif {"avx512bw", "avx512dq", "avx512vl"} <= flags:
            hwcap |= 1 << 2
    if chosen is None and {"avx2", "fma", "bmi1", "bmi2", "abm", "movbe", "popcnt"} <= flags:
        chosen = "haswell"
    return hwcap, chosen or platform


def _version_tuple(version: str | None) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else ()


_HWCAP_LEVELS = (
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
    ("x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}),
)


def _cpu_flags() -> tuple[set[str], str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read(200_000)
    except OSError:
        return set(), ""
    flags = re.search(r"^flags\s*:(.*)$", text, re.M)
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", text, re.M)
    return set(flags.group(1).split()) if flags else set(), vendor.group(1) if vendor else ""


def _libc_version() -> tuple[int, ...]:
    """This process's glibc version, ``()`` when it is not glibc."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return ()
    return _version_tuple(text.replace("glibc", "").strip())


def _default_hwcaps(flags: set[str]) -> list[str]:
    """The x86-64 ISA levels the CPU supports, best first (as ld.so would activate them)."""
    need: set[str] = set()
    ok: list[str] = []
    for name, extra in reversed(_HWCAP_LEVELS):
        need |= extra
        if not need <= flags:
            break
        ok.insert(0, name)
    return ok


@dataclass
class LoaderConfig:
    """What ld.so itself contributes to a search: system dirs, cache, hwcaps, DST values."""

    system_dirs: list[str] = field(default_factory=lambda: list(DEBIAN_SYSTEM_DIRS))
    cache: list[CacheEntry] = field(default_factory=list)
    cache_path: str = DEFAULT_CACHE
    hwcaps_subdirs: list[str] = field(default_factory=list)  # active glibc-hwcaps names, best first
    legacy_subdirs: list[str] = field(default_factory=list)  # glibc < 2.37 only, best first
    dst_lib: str = "lib/x86_64-linux-gnu"
    platform: str | None = "x86_64"
    preload_file: str | None = DEFAULT_PRELOAD
    glibc_version: str | None = None
    ld_so: str = DEFAULT_LD_SO
    elfclass: int = 64
    machine: int = EM_X86_64
    inhibit_cache: bool = False
    source: str = "defaults"  # "ld.so" when read from the real loader
    cache_error: str | None = None
    _index: dict[str, list[CacheEntry]] | None = field(default=None, init=False, repr=False, compare=False)

    def subdirs(self) -> list[str]:
        """Every subdirectory prefix tried inside each search directory, best first, ``""`` last."""
        out = [f"glibc-hwcaps/{h}/" for h in self.hwcaps_subdirs]
        version = _version_tuple(self.glibc_version)
        if not version or version < (2, 37):
            out += [f"{s}/" for s in self.legacy_subdirs]
        return out + [""]

    def cache_lookup(self, name: str, skip_dirs: Sequence[str] = ()) -> CacheEntry | None:
        """The cache entry ld.so would take for ``name`` (None when there is none)."""
        if self.inhibit_cache or not self.cache:
            return None
        if self._index is None:
            self._index = index_entries(self.cache)
        group = self._index.get(libcmp_key(name), [])
        return lookup(group, name, x86_64=self.machine == EM_X86_64 and self.elfclass == 64,
                      skip_dirs=skip_dirs, active_hwcaps=self.hwcaps_subdirs)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the cache entries (they are in the cache file)."""
        out = {k: getattr(self, k) for k in (
            "system_dirs", "cache_path", "hwcaps_subdirs", "legacy_subdirs", "dst_lib", "platform",
            "preload_file", "glibc_version", "ld_so", "elfclass", "machine", "inhibit_cache", "source",
            "cache_error")}
        out["cache_entries"] = len(self.cache)
        return out

    @classmethod
    def defaults(cls, *, cache_path: str = DEFAULT_CACHE, read_cache: bool = True) -> LoaderConfig:
        """Debian or RHEL-style values guessed from the filesystem and ``/proc/cpuinfo``."""
        debian = os.path.isdir("/usr/lib/x86_64-linux-gnu")
        flags, vendor = _cpu_flags()
        hwcap, platform = x86_64_hwcap_and_platform(flags, vendor)
        glibc = _libc_version()
        legacy = legacy_subdirs_from_hwcap(hwcap, platform) if glibc and glibc < (2, 37) else []
        cfg = cls(system_dirs=list(DEBIAN_SYSTEM_DIRS if debian else RHEL_SYSTEM_DIRS),
                  cache_path=cache_path, hwcaps_subdirs=_default_hwcaps(flags), legacy_subdirs=legacy,
                  dst_lib="lib/x86_64-linux-gnu" if debian else "lib64", platform=platform,
                  glibc_version=".".join(map(str, glibc)) if glibc else None)
        if read_cache:
            cfg.load_cache()
        return cfg

    def load_cache(self) -> None:
        """(Re)read the cache from ``cache_path``; an unusable file is recorded and ignored, as ld.so does."""

        self._index = None
        try:
            self.cache = read_ld_so_cache(self.cache_path)
            self.cache_error = None
        except InputError as exc:
            self.cache, self.cache_error = [], str(exc)

    @classmethod
    def from_ld_so_output(cls, diagnostics: str, help_text: str, *, ld_so: str = DEFAULT_LD_SO,
                          cache_path: str = DEFAULT_CACHE, read_cache: bool = True) -> LoaderConfig:
        """Build the configuration from ``ld.so --list-diagnostics`` and ``ld.so --help`` output."""
        cfg = cls.defaults(cache_path=cache_path, read_cache=False)
        cfg.ld_so, cfg.glibc_version = ld_so, None  # the defaults describe this process's glibc
        diag = parse_list_diagnostics(diagnostics)
        helped = parse_ld_so_help(help_text)
        used = False
        dirs = [v for k, v in sorted(diag.items(), key=lambda kv: _index_of(kv[0]))
                if k.startswith("path.system_dirs[") and v]
        if not dirs:
            dirs = [name for name, note in helped["system_dirs"] if "system search path" in note]
        if dirs:
            cfg.system_dirs = [d.rstrip("/") or "/" for d in dirs]
            used = True
        if diag.get("dl_dst_lib"):
            cfg.dst_lib = str(diag["dl_dst_lib"])
            used = True
        if "dl_platform" in diag:
            plat = diag["dl_platform"]
            cfg.platform = None if not plat or re.fullmatch(r"0x[0-9a-fA-F]+", plat) else plat  # NULL pointer
            used = True
        if diag.get("version.version"):
            cfg.glibc_version = diag["version.version"]
        subdirs, active = diag.get("dl_hwcaps_subdirs"), diag.get("dl_hwcaps_subdirs_active")
        if subdirs is not None and active is not None and re.fullmatch(r"0x[0-9a-fA-F]+|\d+", active):
            mask = int(active, 0)
            cfg.hwcaps_subdirs = [n for i, n in enumerate(subdirs.split(":")) if n and mask & (1 << i)]
            used = True
        elif helped["hwcaps"]:
            cfg.hwcaps_subdirs = [n for n, note in helped["hwcaps"] if "searched" in note]
            used = True
        legacy = [n for n, note in helped["legacy"] if "searched" in note]
        hwcap, important = diag.get("dl_hwcap"), diag.get("dl_hwcap_important")
        if cfg.glibc_version and _version_tuple(cfg.glibc_version) >= (2, 37):
            cfg.legacy_subdirs = []
        elif legacy:  # the help names the bits the hwcap mask lets through
            plat = next((n for n, note in helped["legacy"] if "AT_PLATFORM" in note), None)
            cfg.legacy_subdirs = legacy_subdirs(legacy, plat)
        elif cfg.glibc_version and hwcap and important and re.fullmatch(r"0x[0-9a-fA-F]+", hwcap) \
                and re.fullmatch(r"0x[0-9a-fA-F]+", important):
            cfg.legacy_subdirs = legacy_subdirs_from_hwcap(int(hwcap, 16), cfg.platform, int(important, 16))
        else:
            cfg.legacy_subdirs = []
        cfg.source = "ld.so" if used else "defaults"
        cfg.elfclass, cfg.machine = _elf_ident(ld_so) or (cfg.elfclass, cfg.machine)
        if read_cache:
            cfg.load_cache()
        return cfg

    @classmethod
    def detect(cls, ld_so: str | None = None) -> LoaderConfig:
        """The real loader's configuration (cached per process and per ``ld_so``)."""
        if ld_so is None:
            ld_so = read_elf("/proc/self/exe").interp or DEFAULT_LD_SO
        with _DETECT_LOCK:
            hit = _DETECTED.get(ld_so)
        if hit is not None:
            return hit
        cfg = _detect_uncached(ld_so)
        with _DETECT_LOCK:
            _DETECTED[ld_so] = cfg
        return cfg


def _index_of(key: str) -> int:
    m = re.search(r"\[(0x[0-9a-fA-F]+|\d+)\]", key)
    return int(m.group(1), 0) if m else -1


def _elf_ident(path: str) -> tuple[int, int] | None:
    try:
        with open_regular(path) as fh:
            head = fh.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2):
        return None
    fmt = "<H" if head[5] == 1 else ">H"
    return 32 if head[4] == 1 else 64, struct.unpack_from(fmt, head, 18)[0]


_DETECTED: dict[str, LoaderConfig] = {}
_DETECT_LOCK = threading.Lock()


def clear_detect_cache() -> None:
    """Forget every detected configuration."""
    with _DETECT_LOCK:
        _DETECTED.clear()


def _detect_uncached(ld_so: str) -> LoaderConfig:

    env = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}
    diag = run([ld_so, "--list-diagnostics"], env=env, timeout=10, label="ld.so --list-diagnostics")
    helped = run([ld_so, "--help"], env=env, timeout=10, label="ld.so --help")
    diag_text = diag.stdout if diag.exit_code == 0 else ""
    help_text = helped.stdout if helped.exit_code == 0 else ""
    if not diag_text and not help_text:
        cfg = LoaderConfig.defaults()
        cfg.ld_so = ld_so
        return cfg
    return LoaderConfig.from_ld_so_output(diag_text, help_text, ld_so=ld_so)


# --------------------------------------------------------------------------------------------------
# results


class Candidate(NamedTuple):
    """One file ld.so considered: the path as it names it, why it was passed over, and the search step."""

    path: str
    reason: str
    step: str


@dataclass
class Resolution:
    """How one name was resolved for one loader."""

    name: str
    path: str | None = None  # l_name of the result (as ld.so names it; may be relative)
    via: str | None = None  # one of VIAS; None when not found
    via_object: str | None = None  # the object whose RPATH/RUNPATH supplied the directory
    dir: str | None = None  # the search-path element as written (before DST expansion)
    loader: str | None = None  # the object that asked for the name
    tried: list[Candidate] = field(default_factory=list)
    error: str | None = None
    subdir: str = ""  # glibc-hwcaps or legacy subdirectory the file was found in
    same_as: str | None = None  # already loaded under another name (same device and inode)
    search: str | None = None  # for a preloaded bare name: the search step that found it

    @property
    def found(self) -> bool:
        return self.path is not None and self.error is None

    def label(self) -> str:
        """``[LD_LIBRARY_PATH]``, ``[rpath of /path/python3]``, ``[ld.so.cache]`` ..."""
        if self.via in ("rpath", "runpath"):
            return f"[{self.via} of {self.via_object}]"
        return f"[{self.via}]" if self.via else "[not found]"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "via": self.via, "via_object": self.via_object,
                "dir": self.dir, "loader": self.loader, "tried": [list(c) for c in self.tried],
                "error": self.error, "subdir": self.subdir, "same_as": self.same_as,
                "search": self.search, "label": self.label()}


@dataclass(eq=False)
class LoadedObject:
    """One object in the namespace, as ld.so's link map would hold it."""

    name: str  # l_name: the path as opened, not realpath'd
    realpath: str
    info: ElfInfo
    names: set[str] = field(default_factory=set)  # l_libname
    loader: LoadedObject | None = None  # l_loader (None for dlopen'ed objects and the executable)
    resolution: Resolution | None = None
    kind: str = "needed"  # main | interpreter | preload | needed | dlopen
    origin: str | None = None  # $ORIGIN
    soname_added: bool = False
    deps: list[LoadedObject] = field(default_factory=list, repr=False)
    deps_done: bool = False

    @property
    def soname(self) -> str | None:
        return self.info.soname

    def matches(self, name: str) -> bool:
        """``_dl_name_match_p``: ``l_name`` or one of the names that resolved to this object."""
        return name == self.name and self.kind != "main" or name in self.names

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "realpath": self.realpath, "kind": self.kind,
                "names": sorted(self.names), "soname": self.soname,
                "loader": self.loader.name if self.loader else None,
                "resolution": self.resolution.to_dict() if self.resolution else None,
                "needed": list(self.info.needed), "rpath": self.info.rpath, "runpath": self.info.runpath}


@dataclass
class VersionFailure:
    """A version node the loaded provider lacks."""

    version: str
    required_by: str
    provider: str
    provider_resolution: Resolution | None = None
    weak: bool = False

    def message(self) -> str:
        """ld.so's text: ``PROVIDER: version `X' not found (required by Y)``."""
        kind = "weak version" if self.weak else "version"
        return f"{self.provider}: {kind} `{self.version}' not found (required by {self.required_by})"

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "required_by": self.required_by, "provider": self.provider,
                "weak": self.weak, "message": self.message(),
                "provider_resolution": self.provider_resolution.to_dict() if self.provider_resolution else None}


@dataclass
class LoadResult:
    """The outcome of :meth:`Process.start` or :meth:`Process.dlopen`."""

    new_objects: list[LoadedObject] = field(default_factory=list)  # mapped here (rolled back on failure)
    failures: list[VersionFailure] = field(default_factory=list)  # what ld.so reports
    all_failures: list[VersionFailure] = field(default_factory=list)  # every non-weak miss
    error: str | None = None  # dlerror()-style text of the fatal error
    object: LoadedObject | None = None  # the object dlopen returns
    resolution: Resolution | None = None  # how the requested name itself resolved
    stderr: list[str] = field(default_factory=list)  # lines ld.so itself would print
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error, "object": self.object.name if self.object else None,
                "new_objects": [o.name for o in self.new_objects],
                "failures": [f.to_dict() for f in self.failures],
                "all_failures": [f.to_dict() for f in self.all_failures],
                "resolution": self.resolution.to_dict() if self.resolution else None,
                "stderr": list(self.stderr), "warnings": list(self.warnings)}


DlopenResult = LoadResult


#: The only errno texts ld.so knows before libc is relocated (``elf/dl-minimal.c``); others read "Error N".
_MINIMAL_STRERROR = {errno.ENOMEM: "Cannot allocate memory", errno.EINVAL: "Invalid argument",
                     errno.ENOENT: "No such file or directory", errno.EPERM: "Operation not permitted",
                     errno.EIO: "Input/output error", errno.EACCES: "Permission denied"}


class _LoadError(Exception):
    """ld.so's ``_dl_signal_error``: object name, message, optional errno."""

    def __init__(self, objname: str, errstring: str, errnum: int | None = None) -> None:
        super().__init__(objname)
        self.objname, self.errstring, self.errnum = objname, errstring, errnum

    def text(self, minimal: bool = False) -> str:
        """The message; ``minimal`` uses ld.so's start-up errno table instead of libc's."""
        if not self.errnum:
            return f"{self.objname}: {self.errstring}"
        errtext = _MINIMAL_STRERROR.get(self.errnum, f"Error {self.errnum}") if minimal \
            else os.strerror(self.errnum)
        return f"{self.objname}: {self.errstring}: {errtext}"


# --------------------------------------------------------------------------------------------------
# DST expansion and search lists


def _is_dst(text: str, ref: str) -> int:
    """glibc ``is_dst``: the length consumed by ``$REF``/``${REF}`` at the start of ``text``, else 0."""
    curly = text.startswith("{")
    body = text[1:] if curly else text
    if not body.startswith(ref):
        return 0
    nxt = body[len(ref):len(ref) + 1]
    if curly and nxt != "}":
        return 0
    if not curly and nxt and (nxt.isascii() and (nxt.isalnum() or nxt == "_")):
        return 0
    return len(ref) + 2 if curly else len(ref)


def expand_dst(text: str, origin: str | None, lib: str | None, platform: str | None) -> str | None:
    """Substitute ``$ORIGIN``, ``$LIB``, ``$PLATFORM``; None when a known token has no value."""
    if "$" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$":
            out.append(text[i])
            i += 1
            continue
        rest = text[i + 1:]
        for token, value in (("ORIGIN", origin), ("PLATFORM", platform), ("LIB", lib)):
            n = _is_dst(rest, token)
            if n:
                if value is None:
                    return None
                out.append(value)
                i += 1 + n
                break
        else:
            out.append("$")
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Dir:
    raw: str  # the element as written
    dirname: str  # expanded, with one trailing "/" ("" for the current directory)


def _fillin(elements: Sequence[str], expand: Any) -> list[_Dir]:
    """glibc ``fillin_rpath``: expand, drop empty expansions, normalise trailing slashes, dedupe."""
    out: list[_Dir] = []
    seen: set[str] = set()
    for raw in elements:
        d = ""
        if raw:
            exp = expand(raw)
            if not exp:
                continue
            d = exp.rstrip("/") or "/"
            if not d.endswith("/"):
                d += "/"
        if d in seen:
            continue
        seen.add(d)
        out.append(_Dir(raw, d))
    return out


def _origin_of(l_name: str, cwd: str) -> str:
    """``_dl_new_object``: the directory of the name as opened, made absolute with the CWD, unnormalised."""
    full = l_name if l_name.startswith("/") else cwd.rstrip("/") + "/" + l_name
    head = full.rsplit("/", 1)[0]
    return head or "/"


# --------------------------------------------------------------------------------------------------
# the process


class Process:
    """One process's namespace: the executable, its preloads and dependencies, later ``dlopen`` calls."""

    def __init__(self, executable: str, env: Mapping[str, str], config: LoaderConfig,
                 cwd: str | None = None, argv0: str | None = None) -> None:
        self.executable = executable
        self.env = dict(env)
        self.config = config
        self.cwd = cwd or os.getcwd()
        self.argv0 = argv0 or executable
        self._objects: list[LoadedObject] = []
        self.main: LoadedObject | None = None
        self.interpreter: LoadedObject | None = None
        self.resolutions: list[Resolution] = []
        self.startup: LoadResult | None = None
        self.dlopens: list[tuple[str, LoadResult]] = []
        self._isdir: dict[str, bool] = {}
        self._rpaths: dict[LoadedObject, list[_Dir]] = {}
        self._runpaths: dict[LoadedObject, list[_Dir]] = {}
        self._subdirs = config.subdirs()
        self._system = _fillin(config.system_dirs, lambda s: s)
        self._library_path: list[_Dir] = []
        self._in_startup = False

    # ---- public API ------------------------------------------------------------------------------

    @property
    def loaded(self) -> list[LoadedObject]:
        """The objects in namespace (link-map) order."""
        return list(self._objects)

    def find_loaded(self, name: str) -> LoadedObject | None:
        """The loaded object ld.so would reuse for ``name``; paths also match by device and inode."""
        hit = self._lookup_loaded(name, record=False)
        if hit is None and "/" in name:
            info = read_elf(self._abs(name))
            if info.dev_ino is not None:
                hit = next((o for o in self._objects if o.info.dev_ino == info.dev_ino), None)
        return hit

    def resolutions_for(self, name: str) -> list[Resolution]:
        """Every resolution made for ``name``, in order."""
        return [r for r in self.resolutions if r.name == name]

    def start(self) -> LoadResult:
        """Map the executable, the preloads and the ``DT_NEEDED`` closure, then check versions."""
        if self.startup is not None:
            return self.startup
        result = LoadResult()
        self.startup = result
        self._in_startup = True
        try:
            return self._start(result)
        finally:
            self._in_startup = False

    def _start(self, result: LoadResult) -> LoadResult:
        exe_info = read_elf(self._abs(self.executable))
        if not exe_info.ok:
            result.error = f"{self.executable}: {exe_info.error}"
            result.stderr.append(result.error)
            return result
        real = os.path.realpath(self._abs(self.executable))
        main = LoadedObject(name=self.executable, realpath=real, info=exe_info, kind="main",
                            origin=os.path.dirname(real) or "/", deps_done=False,
                            resolution=Resolution(name=self.executable, path=self.executable,
                                                  via="direct path"))
        self.main = main
        self._objects.append(main)
        interp = exe_info.interp or self.config.ld_so
        rtld_info = read_elf(interp)
        rtld = LoadedObject(name=interp, realpath=os.path.realpath(interp), info=rtld_info,
                            names={interp} | ({rtld_info.soname} if rtld_info.soname else set()),
                            kind="interpreter", origin=_origin_of(interp, self.cwd), deps_done=True,
                            resolution=Resolution(name=interp, path=interp, via="direct path"))
        self.interpreter = rtld
        self._objects.append(rtld)
        llp = self.env.get("LD_LIBRARY_PATH", "")
        if llp:
            self._library_path = _fillin(re.split("[:;]", llp), lambda s: self._expand(s, main))
        roots = [main]
        for source, names in (("LD_PRELOAD", self._env_preloads()), ("/etc/ld.so.preload", self._file_preloads())):
            for name in names:
                obj = self._preload(name, source, result)
                if obj is not None and obj not in roots:
                    roots.append(obj)
        before = {id(o) for o in self._objects}
        try:
            queue = self._map_deps(roots)
        except _Failed as exc:
            result.error = exc.message
            result.resolution = exc.resolution
            result.stderr.append(f"{self.argv0}: error while loading shared libraries: {result.error}")
            result.new_objects = [o for o in self._objects if id(o) not in before]
            return result
        self._place_interpreter(queue)
        result.new_objects = [o for o in self._objects if o.kind != "main"]
        for failure, warning in self._check_versions(self._objects, verbose=True):
            if warning:
                result.warnings.append(warning)
                result.stderr.append(f"{self.argv0}: {warning}")
                continue
            assert failure is not None
            result.failures.append(failure)
            result.stderr.append(f"{self.argv0}: {failure.message()}")
            if not failure.weak:
                result.all_failures.append(failure)
        if result.all_failures:
            result.error = result.all_failures[0].message()
        return result

    def dlopen(self, path_or_name: str, caller: LoadedObject | str | None = None) -> LoadResult:
        """``dlopen(path_or_name, RTLD_NOW)`` from ``caller`` (default: the executable)."""
        if self.startup is None:
            self.start()
        result = LoadResult()
        self.dlopens.append((path_or_name, result))
        if self.main is None or (self.startup is not None and not self.startup.ok):
            reason = self.startup.error if self.startup else None
            result.error = f"the program did not start ({reason})"
            return result
        call_map = self._caller(caller)
        before = list(self._objects)
        before_ids = {id(o) for o in before}
        try:
            obj, res = self._map(path_or_name, call_map, kind="dlopen")
            result.object, result.resolution = obj, res
            queue = self._map_deps([obj])
        except _Failed as exc:
            result.error = exc.message
            if result.resolution is None:
                result.resolution = exc.resolution
            result.new_objects = [o for o in self._objects if id(o) not in before_ids]
            self._objects = before
            return result
        result.new_objects = [o for o in self._objects if id(o) not in before_ids]
        fresh = [o for o in queue if id(o) not in before_ids]
        for failure, _warning in self._check_versions(fresh, verbose=False):
            if failure is not None and not failure.weak:
                result.all_failures.append(failure)
        if result.all_failures:
            result.failures = result.all_failures[:1]
            result.error = result.failures[0].message()
            self._objects = before
        return result

    # ---- mapping ---------------------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else os.path.join(self.cwd, path)

    def _expand(self, text: str, obj: LoadedObject) -> str | None:
        return expand_dst(text, obj.origin, self.config.dst_lib, self.config.platform)

    def _caller(self, caller: LoadedObject | str | None) -> LoadedObject:
        assert self.main is not None
        if isinstance(caller, LoadedObject):
            return caller
        if caller:
            return self.find_loaded(caller) or self.main
        return self.main

    def _env_preloads(self) -> list[str]:
        return [p for p in re.split("[ :]", self.env.get("LD_PRELOAD", "")) if p]

    def _file_preloads(self) -> list[str]:
        path = self.config.preload_file
        if not path:
            return []
        text = read_system_table(path)
        if text is None:
            return []
        text = re.sub(r"#[^\n]*", "", text)
        return [p for p in re.split(r"[: \t\n]", text) if p]

    def _preload(self, name: str, source: str, result: LoadResult) -> LoadedObject | None:
        assert self.main is not None
        try:
            obj, res = self._map(name, self.main, kind="preload")
        except _Failed as exc:
            exc.resolution.via = None
            reason = exc.error.errstring
            result.stderr.append(f"ERROR: ld.so: object '{name}' from {source} cannot be preloaded "
                                 f"({reason}): ignored.")
            result.warnings.append(result.stderr[-1])
            return None
        if res.via != "already loaded":
            res.search, res.via = (res.via if res.via != "direct path" else None), source
        return obj

    def _lookup_loaded(self, name: str, record: bool = True) -> LoadedObject | None:
        for obj in self._objects:
            if obj.matches(name):
                return obj
            if obj.kind != "main" and obj.info.soname == name:
                if record and not obj.soname_added:
                    obj.names.add(name)
                    obj.soname_added = True
                return obj
        return None

    def _map(self, name: str, loader: LoadedObject, kind: str, expanded: bool = False,
             ) -> tuple[LoadedObject, Resolution]:
        """``_dl_map_object``: reuse a loaded object or find, verify and add a new one."""
        res = Resolution(name=name, loader=loader.name)
        self.resolutions.append(res)
        hit = self._lookup_loaded(name)
        if hit is not None:
            res.path, res.via = hit.name, "already loaded"
            return hit, res
        if "/" in name:
            path = name if expanded else self._expand(name, loader)
            res.via = "direct path"
            if not path:
                raise self._fail(_LoadError(name, NOT_FOUND, errno.ENOENT), res)
            probe = self._verify(path)
            if probe.status == "ok":
                assert probe.info is not None
                res.path = path
                return self._new_object(path, probe.info, name, loader, kind, res), res
            res.via = None
            res.tried.append(Candidate(path, _reason(probe), "direct path"))
            if probe.status in ("missing", "stop", "denied", "other-machine"):
                raise self._fail(_LoadError(name, NOT_FOUND, probe.errnum or errno.ENOENT), res)
            if probe.status == "other-class":
                raise self._fail(_LoadError(name, probe.detail or "wrong ELF class"), res)
            raise self._fail(_LoadError(path, probe.detail or "invalid ELF header", probe.errnum), res)
        found = self._search(name, loader, res)
        if found is None:
            other = next((c.reason for c in res.tried if c.reason.startswith("wrong ELF class")), None)
            # ld.so appends strerror(errno) of its last failed open; with nothing tried there is none.
            error = _LoadError(name, other) if other else \
                _LoadError(name, NOT_FOUND, errno.ENOENT if res.tried else None)
            raise self._fail(error, res)
        path, info = found
        res.path = path
        return self._new_object(path, info, name, loader, kind, res), res

    def _new_object(self, path: str, info: ElfInfo, name: str, loader: LoadedObject, kind: str,
                    res: Resolution) -> LoadedObject:
        if info.dev_ino is not None:
            for obj in self._objects:
                if obj.kind != "main" and obj.info.dev_ino == info.dev_ino:
                    obj.names.add(name)
                    res.same_as = obj.name
                    return obj
        obj = LoadedObject(name=path, realpath=os.path.realpath(self._abs(path)), info=info, names={name},
                           loader=None if kind == "dlopen" else loader, resolution=res, kind=kind,
                           origin=_origin_of(path, self.cwd))
        self._objects.append(obj)
        return obj

    def _map_deps(self, roots: list[LoadedObject]) -> list[LoadedObject]:
        """``_dl_map_object_deps``: breadth-first over ``DT_NEEDED``; returns the search list."""
        queue = list(roots)
        seen = {id(o) for o in queue}
        i = 0
        while i < len(queue):
            obj = queue[i]
            i += 1
            if obj.deps_done:
                continue
            obj.deps_done = True
            for needed in obj.info.needed:
                name = needed
                if "$" in needed:
                    exp = self._expand(needed, obj)
                    if not exp:
                        res = Resolution(name=needed, loader=obj.name)
                        self.resolutions.append(res)
                        raise self._fail(_LoadError(needed, "empty dynamic string token substitution"), res)
                    name = exp
                dep, _res = self._map(name, obj, kind="needed", expanded=True)
                obj.deps.append(dep)
                if id(dep) not in seen:
                    seen.add(id(dep))
                    queue.append(dep)
        return queue

    def _place_interpreter(self, queue: list[LoadedObject]) -> None:
        """Put the interpreter where ld.so links it: after its predecessor in the search list."""
        rtld = self.interpreter
        if rtld is None or rtld not in self._objects:
            return
        self._objects.remove(rtld)
        if rtld in queue and queue.index(rtld) > 0:
            prev = queue[queue.index(rtld) - 1]
            self._objects.insert(self._objects.index(prev) + 1, rtld)
        else:
            self._objects.append(rtld)

    def _display(self, obj: LoadedObject | None) -> str | None:
        if obj is None:
            return None
        return self.argv0 if obj.kind == "main" else obj.name

    # ---- searching -------------------------------------------------------------------------------

    def _dirs_of(self, obj: LoadedObject, runpath: bool) -> list[_Dir]:
        cache = self._runpaths if runpath else self._rpaths
        key = obj
        if key not in cache:
            text = obj.info.runpath if runpath else obj.info.rpath
            if not runpath and obj.kind == "main" and obj.info.runpath is not None:
                text = None  # the executable's RPATH is ignored when it also has RUNPATH
            cache[key] = _fillin(text.split(":"), lambda s: self._expand(s, obj)) if text is not None else []
        return cache[key]

    def _search(self, name: str, loader: LoadedObject, res: Resolution) -> tuple[str, ElfInfo] | None:
        assert self.main is not None
        if loader.info.runpath is None:
            did_main = False
            obj: LoadedObject | None = loader
            while obj is not None:
                dirs = self._dirs_of(obj, runpath=False)
                if dirs:
                    hit = self._open_path(name, dirs, "rpath", obj, res)
                    if hit:
                        return hit
                    did_main |= obj is self.main
                obj = obj.loader
            if not did_main:
                dirs = self._dirs_of(self.main, runpath=False)
                if dirs:
                    hit = self._open_path(name, dirs, "rpath", self.main, res)
                    if hit:
                        return hit
        if self._library_path:
            hit = self._open_path(name, self._library_path, "LD_LIBRARY_PATH", None, res)
            if hit:
                return hit
        if loader.info.runpath is not None:
            dirs = self._dirs_of(loader, runpath=True)
            if dirs:
                hit = self._open_path(name, dirs, "runpath", loader, res)
                if hit:
                    return hit
        nodeflib = loader.info.nodeflib
        entry = self.config.cache_lookup(name, skip_dirs=[d.dirname for d in self._system] if nodeflib else ())
        if entry is not None:
            probe = self._verify(entry.path)
            if probe.status == "ok":
                assert probe.info is not None
                res.via, res.dir = "ld.so.cache", None
                return entry.path, probe.info
            res.tried.append(Candidate(entry.path, _reason(probe, stale=True), "ld.so.cache"))
            if probe.status == "fatal":
                raise self._fail(_LoadError(entry.path, probe.detail or "invalid ELF header", probe.errnum), res)
        if not nodeflib:
            return self._open_path(name, self._system, "default", None, res)
        return None

    def _dir_exists(self, path: str) -> bool:
        hit = self._isdir.get(path)
        if hit is None:
            hit = self._isdir[path] = os.path.isdir(self._abs(path) if path else self.cwd)
        return hit

    def _open_path(self, name: str, dirs: list[_Dir], step: str, owner: LoadedObject | None,
                   res: Resolution) -> tuple[str, ElfInfo] | None:
        """``open_path``: try every directory with every subdirectory; a bad file ends the search."""
        for d in dirs:
            for sub in self._subdirs:
                folder = d.dirname + sub
                if not self._dir_exists(folder):
                    if not sub:
                        res.tried.append(Candidate(folder + name, "missing (no such directory)", step))
                    continue
                cand = folder + name
                probe = self._verify(cand)
                if probe.status == "ok":
                    assert probe.info is not None
                    res.via, res.dir, res.subdir = step, d.raw, sub.rstrip("/")
                    res.via_object = owner.name if owner is not None else None
                    return cand, probe.info
                res.tried.append(Candidate(cand, _reason(probe), step))
                if probe.status == "fatal":
                    raise self._fail(_LoadError(cand, probe.detail or "invalid ELF header", probe.errnum), res)
                if probe.status == "stop":
                    return None
        return None

    def _verify(self, path: str) -> _Probe:
        """``open_verify``: ok | missing | denied | stop | other-class | other-machine | fatal."""
        full = self._abs(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return _Probe("missing", None, None, errno.ENOENT)
            return _Probe("denied" if exc.errno == errno.EACCES else "stop", exc.strerror, None, exc.errno)
        try:
            head = os.read(fd, 64)
        except OSError as exc:
            return _Probe("fatal", "cannot read file data", None, exc.errno)
        finally:
            os.close(fd)
        status, detail = _check_header(head, self.config.elfclass, self.config.machine)
        if status != "ok":
            return _Probe(status, detail, None)
        info = read_elf(full)
        if not info.ok:
            return _Probe("fatal", info.error, None)
        return _Probe("ok", None, info)

    def _fail(self, error: _LoadError, res: Resolution) -> _Failed:
        return _Failed(error, res, minimal=self._in_startup)

    # ---- versions --------------------------------------------------------------------------------

    def _find_needed(self, name: str, obj: LoadedObject) -> LoadedObject | None:
        for cand in self._objects:
            if cand.matches(name):
                return cand
        return next((d for d in obj.deps if d.matches(name)), None)

    def _check_versions(self, objs: Sequence[LoadedObject], verbose: bool,
                        ) -> list[tuple[VersionFailure | None, str | None]]:
        """``_dl_check_map_versions`` over ``objs``: every miss, and (verbose) ld.so's warnings."""
        out: list[tuple[VersionFailure | None, str | None]] = []
        for obj in objs:
            needer = self._display(obj) or obj.name
            for file, needs in obj.info.verneed.items():
                provider = self._find_needed(file, obj)
                if provider is None:
                    continue
                pname = self._display(provider) or provider.name
                for version, weak in needs:
                    if provider.info.verdef is None:
                        if verbose:
                            out.append((None, f"{pname}: no version information available (required by {needer})"))
                        continue
                    if version in provider.info.verdef:
                        continue
                    if weak and not verbose:
                        continue
                    out.append((VersionFailure(version, needer, pname, provider.resolution, weak), None))
        return out


class _Probe(NamedTuple):
    status: str
    detail: str | None
    info: ElfInfo | None
    errnum: int | None = None


class _Failed(Exception):
    def __init__(self, error: _LoadError, resolution: Resolution, minimal: bool = False) -> None:
        self.message = error.text(minimal)
        super().__init__(self.message)
        self.error, self.resolution = error, resolution
        resolution.error = self.message
        resolution.path = None


def _reason(probe: _Probe, stale: bool = False) -> str:
    if probe.status == "fatal":
        base = _LoadError("", probe.detail or "invalid ELF header", probe.errnum).text()[2:]
    elif probe.status == "stop":
        base = f"error: {probe.detail}"
    else:
        base = {"missing": "missing", "denied": "permission denied"}.get(probe.status, probe.detail or probe.status)
    return f"{base} (stale ld.so.cache entry)" if stale else base


def _check_header(head: bytes, elfclass: int, machine: int) -> tuple[str, str | None]:
    """The ELF identification checks of ``open_verify``, in glibc's order."""
    ehdr = 64 if elfclass == 64 else 52
    if len(head) < ehdr:
        return "fatal", "file too short"
    if head[:4] != b"\x7fELF":
        return "fatal", "invalid ELF header"
    want = 2 if elfclass == 64 else 1
    if head[4] != want:
        return "other-class", f"wrong ELF class: ELFCLASS{32 if head[4] == 1 else 64 if head[4] == 2 else head[4]}"
    if head[5] != 1:
        return "fatal", "ELF file data encoding not little-endian"
    if head[6] != 1:
        return "fatal", "ELF file version ident does not match current one"
    osabi, abiversion = head[7], head[8]
    if osabi not in (0, 3):
        return "fatal", "ELF file OS ABI invalid"
    if not (abiversion == 0 or (osabi == 3 and abiversion < 4)):
        return "fatal", "ELF file ABI version invalid"
    if any(head[9:16]):
        return "fatal", "nonzero padding in e_ident"
    e_type, e_machine, e_version = struct.unpack_from("<HHI", head, 16)
    if e_version != 1:
        return "fatal", "ELF file version does not match current one"
    if e_machine != machine:
        return "other-machine", f"wrong machine (e_machine {e_machine})"
    if e_type not in (2, 3):
        return "fatal", "only ET_DYN and ET_EXEC can be loaded"
    phentsize = struct.unpack_from("<H", head, 54 if elfclass == 64 else 42)[0]
    if phentsize != (56 if elfclass == 64 else 32):
        return "fatal", "ELF file's phentsize not the expected size"
    return "ok", None


def resolve_chain(executable: str, env: Mapping[str, str], config: LoaderConfig, imports: Sequence[str],
                  cwd: str | None = None, argv0: str | None = None) -> Process:
    """Start ``executable`` then ``dlopen`` each path in ``imports`` in order (``import a; import b``)."""
    proc = Process(executable, env, config, cwd=cwd, argv0=argv0)
    proc.start()
    for path in imports:
        proc.dlopen(path)
    return proc
