"""DeepSpeed's JIT-built ops in torch's extension cache, read from the files alone.

``torch.utils.cpp_extension.load(name=...)`` (which DeepSpeed's op builders call, e.g.
``CPUAdamBuilder().load()``) builds into ``$TORCH_EXTENSIONS_DIR/<name>/`` or, when that variable is
unset, into ``<cache>/torch_extensions/py<major><minor><abiflags>_<cpu|cuXYZ|rocmXY>/<name>/`` where
``<cache>`` is ``$XDG_CACHE_HOME`` or ``~/.cache`` (older torch releases used no tag level). The op dir
holds ``build.ninja`` (its ``cxx = ...`` line names the compiler), the built ``<name>.so`` (``<name>_v<N>.so``
after an in-process rebuild) and, while a build runs, a ``lock`` file: torch's ``FileBaton`` creates it
with ``O_CREAT|O_EXCL``, keeps it open during the build and deletes it at the end. Every other process
that wants the op polls every 0.1 s until the file disappears, with no time limit: a builder killed
mid-build leaves a lock that makes every later launch wait forever.

Prebuilt ops (``DS_BUILD_OPS=1`` at install time) live inside the package instead, as
``deepspeed/ops/<group>/<name>_op.cpython-*.so``.

Nothing here raises on unreadable dirs, hostile names or symlink loops, and every walk is bounded.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from zdoctor.core.model import known_fields
from zdoctor.proc.runner import which_all
from zdoctor.readers.elf import read_elf
from zdoctor.readers.versions import newest

#: ``py311_cu121``, ``py39_cpu``, ``py313t_rocm62``: the per-interpreter level torch adds under the cache.
TAG_RE = re.compile(r"^py(\d)(\d+)([a-z]*)_([a-z]+[0-9a-z.]*)$")
LOCK_NAME = "lock"
NINJA_NAME = "build.ninja"
#: Bounds: entries listed per directory, op dirs per scan, bytes of build.ninja read, files per op dir.
MAX_DIR_ENTRIES = 4096
MAX_OPS = 512
MAX_NINJA_BYTES = 256 * 1024
MAX_OP_FILES = 2048
#: How deep prebuilt_ops walks below ``deepspeed/ops`` and how many .so files it reports.
MAX_PREBUILT_DEPTH = 4
MAX_PREBUILT = 200
WRAPPERS = ("ccache", "sccache", "distcc")
_GCC_COMMENT = re.compile(r"GCC: \(.*\) (\d+(?:\.\d+)+)")
_CLANG_COMMENT = re.compile(r"clang version (\d+(?:\.\d+)+)")


@dataclass
class JitOp:
    """One op dir in torch's extension cache, as found on disk."""

    name: str
    dir: str
    tag: str | None = None  # "py311_cpu"; None under $TORCH_EXTENSIONS_DIR or the tag-less layout
    root: str = ""
    so_path: str | None = None  # the .so torch loads; None when not built
    so_files: list[str] = field(default_factory=list)
    lock_path: str | None = None  # None when there is no lock
    lock_age_s: float | None = None
    lock_ino: int | None = None  # identity of the lock file, to tell a later lock from this one
    lock_uid: int | None = None
    lock_owner: str | None = None
    lock_regular: bool | None = None
    lock_kind: str | None = None  # file | dir | symlink | other
    dir_writable: bool | None = None
    build_cxx: str | None = None  # the raw value of build.ninja's ``cxx =`` line
    build_compiler: str | None = None  # its compiler word, past ccache-style wrappers
    build_compiler_path: str | None = None  # that word resolved (on the target PATH when bare)
    build_compiler_realpath: str | None = None
    so_info: dict[str, Any] | None = None  # summary of read_elf(so_path)
    python_tag_mismatch: bool | None = None  # the tag's pyXY differs from the target interpreter's
    in_use: bool | None = None  # the target interpreter would use this dir (None: unknown)
    errors: list[str] = field(default_factory=list)

    @property
    def corrupt(self) -> bool:
        """A built .so that is not a usable ELF file (truncated, corrupt, empty, unreadable)."""
        return bool(self.so_path and self.so_info and self.so_info.get("kind") != "elf")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JitOp:
        return cls(**known_fields(cls, d))


