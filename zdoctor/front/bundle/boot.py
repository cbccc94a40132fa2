"""The bootstrap of ``zdoctor.pyz`` (copied into the zip as ``_zdoctor_boot.py``; standard library only).

Python modules are imported straight from the zip. Their bytecode is cached per interpreter under the
per-user cache, so later starts do not compile again. Only what cannot be used from inside a zip is
extracted, to the same cache: psutil's shared object for this machine's architecture, the playbooks,
assets and node layers' data files the code reads as files, and the probe script that other interpreters
run. The cache directory is ``$XDG_CACHE_HOME/zdoctor/bundle/<version>-<content hash>`` (default
``~/.cache``), mode 0700 and owned by the user; every extracted file is written atomically (temporary file,
then rename) and verified against the SHA-256 recorded in the bundle's manifest on every start. Nothing is
written anywhere else, in particular not into the Python environment that runs the bundle.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import marshal
import os
import stat
import sys
import zipimport

try:  # the built-in hash modules: hashlib would load OpenSSL, which costs more than the hashing
    from _sha256 import sha256
except ImportError:  # Python 3.12 and newer
    try:
        from _sha2 import sha256  # type: ignore[no-redef]
    except ImportError:
        from hashlib import sha256  # type: ignore[no-redef]

MANIFEST = "_zdoctor_bundle/manifest.json"
NATIVE = "_zdoctor_native"
DATA = "_zdoctor_data"
ARCHES = ("x86_64", "aarch64")
MIN_PYTHON = (3, 8, 1)


class BundleError(Exception):
    """A bundle that cannot start here: the message is one line for the user (exit code 2)."""


def _machine() -> str:
    m = os.uname().machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def _python_version() -> str:
    return sys.version.split()[0]


def check_platform() -> str:
    """This machine's architecture, or :class:`BundleError` when the bundle cannot run here."""
    arch = _machine()
    if not sys.platform.startswith("linux") or arch not in ARCHES:
        raise BundleError(f"zdoctor.pyz runs on Linux x86_64 and aarch64; this machine is {sys.platform} "
                          f"{arch or 'of unknown architecture'}")
    if sys.version_info[:3] < MIN_PYTHON:
        raise BundleError(f"zdoctor.pyz needs Python 3.8.1 or newer; {sys.executable} is Python "
                          f"{_python_version()}")
    return arch


def _private_dir(path: str) -> None:
    """Create ``path`` (mode 0700) or accept it only as a real directory owned by this user, closed to others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise BundleError(f"zdoctor.pyz: cache {path} is not a directory (a symlink or a file is in its place)")
    if st.st_uid != os.getuid():
        raise BundleError(f"zdoctor.pyz: cache {path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)


def _temp_dir() -> str:
    for name in ("TMPDIR", "TEMP", "TMP"):
        d = os.environ.get(name)
        if d and os.path.isabs(d) and os.path.isdir(d):
            return d
    return "/tmp"


def _cache_root() -> str:
    """``$XDG_CACHE_HOME/zdoctor/bundle`` (``~/.cache`` by default); a private directory in the temporary
    directory when there is no usable home or the cache there is not private."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        base = os.path.join(home, ".cache") if os.path.isabs(home) else ""
    last: Exception | None = None
    if base:
        try:
            os.makedirs(base, mode=0o700, exist_ok=True)
            for d in (os.path.join(base, "zdoctor"), os.path.join(base, "zdoctor", "bundle")):
                _private_dir(d)
            return os.path.join(base, "zdoctor", "bundle")
        except (OSError, BundleError) as exc:
            last = exc
    tmp = os.path.join(_temp_dir(), f"zdoctor-{os.getuid()}")
    try:
        for d in (tmp, os.path.join(tmp, "bundle")):
            _private_dir(d)
        return os.path.join(tmp, "bundle")
    except (OSError, BundleError) as exc:
        raise BundleError(f"zdoctor.pyz: no private cache directory can be made ({last or exc})") from None


def _sha256(data: bytes) -> str:
    return sha256(data).hexdigest()


class Archive:
    """The bundle's zip, read through zipimport: the interpreter has already read its directory to start
    ``__main__``, so nothing is parsed twice (zipfile, slower to import and to open, is the fallback)."""

    def __init__(self, path: str) -> None:
        files = getattr(zipimport, "_zip_directory_cache", {}).get(path)
        if files is not None:
            names = [n.replace(os.sep, "/") for n in files]
        else:
            import zipfile

            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        self.names = {n for n in names if not n.endswith("/")}
        self._zi = zipimport.zipimporter(path)

    def read(self, name: str) -> bytes:
        if name not in self.names:
            raise KeyError(name)
        return self._zi.get_data(name)


def _verified(path: str, digest: str) -> bool:
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return False
        with open(path, "rb") as fh:
            return _sha256(fh.read()) == digest
    except OSError:
        return False


