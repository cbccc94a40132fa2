"""``zdoctor build-bundle``: build ``zdoctor.pyz``, one file that runs with any system ``python3`` >= 3.8.1.

The packer is the standard library's zip application format (what ``zipapp`` writes: a ``#!`` line and a
zip with ``__main__.py``), with a bootstrap of our own instead of shiv or pex: shiv extracts the whole
archive on first start and pex installs every wheel into its cache, while zdoctor's bootstrap imports the
Python code from the zip and extracts only psutil's shared object and the few files that other programs
read by path. It needs nothing on the node but the interpreter.

The dependencies are the newest that still support Python 3.8 (pure Python, so one copy serves every
interpreter and both architectures); psutil's native module is bundled twice, from its abi3 wheels for
manylinux x86_64 and aarch64. Wheels come from ``--wheels DIR`` or are downloaded with ``pip download``
(cached under ``$XDG_CACHE_HOME/zdoctor/bundle-wheels``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from zdoctor import __version__
from zdoctor.core.errors import InputError
from zdoctor.core.resources import data_dir

#: Requirements of the bundle: zdoctor's runtime dependencies as resolved for the oldest Python it
#: supports (tomli included: Python < 3.11 needs it). psutil comes from its platform wheels.
REQUIREMENTS = ["textual>=6.2,<7", "rich>=13", "pyelftools>=0.30", "nvidia-ml-py>=12", "networkx>=3.0,<3.2",
                "tomli>=2"]
NATIVE_REQUIREMENT = "psutil>=5.9"
#: The Python the pure dependencies are resolved for (textual needs 3.8.1).
FLOOR_PYTHON = "3.8.1"
PLATFORMS = {
    "x86_64": ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux2010_x86_64", "manylinux_2_12_x86_64"],
    "aarch64": ["manylinux2014_aarch64", "manylinux_2_17_aarch64"],
}
SHEBANG = b"#!/usr/bin/env python3\n"
#: A fixed timestamp for every entry, so two builds of the same inputs are the same file.
EPOCH = (2020, 1, 1, 0, 0, 0)
MAIN = '''\
# zdoctor.pyz: run with `python3 zdoctor.pyz`. This part must parse on any Python, to say which it needs.
import os, sys
if sys.version_info[:3] < (3, 8, 1):
    sys.stderr.write("zdoctor.pyz needs Python 3.8.1 or newer; %s is Python %s\\n"
                     % (sys.executable, sys.version.split()[0]))
    sys.exit(2)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _zdoctor_boot import main
sys.exit(main())
'''
_SKIP = re.compile(r"(^|/)(__pycache__|tests?)(/|$)|\.dist-info/RECORD$|\.pyc$|(^|/)conftest\.py$")


def wheel_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base, "zdoctor", "bundle-wheels")


def _pip_download(dest: Path, args: list[str]) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--only-binary=:all:",
            "--dest", str(dest), *args]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InputError(f"pip download failed ({tail}); give already downloaded wheels with --wheels DIR")


def download_wheels(dest: Path | None = None) -> Path:
    """Download the bundle's wheels (pure ones for Python 3.8.1, psutil for both architectures) into a
    cache directory keyed by the requirements; a complete earlier download is reused."""
    key = hashlib.sha256(json.dumps([REQUIREMENTS, NATIVE_REQUIREMENT, FLOOR_PYTHON, PLATFORMS]).encode())
    dest = dest or wheel_cache() / key.hexdigest()[:16]
    if (dest / "complete").is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    _pip_download(dest, ["--python-version", FLOOR_PYTHON, "--implementation", "py", *REQUIREMENTS])
    for plats in PLATFORMS.values():
        _pip_download(dest, ["--no-deps", "--python-version", "3.8", "--implementation", "cp", "--abi", "abi3",
                             *[x for p in plats for x in ("--platform", p)], NATIVE_REQUIREMENT])
    (dest / "complete").write_text("ok\n")
    return dest


def _wheel_arch(name: str) -> str | None:
    if name.endswith("-none-any.whl"):
        return None
    for arch in PLATFORMS:
        if name.endswith(f"_{arch}.whl"):
            return arch
    raise InputError(f"{name}: not a pure-Python wheel nor one for Linux x86_64 or aarch64")


def _dist(name: str) -> tuple[str, str]:
    parts = name.split("-")
    return parts[0].replace("_", "-"), parts[1]


def _source_tree() -> dict[str, Path]:
    """zdoctor's own files: the package's modules and the data files beside them (``shape.json``), with the
    screens inside it, as in the wheel."""
    pkg = Path(__file__).resolve().parents[2]
    out: dict[str, Path] = {}
    for path in sorted([*pkg.rglob("*.py"), *pkg.rglob("*.json")]):
        rel = path.relative_to(pkg).as_posix()
        if "__pycache__" in rel or rel.startswith("screens/"):
            continue
        out[f"zdoctor/{rel}"] = path
    for path in sorted(data_dir("screens").glob("*.py")):
        out[f"zdoctor/screens/{path.name}"] = path
    return out


def _data_tree() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for name in ("playbooks", "assets"):
        root = data_dir(name)
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            out[f"_zdoctor_data/{name}/{path.relative_to(root).as_posix()}"] = path
    layers = data_dir("layers")  # each node layer's data files (its known messages), read by path
    for path in sorted(layers.glob("*/*.toml")):
        out[f"_zdoctor_data/layers/{path.relative_to(layers).as_posix()}"] = path
    for script in sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py")):
        if script.name != "__init__.py":  # run by path by other interpreters: a file in the zip cannot be run
            out[f"_zdoctor_data/scripts/{script.name}"] = script
    return out


def build(out: Path, wheels: Path | None = None) -> dict:
    """Write the bundle to ``out`` (atomically, mode 0755); returns its manifest."""
    if not Path(__file__).with_name("boot.py").is_file():
        raise InputError("zdoctor build-bundle runs from an installed zdoctor or a source checkout, "
                         "not from inside zdoctor.pyz")
    wheels = wheels or download_wheels()
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise InputError(f"{wheels}: no wheels there")
    entries: dict[str, bytes] = {"__main__.py": MAIN.encode(),
                                 "_zdoctor_boot.py": (Path(__file__).with_name("boot.py")).read_bytes()}
    for name, path in {**_source_tree(), **_data_tree()}.items():
        entries[name] = path.read_bytes()
    deps: dict[str, str] = {}
    native: dict[str, dict[str, str]] = {}
    for whl in found:
        arch = _wheel_arch(whl.name)
        dist, version = _dist(whl.name)
        if deps.get(dist, version) != version:
            raise InputError(f"{wheels}: two versions of {dist} ({deps[dist]} and {version})")
        deps[dist] = version
        with zipfile.ZipFile(whl) as zf:
            for info in zf.infolist():
                if info.is_dir() or _SKIP.search(info.filename):
                    continue
                data = zf.read(info)
                if arch and info.filename.endswith(".so"):
                    name = f"_zdoctor_native/{arch}/{info.filename}"
                    native.setdefault(arch, {})[name] = hashlib.sha256(data).hexdigest()
                    entries[name] = data
                elif entries.setdefault(info.filename, data) != data and ".dist-info/" not in info.filename:
                    raise InputError(f"{whl.name}: {info.filename} differs from another wheel's copy")
    missing = [a for a in PLATFORMS if a not in native]
    if missing:
        raise InputError(f"{wheels}: no psutil wheel for {', '.join(missing)}")
    content = hashlib.sha256()
    for name in sorted(entries):
        content.update(name.encode() + b"\0" + hashlib.sha256(entries[name]).digest())
    manifest = {
        "version": __version__,
        "python_min": FLOOR_PYTHON,
        "deps": deps,
        "native": native,
        "data": {n: hashlib.sha256(d).hexdigest() for n, d in entries.items() if n.startswith("_zdoctor_data/")},
        "content_sha256": content.hexdigest(),
    }
    entries["_zdoctor_bundle/manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=str(out.parent), prefix=f".{out.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(SHEBANG)
            with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
                for name in sorted(entries):
                    info = zipfile.ZipInfo(name, EPOCH)
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = 0o644 << 16
                    zf.writestr(info, entries[name])
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return manifest