def _home(env: Mapping[str, str]) -> str:
    home = env.get("HOME")
    if home:
        return home
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except (KeyError, OSError):
        return os.path.expanduser("~")


def cache_base(env: Mapping[str, str]) -> tuple[str, str]:
    """The extension root torch uses for ``env`` and what decided it:
    (``$TORCH_EXTENSIONS_DIR``, "TORCH_EXTENSIONS_DIR") or (``<cache>/torch_extensions``, "XDG_CACHE_HOME"|"HOME").
    """
    explicit = env.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return explicit, "TORCH_EXTENSIONS_DIR"
    xdg = env.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "torch_extensions"), "XDG_CACHE_HOME"
    return os.path.join(_home(env), ".cache", "torch_extensions"), "HOME"


def _list_dir(path: str, limit: int = MAX_DIR_ENTRIES) -> tuple[list[os.DirEntry[str]], str | None]:
    """Up to ``limit`` entries of ``path`` sorted by name, and an error text (never raises)."""
    out: list[os.DirEntry[str]] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                out.append(entry)
                if len(out) >= limit:
                    return sorted(out, key=lambda e: e.name), f"more than {limit} entries; the rest not read"
    except OSError as exc:
        return [], f"{path}: {exc.strerror or exc}"
    return sorted(out, key=lambda e: e.name), None


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symlinks, as torch does; a loop is simply "not a dir"
    except OSError:
        return False


def extension_roots(env: Mapping[str, str]) -> list[str]:
    """The directories whose subdirectories are op dirs, for the training environment ``env``.

    ``$TORCH_EXTENSIONS_DIR`` alone when it is set; otherwise every ``py*_*`` tag dir under
    ``<cache>/torch_extensions``, plus that dir itself when it holds tag-less op dirs (older torch) or
    no tag dir at all (so callers can report where they looked).
    """
    base, source = cache_base(env)
    if source == "TORCH_EXTENSIONS_DIR":
        return [base]
    entries, _err = _list_dir(base)
    tags = [os.path.join(base, e.name) for e in entries if TAG_RE.match(e.name) and _is_dir(e)]
    legacy = any(not TAG_RE.match(e.name) and _is_dir(e) for e in entries)
    return tags + ([base] if legacy or not tags else [])