def _write_atomic(path: str, data: bytes, mode: int) -> None:
    """Write to a new file beside ``path`` (O_EXCL, mode 0600), then rename it over ``path``."""
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.urandom(8).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _relative(name: str) -> str:
    """A zip name without its ``_zdoctor_data/`` or ``_zdoctor_native/ARCH/`` prefix."""
    return name.split("/", 2)[2] if name.startswith(NATIVE + "/") else name.split("/", 1)[1]


def extract(zf: Archive, files: dict, root: str) -> None:
    """Extract ``files`` (zip name -> SHA-256) under ``root``; each is verified first and rewritten when
    missing or different (atomically, so concurrent starts never see half a file)."""
    _private_dir(root)
    for name, digest in sorted(files.items()):
        rel = _relative(name)
        target = os.path.join(root, *rel.split("/"))
        if _verified(target, digest):
            continue
        d = root
        for part in rel.split("/")[:-1]:
            d = os.path.join(d, part)
            _private_dir(d)
        data = zf.read(name)
        if _sha256(data) != digest:
            raise BundleError(f"zdoctor.pyz: {name} does not match its recorded hash (damaged bundle)")
        _write_atomic(target, data, 0o500 if name.endswith(".so") else 0o400)
        if not _verified(target, digest):
            raise BundleError(f"zdoctor.pyz: {target} could not be written and verified")


class _ZipSourceLoader(importlib.abc.Loader):
    """Loads one module's source from the zip; its bytecode is cached in the bundle's private cache."""

    def __init__(self, bundle: _Bundle, fullname: str, name: str, package: bool) -> None:
        self.bundle, self.fullname, self.name, self.package = bundle, fullname, name, package
        self.path = f"{bundle.archive}/{name}"

    def create_module(self, spec):  # noqa: ANN001 - importlib protocol
        return None

    def is_package(self, fullname: str) -> bool:
        return self.package

    def get_filename(self, fullname: str) -> str:
        return self.path

    def get_source(self, fullname: str) -> str:
        return importlib.util.decode_source(self.bundle.zf.read(self.name))

    def get_data(self, path: str) -> bytes:
        prefix = self.bundle.archive + "/"
        if not path.startswith(prefix):
            raise OSError(f"{path} is not in the bundle")
        return self.bundle.zf.read(path[len(prefix):])

    def get_code(self, fullname: str):  # noqa: ANN201 - a code object
        cached = os.path.join(self.bundle.pyc_dir, self.name.replace("/", "%") + "c")
        try:
            with open(cached, "rb") as fh:
                return marshal.loads(fh.read())
        except (OSError, EOFError, ValueError, TypeError):
            pass
        code = compile(self.bundle.zf.read(self.name), self.path, "exec", dont_inherit=True)
        with contextlib.suppress(OSError):
            _write_atomic(cached, marshal.dumps(code), 0o600)
        return code

    def exec_module(self, module) -> None:  # noqa: ANN001 - importlib protocol
        exec(self.get_code(self.fullname), module.__dict__)  # noqa: S102 - the module's own code


class _ZipFinder:
    """The path-entry finder for one directory of the zip (the archive itself or a package in it)."""

    def __init__(self, bundle: _Bundle, prefix: str) -> None:
        self.bundle, self.prefix = bundle, prefix

    def invalidate_caches(self) -> None:
        pass

    def iter_modules(self, prefix: str = ""):  # noqa: ANN201 - pkgutil protocol
        """The modules and packages directly in this directory, as pkgutil.iter_modules asks them."""
        seen = set()
        for n in sorted(self.bundle.names):
            if not n.startswith(self.prefix):
                continue
            head, sep, tail = n[len(self.prefix):].partition("/")
            if sep and tail == "__init__.py":
                name, is_package = head, True
            elif not sep and head.endswith(".py") and head != "__init__.py":
                name, is_package = head[:-3], False
            else:
                continue
            if name not in seen:
                seen.add(name)
                yield prefix + name, is_package

    def find_spec(self, fullname: str, target=None):  # noqa: ANN001, ANN201 - importlib protocol
        base = self.prefix + fullname.rpartition(".")[2]
        names, dirs = self.bundle.names, self.bundle.dirs
        if base + "/__init__.py" in names:
            loader = _ZipSourceLoader(self.bundle, fullname, base + "/__init__.py", True)
            spec = importlib.machinery.ModuleSpec(fullname, loader, origin=loader.path, is_package=True)
            spec.submodule_search_locations = [f"{self.bundle.archive}/{base}"]
            spec.has_location = True
            return spec
        if base + ".py" in names:
            loader = _ZipSourceLoader(self.bundle, fullname, base + ".py", False)
            spec = importlib.machinery.ModuleSpec(fullname, loader, origin=loader.path, is_package=False)
            spec.has_location = True
            return spec
        if base in dirs:
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = [f"{self.bundle.archive}/{base}"]
            return spec
        return None


class _NativeFinder:
    """Finds the extracted extension modules (``psutil._psutil_linux``) by their full name."""

    def __init__(self, modules: dict) -> None:
        self.modules = modules

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001, ANN201
        so = self.modules.get(fullname)
        if so is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, so, loader=importlib.machinery.ExtensionFileLoader(fullname, so))


class _Bundle:
    """The open archive: its names, manifest and private cache."""

    def __init__(self, archive: str) -> None:
        self.archive = archive
        self.zf = Archive(archive)
        self.names = self.zf.names
        self.dirs = {n.rsplit("/", 1)[0] for n in self.names if "/" in n}
        more = set()
        for d in self.dirs:
            while "/" in d:
                d = d.rsplit("/", 1)[0]
                more.add(d)
        self.dirs |= more
        self.manifest = json.loads(self.zf.read(MANIFEST).decode("utf-8"))
        self.pyc_dir = ""

    def hook(self, path: str) -> _ZipFinder:
        if path == self.archive:
            return _ZipFinder(self, "")
        if path.startswith(self.archive + "/"):
            rel = path[len(self.archive) + 1:].strip("/")
            if rel in self.dirs:
                return _ZipFinder(self, rel + "/")
        raise ImportError("not inside zdoctor.pyz")


def version_line(manifest: dict) -> str:
    """``zdoctor X (bundle; Python ...; dep versions; psutil for ...)``."""
    deps = ", ".join(f"{k} {v}" for k, v in sorted(manifest["deps"].items(), key=lambda kv: kv[0].lower()))
    return (f"zdoctor {manifest['version']} (one-file bundle {manifest['content_sha256'][:12]}, running on Python "
            f"{_python_version()} {_machine()}; bundled: {deps}; native modules for "
            f"{', '.join(sorted(manifest['native']))})")


def start(archive: str) -> _Bundle:
    """Open the bundle at ``archive``, prepare the cache and the import system; returns the bundle."""
    arch = check_platform()
    bundle = _Bundle(archive)
    man = bundle.manifest
    root = os.path.join(_cache_root(), f"{man['version']}-{man['content_sha256'][:16]}")
    _private_dir(root)
    native = man["native"].get(arch) or {}
    extract(bundle.zf, native, os.path.join(root, "native"))
    extract(bundle.zf, man["data"], os.path.join(root, "data"))
    bundle.pyc_dir = os.path.join(root, "pyc-" + (sys.implementation.cache_tag or "none"))
    _private_dir(bundle.pyc_dir)
    modules = {}
    for name in native:
        rel = _relative(name)
        modname = rel.split(".", 1)[0].replace("/", ".")
        modules[modname] = os.path.join(root, "native", *rel.split("/"))
    sys.meta_path.insert(0, _NativeFinder(modules))
    sys.path_hooks.insert(0, bundle.hook)
    sys.path[:] = [p for p in sys.path if p != archive and not p.startswith(archive + "/")]
    sys.path.insert(0, archive)
    sys.path_importer_cache.pop(archive, None)
    for key in [k for k in sys.path_importer_cache if k.startswith(archive + "/")]:
        del sys.path_importer_cache[key]
    import zdoctor.core.resources

    zdoctor.core.resources.DATA_ROOT = __import__("pathlib").Path(root, "data")
    zdoctor.core.resources.BUNDLE = __import__("pathlib").Path(archive)
    return bundle


def _isolate(archive: str, argv: list) -> None:
    """Run again as ``python -I -S`` (no PYTHONPATH, no user or system site-packages, no sitecustomize) so
    nothing installed around the interpreter can shadow what the bundle carries. Best effort: an
    interpreter that cannot be re-executed runs the bundle as it is, with the bundle first on sys.path."""
    if sys.flags.isolated and sys.flags.no_site:
        return
    if not sys.executable or not os.access(sys.executable, os.X_OK):
        return
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", archive, *argv])
    except OSError:
        return


def main() -> int:
    """The bundle's entry point: ``python3 zdoctor.pyz [zdoctor arguments]``."""
    archive = os.path.abspath(sys.argv[0])
    argv = sys.argv[1:]
    try:
        if argv == ["--version"]:
            check_platform()
            print(version_line(json.loads(Archive(archive).read(MANIFEST).decode("utf-8"))))
            return 0
        _isolate(archive, argv)
        start(archive)
    except BundleError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except (OSError, zipimport.ZipImportError, KeyError, ValueError) as exc:
        print(f"zdoctor.pyz: cannot start from {archive}: {exc}", file=sys.stderr)
        return 2
    from zdoctor.front.cli import main as zdoctor_main

    sys.argv[0] = "zdoctor"
    return zdoctor_main(argv)