def _version_parts(python_version: str | None) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", python_version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def tag_python(tag: str | None) -> tuple[int, int] | None:
    """``"py311_cu121"`` -> ``(3, 11)``."""
    m = TAG_RE.match(tag or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def expected_tag(python_version: str | None, abiflags: str = "", cuda: str | None = None,
                 hip: str | None = None, torch_known: bool = False) -> str | None:
    """The tag torch would use: ``py311_cu121``; None when the interpreter or torch build is unknown."""
    ver = _version_parts(python_version)
    if ver is None or not torch_known:
        return None
    acc = f"rocm{hip.replace('.', '')}" if hip else f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    return f"py{ver[0]}{ver[1]}{abiflags}_{acc}"


def parse_ninja_cxx(text: str) -> str | None:
    """The value of the top-level ``cxx = ...`` line of a build.ninja, or None."""
    for line in text.splitlines():
        if line.startswith("cxx ") or line.startswith("cxx="):
            key, sep, value = line.partition("=")
            if sep and key.strip() == "cxx":
                return value.strip()
    return None


def compiler_word(cxx: str | None) -> str | None:
    """The compiler a ``cxx`` value runs: its first word past a ccache-style wrapper."""
    if not cxx:
        return None
    try:
        words = shlex.split(cxx)
    except ValueError:
        words = cxx.split()
    while len(words) > 1 and os.path.basename(words[0]) in WRAPPERS:
        words = words[1:]
    return words[0] if words else None


def _read_small(path: str, limit: int) -> tuple[str | None, str | None]:
    """The text of a regular file, at most ``limit`` bytes; never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return None, f"{exc.strerror or exc}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        return os.read(fd, limit).decode("utf-8", "replace"), None
    except OSError as exc:
        return None, f"{exc.strerror or exc}"
    finally:
        os.close(fd)


def gcc_version_of(comments: Iterable[str]) -> str | None:
    """The newest compiler version named in an ELF ``.comment`` (``GCC: (Debian 12.2.0-14) 12.2.0``)."""
    best: tuple[tuple[int, ...], str] | None = None
    for c in comments:
        m = _GCC_COMMENT.search(c) or _CLANG_COMMENT.search(c)
        if m:
            key = tuple(int(p) for p in m.group(1).split("."))
            if best is None or key > best[0]:
                best = (key, m.group(1))
    return best[1] if best else None


def so_summary(path: str) -> dict[str, Any]:
    """What zdoctor keeps of ``read_elf(path)`` for a JIT op: kind, error, size and what it needs."""
    info = read_elf(path)
    needs = [v for v, _weak in info.needs_from("libstdc++.so.6")] if info.ok else []
    comments = info.compilers() if info.ok else []
    return {
        "kind": info.kind,
        "error": info.error,
        "size": info.size,
        "soname": info.soname,
        "needed": list(info.needed)[:64],
        "glibcxx_newest": newest(needs, "GLIBCXX"),
        "cxxabi_newest": newest(needs, "CXXABI"),
        "compilers": comments[:8],
        "compiler_version": gcc_version_of(comments),
    }


def _pick_so(name: str, so_files: list[str]) -> str | None:
    """The .so torch loads for op ``name``: ``<name>.so``, else the newest ``<name>_v<N>.so``, else any."""
    by_base = {os.path.basename(p): p for p in so_files}
    if f"{name}.so" in by_base:
        return by_base[f"{name}.so"]
    versioned = []
    for base, p in by_base.items():
        m = re.fullmatch(re.escape(name) + r"_v(\d+)\.so", base)
        if m:
            versioned.append((int(m.group(1)), p))
    if versioned:
        return max(versioned)[1]
    return so_files[0] if so_files else None


def _owner(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OSError):
        return None


def _resolve(word: str | None, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    if not word:
        return None, None
    if "/" in word:
        return (word, os.path.realpath(word)) if os.path.isfile(word) else (word, None)
    found = which_all(word, env.get("PATH"))
    return (found[0], os.path.realpath(found[0])) if found else (None, None)


def read_op(name: str, path: str, tag: str | None, root: str, env: Mapping[str, str],
            python_version: str | None = None, now: float | None = None) -> JitOp:
    """Everything zdoctor reads about one op dir (never raises)."""
    now = time.time() if now is None else now
    op = JitOp(name=name, dir=path, tag=tag, root=root)
    entries, err = _list_dir(path, MAX_OP_FILES)
    if err:
        op.errors.append(err)
    names = {e.name: e for e in entries}
    op.so_files = [os.path.join(path, e.name) for e in entries if e.name.endswith(".so")]
    op.so_path = _pick_so(name, op.so_files)
    if op.so_path:
        op.so_info = so_summary(op.so_path)
    lock = os.path.join(path, LOCK_NAME)
    if LOCK_NAME in names or os.path.lexists(lock):
        op.lock_path = lock
        try:
            st = os.lstat(lock)
            op.lock_age_s = round(max(0.0, now - st.st_mtime), 1)
            op.lock_ino = st.st_ino
            op.lock_uid = st.st_uid
            op.lock_owner = _owner(st.st_uid)
            op.lock_regular = stat.S_ISREG(st.st_mode)
            op.lock_kind = ("file" if op.lock_regular else "dir" if stat.S_ISDIR(st.st_mode)
                            else "symlink" if stat.S_ISLNK(st.st_mode) else "other")
        except OSError as exc:
            op.errors.append(f"{lock}: {exc.strerror or exc}")
    op.dir_writable = os.access(path, os.W_OK | os.X_OK)
    if NINJA_NAME in names:
        text, nerr = _read_small(os.path.join(path, NINJA_NAME), MAX_NINJA_BYTES)
        if nerr:
            op.errors.append(f"{NINJA_NAME}: {nerr}")
        else:
            op.build_cxx = parse_ninja_cxx(text or "")
            op.build_compiler = compiler_word(op.build_cxx)
            op.build_compiler_path, op.build_compiler_realpath = _resolve(op.build_compiler, env)
    want = _version_parts(python_version)
    have = tag_python(tag)
    op.python_tag_mismatch = None if want is None or have is None else want != have
    return op


def _unread(path: str, err: str | None) -> str | None:
    """Why (part of) directory ``path`` was not listed (``err`` from :func:`_list_dir`); None when it was,
    or when it does not exist (nothing was built there)."""
    if err is None or not os.path.lexists(path):
        return None
    return err if err.startswith(path) else f"{path}: {err}"


def _lock_unknown(op_dir: str) -> str | None:
    """Why it is not known whether ``op_dir`` holds a lock (its ``lock`` entry cannot be looked up)."""
    try:
        os.lstat(os.path.join(op_dir, LOCK_NAME))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{op_dir}: {exc.strerror or exc}"
    return None


def scan_jit_cache(env: Mapping[str, str], python_version: str | None = None, *,
                   expected: str | None = None, max_ops: int = MAX_OPS,
                   unscanned: list[str] | None = None) -> list[JitOp]:
    """Every op dir under the extension roots of ``env``, sorted by root then name (never raises).

    ``python_version`` ("3.11.7") fills ``python_tag_mismatch``; ``expected`` (the tag torch would use,
    see :func:`expected_tag`) fills ``in_use``. At most ``max_ops`` ops are read. ``unscanned`` gets one
    line for each place that was not (fully) read: a directory that could not be listed, a listing cut at
    its cap, the op dirs left after ``max_ops``, an op dir whose ``lock`` could not be looked up.
    """
    gaps = unscanned if unscanned is not None else []
    ops: list[JitOp] = []
    now = time.time()
    seen: set[tuple[int, int]] = set()
    base, source = cache_base(env)
    roots = extension_roots(env)
    if base not in roots:  # the tag dirs are listed below; the dir above them was listed to find them
        why = _unread(base, _list_dir(base)[1])
        if why:
            gaps.append(why)
    for root in roots:
        leaf = os.path.basename(root.rstrip("/"))
        base_tag = leaf if source != "TORCH_EXTENSIONS_DIR" and TAG_RE.match(leaf) else None
        entries, err = _list_dir(root)
        why = _unread(root, err)
        if why:
            gaps.append(why)
        for n, e in enumerate(entries):
            if len(ops) >= max_ops:
                gaps.append(f"{root}: {len(entries) - n} more entries not read (at most {max_ops} op dirs are "
                            "read)")
                return ops
            if base_tag is None and source != "TORCH_EXTENSIONS_DIR" and TAG_RE.match(e.name):
                continue  # a tag level, listed as its own root
            if not _is_dir(e):
                continue
            try:
                st = os.stat(e.path)
                ident = (st.st_dev, st.st_ino)
            except OSError:
                ident = None
            if ident is not None:
                if ident in seen:
                    continue  # the same dir reached twice through a symlink
                seen.add(ident)
            op = read_op(e.name, e.path, base_tag, root, env, python_version, now)
            if op.lock_path is None:
                why = _lock_unknown(e.path)
                if why:
                    gaps.append(f"{why} (whether it holds a lock is not known)")
            if source == "TORCH_EXTENSIONS_DIR":
                op.in_use = True
            elif base_tag is None:
                op.in_use = None  # the tag-less layout of older torch releases
            elif expected:
                op.in_use = base_tag == expected
            elif op.python_tag_mismatch is not None:
                op.in_use = False if op.python_tag_mismatch else None
            ops.append(op)
    return ops


def prebuilt_ops(deepspeed_dir: str | None) -> list[str]:
    """The .so files shipped inside the deepspeed package (``ops/**``), sorted; [] when none or unreadable."""
    if not deepspeed_dir:
        return []
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    stack = [(os.path.join(deepspeed_dir, "ops"), 0)]
    while stack and len(out) < MAX_PREBUILT:
        path, depth = stack.pop()
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        entries, _err = _list_dir(path)
        for e in entries:
            if e.name.endswith(".so") or ".so." in e.name:
                try:
                    if e.is_file():
                        out.append(e.path)
                except OSError:
                    pass
            elif depth < MAX_PREBUILT_DEPTH and e.name != "__pycache__" and _is_dir(e):
                stack.append((e.path, depth + 1))
    return sorted(out)[:MAX_PREBUILT]


