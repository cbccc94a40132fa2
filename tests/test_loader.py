"""The ld.so emulator against the real ld.so: real libraries, real programs, real LD_DEBUG traces."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zdoctor.readers import elf
from zdoctor.readers.loader import (
    LoaderConfig,
    Process,
    expand_dst,
    legacy_subdirs,
    legacy_subdirs_from_hwcap,
    parse_ld_so_help,
    resolve_chain,
    x86_64_hwcap_and_platform,
)

HOSTILE = "we ird $(touch pwned) 'q\" $ORIGINX ${PLAT} `id`"
BASE_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}

TARGET_C = "int target(void) { return 1; }\n"
DLO_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    void *h = dlopen(argv[i], RTLD_NOW);
    if (!h) printf("ERR %s\n", dlerror()); else printf("OK %s\n", argv[i]);
  }
  return 0;
}
"""
# condition_variable::wait(unique_lock&) is GLIBCXX_3.4.30 with g++ 12.
USER_CXX = r"""
#include <condition_variable>
#include <mutex>
std::mutex m;
std::condition_variable cv;
bool ready = true;
extern "C" int user_wait(void) { std::unique_lock<std::mutex> lk(m); cv.wait(lk, []{ return ready; }); return 1; }
extern "C" void user_block(void) { std::unique_lock<std::mutex> lk(m); cv.wait(lk); }
"""
FAKE_NODES = [f"GLIBCXX_3.4.{i}" if i else "GLIBCXX_3.4" for i in range(29)] + \
    [f"CXXABI_1.3.{i}" if i else "CXXABI_1.3" for i in range(13)]


def _cc(*args: str | Path, cxx: bool = False) -> None:
    subprocess.run(["g++" if cxx else "gcc", *map(str, args)], check=True, timeout=300,
                   capture_output=True)


def _shared(out: Path, src: Path, soname: str, *extra: str | Path, cxx: bool = False) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    _cc("-shared", "-fPIC", f"-Wl,-soname,{soname}", "-Wl,--no-as-needed", "-o", out, src, *extra, cxx=cxx)
    return out


def _copy(src: Path, dest_dir: Path, name: str | None = None) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / (name or src.name)
    shutil.copy(src, dest)
    return dest


def _library(soname: str) -> str:
    out = subprocess.run(["gcc", f"-print-file-name={soname}"], capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip()
    assert os.path.isabs(out), out
    return out


def _make_32bit(out: Path, work: Path) -> None:
    """A real ELFCLASS32 shared object, or (without 32-bit binutils) a 64-bit one relabelled."""
    asm, obj = work / "t32.s", work / "t32.o"
    asm.write_text(".globl target\ntarget:\n ret\n")
    try:
        subprocess.run(["as", "--32", "-o", str(obj), str(asm)], check=True, capture_output=True, timeout=60)
        subprocess.run(["ld", "-m", "elf_i386", "-shared", "-soname", "libtarget.so", "-o", str(out), str(obj)],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError):
        data = bytearray((work / "base" / "libtarget.so").read_bytes())
        data[4] = 1  # EI_CLASS = ELFCLASS32
        out.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    r = tmp_path_factory.mktemp("ldlab")
    src = r / "src"
    src.mkdir()
    (src / "t.c").write_text(TARGET_C)
    (src / "dlo.c").write_text(DLO_C)
    (src / "user.cc").write_text(USER_CXX)
    p: dict[str, Path] = {"root": r}
    target = p["target"] = _shared(r / "base/libtarget.so", src / "t.c", "libtarget.so")
    for d in ("A", "B", "P", "E", "F", "L", HOSTILE):
        _copy(target, r / d)
    (r / "bin").mkdir()
    _cc("-o", r / "bin/dlo", src / "dlo.c")
    p["dlo"] = r / "bin/dlo"
    _cc("-o", r / "bin/prog", src / "dlo.c", "-Wl,--no-as-needed", target)
    p["prog"] = r / "bin/prog"
    _cc("-o", r / "bin/dlo_rpath", src / "dlo.c", "-Wl,--disable-new-dtags", f"-Wl,-rpath,{r / 'E'}")
    p["dlo_rpath"] = r / "bin/dlo_rpath"
    # plugins dlopen'ed by path
    p["plain"] = _shared(r / "plugins/plain.so", src / "t.c", "plain.so", target)
    p["runpath"] = _shared(r / "plugins/runpath.so", src / "t.c", "runpath.so", target,
                           "-Wl,--enable-new-dtags", f"-Wl,-rpath,{r / 'F'}")
    p["hostile_plugin"] = _shared(r / "plugins/hostile.so", src / "t.c", "hostile.so", target,
                                  "-Wl,--disable-new-dtags", f"-Wl,-rpath,{r / HOSTILE}")
    p["emptyrp"] = _shared(r / "plugins/emptyrp.so", src / "t.c", "emptyrp.so", target,
                           "-Wl,--enable-new-dtags", "-Wl,-rpath,:/nonexistent-dir")
    p["relrp"] = _shared(r / "plugins/relrp.so", src / "t.c", "relrp.so", target,
                         "-Wl,--enable-new-dtags", "-Wl,-rpath,rel")
    # RPATH chain: libouter (RPATH=chain/o) -> libmid (no paths) -> libtarget in chain/o
    _copy(target, r / "chain/o")
    mid = _shared(r / "chain/o/libmid.so", src / "t.c", "libmid.so", target)
    p["outer"] = _shared(r / "chain/libouter.so", src / "t.c", "libouter.so", mid,
                         "-Wl,--disable-new-dtags", f"-Wl,-rpath,{r / 'chain/o'}")
    # RUNPATH is not inherited: A (RUNPATH=d) -> B -> C, all in d; and the same with RPATH in d2
    libc_ = _shared(r / "rp/d/libC.so", src / "t.c", "libC.so")
    libb = _shared(r / "rp/d/libB.so", src / "t.c", "libB.so", libc_)
    p["runpath_a"] = _shared(r / "rp/d/libA.so", src / "t.c", "libA.so", libb,
                             "-Wl,--enable-new-dtags", f"-Wl,-rpath,{r / 'rp/d'}")
    _copy(libb, r / "rp/d2")
    _copy(libc_, r / "rp/d2")
    p["rpath_a"] = _shared(r / "rp/d2/libA.so", src / "t.c", "libA.so", libb,
                           "-Wl,--disable-new-dtags", f"-Wl,-rpath,{r / 'rp/d2'}")
    # $ORIGIN: link/liborig.so -> ../real/liborig.so; each directory has its own libtarget.so
    _copy(target, r / "origin/real")
    _copy(target, r / "origin/link")
    _shared(r / "origin/real/liborig.so", src / "t.c", "liborig.so", target, "-Wl,--enable-new-dtags",
            "-Wl,-rpath,$ORIGIN")
    os.symlink("../real/liborig.so", r / "origin/link/liborig.so")
    p["orig_link"] = r / "origin/link/liborig.so"
    # DF_1_NODEFLIB: neither the cache nor the system directories may supply libz.so.1
    libz = _library("libz.so.1")
    p["nodeflib"] = _shared(r / "ndl/libndl.so", src / "t.c", "libndl.so", "-Wl,-z,nodefaultlib", libz)
    _copy(Path(os.path.realpath(libz)), r / "zcopy", "libz.so.1")
    # unusable files named like the library
    (r / "W").mkdir()
    _make_32bit(r / "W/libtarget.so", r)
    for d in ("notelf", "empty", "dir"):
        (r / "bad" / d).mkdir(parents=True)
    (r / "bad/notelf/libtarget.so").write_text("not an ELF file, just text that is long enough\n" * 4)
    (r / "bad/empty/libtarget.so").write_bytes(b"")
    (r / "bad/dir/libtarget.so").mkdir()
    # libstdc++: a stand-in lacking GLIBCXX_3.4.29+, a real copy, a user library needing 3.4.30
    nodes, prev = [], None
    lines = []
    for i, node in enumerate(FAKE_NODES):
        lines.append(f"int dummy_{i}(void) {{ return {i}; }}")
        parent = f" {prev}" if prev and node.startswith(prev.split("_")[0]) else ""
        nodes.append(f"{node} {{ global: dummy_{i}; }}{parent};")
        prev = node
    (src / "fake.c").write_text("\n".join(lines) + "\n")
    (src / "fake.map").write_text("\n".join(nodes) + "\n")
    _shared(r / "cxx/fake/libstdc++.so.6", src / "fake.c", "libstdc++.so.6",
            f"-Wl,--version-script,{src / 'fake.map'}")
    _shared(r / "cxx/nover/libstdc++.so.6", src / "fake.c", "libstdc++.so.6")  # no version definitions
    system_stdcxx = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True,
                                   text=True, check=True, timeout=60).stdout.strip()
    _copy(Path(os.path.realpath(system_stdcxx)), r / "cxx/real", "libstdc++.so.6")
    user = p["user"] = _shared(r / "cxx/libuser.so", src / "user.cc", "libuser.so", cxx=True)
    _cc("-o", r / "bin/prog_cxx", src / "dlo.c", "-Wl,--no-as-needed", user, "-Wl,--enable-new-dtags",
        f"-Wl,-rpath,{r / 'cxx'}")
    p["prog_cxx"] = r / "bin/prog_cxx"
    return p


@pytest.fixture(scope="module")
def cfg() -> LoaderConfig:
    return LoaderConfig.detect()


_LINE = re.compile(r"^\s*\d+:\t(.*)$")


@dataclasses.dataclass
class Trace:
    proc: subprocess.CompletedProcess[str]
    lines: list[str]

    def inits(self) -> list[str]:
        return [x.split("calling init: ", 1)[1] for x in self.lines if x.startswith("calling init: ")]

    def inited(self, base: str) -> str:
        hits = [x for x in self.inits() if x == base or x.endswith("/" + base)]
        assert len(hits) == 1, hits
        return hits[0]

    def trying(self, name: str) -> list[str]:
        out: list[str] = []
        inside = False
        for x in self.lines:
            if x.startswith("find library="):
                inside = x.startswith(f"find library={name} ")
            elif x.startswith("file=") and "generating link map" in x:
                inside = False
            elif inside and x.startswith("trying file="):
                out.append(x.split("=", 1)[1])
        return out

    def search_paths(self, label: str) -> list[list[str]]:
        out = []
        for x in self.lines:
            if x.startswith("search path=") and x.endswith(f"({label})"):
                out.append(x[len("search path="):].split("\t")[0].split(":"))
        return out


def real(argv: list[str | Path], env: dict[str, str], tmp: Path, cwd: Path | None = None) -> Trace:
    """Run ``argv`` for real under LD_DEBUG=libs,versions and collect its trace."""
    n = len(list(tmp.glob("trace-*"))) + len(list(tmp.glob("run-*")))
    marker = tmp / f"run-{n}"
    marker.write_text("")
    prefix = tmp / f"trace-{n}"
    full = dict(env, LD_DEBUG="libs,versions", LD_DEBUG_OUTPUT=str(prefix))
    proc = subprocess.run([str(a) for a in argv], env=full, capture_output=True, text=True, timeout=120,
                          cwd=str(cwd) if cwd else None)
    text = "".join(f.read_text(errors="replace") for f in sorted(tmp.glob(f"trace-{n}.*")))
    return Trace(proc, [m.group(1).strip() for m in map(_LINE.match, text.splitlines()) if m])


def emulate(exe: Path | str, env: dict[str, str], cfg: LoaderConfig, *dlopen: Path | str,
            cwd: Path | None = None) -> Process:
    proc = Process(str(exe), env, cfg, cwd=str(cwd) if cwd else None)
    proc.start()
    for path in dlopen:
        proc.dlopen(str(path))
    return proc


def lab_needs(path: Path, soname: str) -> list[tuple[str, bool]]:
    return elf.read_elf(str(path)).needs_from(soname)


def ctypes_ext() -> str:
    import _ctypes

    return str(_ctypes.__file__)


def test_ld_library_path_first_entry_wins(lab, cfg, tmp_path):
    r = lab["root"]
    env = dict(BASE_ENV, LD_LIBRARY_PATH=f"{r / 'A'}/:{r / 'B'}")
    t = real([lab["prog"]], env, tmp_path)
    assert t.proc.returncode == 0, t.proc.stderr
    assert t.inited("libtarget.so") == f"{r / 'A'}/libtarget.so"
    p = emulate(lab["prog"], env, cfg)
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so")
    res = obj.resolution
    assert (res.via, res.label(), res.dir, res.loader) == ("LD_LIBRARY_PATH", "[LD_LIBRARY_PATH]",
                                                           f"{r / 'A'}/", str(lab["prog"]))
    # ';' separates entries too; a missing first entry is passed over
    env = dict(BASE_ENV, LD_LIBRARY_PATH=f"{r / 'nonexistent'};{r / 'B'}")
    t = real([lab["prog"]], env, tmp_path)
    p = emulate(lab["prog"], env, cfg)
    assert p.find_loaded("libtarget.so").name == t.inited("libtarget.so") == f"{r / 'B'}/libtarget.so"
    assert p.find_loaded("libtarget.so").resolution.tried[0].path == f"{r / 'nonexistent'}/libtarget.so"


def test_rpath_chain_through_an_intermediate_loader(lab, cfg, tmp_path):
    r = lab["root"]
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "L"))  # would win if the RPATH chain did not apply
    t = real([lab["dlo"], lab["outer"]], env, tmp_path)
    assert t.proc.stdout.startswith("OK")
    p = emulate(lab["dlo"], env, cfg, lab["outer"])
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == str(r / "chain/o/libtarget.so")
    res = obj.resolution
    assert res.via == "rpath" and res.via_object == str(lab["outer"])
    assert res.loader == str(r / "chain/o/libmid.so")
    assert res.label() == f"[rpath of {lab['outer']}]"
    assert p.find_loaded(str(lab["outer"])).loader is None  # dlopen: no l_loader


def test_executable_rpath_applies_to_dlopened_library_without_runpath(lab, cfg, tmp_path):
    r = lab["root"]
    t = real([lab["dlo_rpath"], lab["plain"]], BASE_ENV, tmp_path)
    p = emulate(lab["dlo_rpath"], BASE_ENV, cfg, lab["plain"])
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == str(r / "E/libtarget.so")
    assert obj.resolution.label() == f"[rpath of {lab['dlo_rpath']}]"

    t = real([lab["dlo_rpath"], lab["runpath"]], BASE_ENV, tmp_path)
    p = emulate(lab["dlo_rpath"], BASE_ENV, cfg, lab["runpath"])
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == str(r / "F/libtarget.so")
    assert obj.resolution.label() == f"[runpath of {lab['runpath']}]"
    assert not any(c.path.startswith(str(r / "E")) for c in obj.resolution.tried)

    # without the executable's RPATH the plain plugin's dependency is not found at all
    t = real([lab["dlo"], lab["plain"]], BASE_ENV, tmp_path)
    p = emulate(lab["dlo"], BASE_ENV, cfg, lab["plain"])
    result = p.dlopens[-1][1]
    assert f"ERR {result.error}" == t.proc.stdout.strip()
    assert result.error == "libtarget.so: cannot open shared object file: No such file or directory"
    assert p.find_loaded(str(lab["plain"])) is None  # a failed dlopen leaves nothing behind


def test_runpath_is_not_inherited(lab, cfg, tmp_path):
    r = lab["root"]
    t = real([lab["dlo"], lab["runpath_a"]], BASE_ENV, tmp_path)
    p = emulate(lab["dlo"], BASE_ENV, cfg, lab["runpath_a"])
    result = p.dlopens[-1][1]
    assert t.proc.stdout.strip() == f"ERR {result.error}"
    assert result.error == "libC.so: cannot open shared object file: No such file or directory"
    assert [o.name for o in result.new_objects] == [str(r / "rp/d/libA.so"), str(r / "rp/d/libB.so")]
    res = p.resolutions_for("libC.so")[-1]
    assert res.path is None and res.loader == str(r / "rp/d/libB.so") and res.label() == "[not found]"
    assert res.tried and not any("/rp/d/" in c.path for c in res.tried)
    assert {c.step for c in res.tried} == {"default"}
    # the candidates in existing directories are exactly the ones ld.so tried
    real_tried = [x for x in t.trying("libC.so") if os.path.isdir(os.path.dirname(x))]
    assert [c.path for c in res.tried if c.reason == "missing"] == real_tried

    # with DT_RPATH instead, the loader's loader's path applies and the chain loads
    t = real([lab["dlo"], lab["rpath_a"]], BASE_ENV, tmp_path)
    p = emulate(lab["dlo"], BASE_ENV, cfg, lab["rpath_a"])
    assert p.dlopens[-1][1].ok
    obj = p.find_loaded("libC.so")
    assert obj.name == t.inited("libC.so") == str(r / "rp/d2/libC.so")
    assert obj.resolution.label() == f"[rpath of {lab['rpath_a']}]"


def test_origin_is_the_symlink_location_not_the_realpath(lab, cfg, tmp_path):
    r = lab["root"]
    t = real([lab["dlo"], lab["orig_link"]], BASE_ENV, tmp_path)
    p = emulate(lab["dlo"], BASE_ENV, cfg, lab["orig_link"])
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == str(r / "origin/link/libtarget.so")
    assert obj.resolution.dir == "$ORIGIN" and obj.resolution.via == "runpath"
    assert p.find_loaded(str(lab["orig_link"])).realpath == str(r / "origin/real/liborig.so")


def test_empty_and_relative_runpath_elements_use_the_cwd(lab, cfg, tmp_path):
    work = tmp_path / "cwd"
    _copy(lab["target"], work)
    _copy(lab["target"], work / "rel")
    for plugin, expected in ((lab["emptyrp"], "libtarget.so"), (lab["relrp"], "rel/libtarget.so")):
        t = real([lab["dlo"], plugin], BASE_ENV, tmp_path, cwd=work)
        p = emulate(lab["dlo"], BASE_ENV, cfg, plugin, cwd=work)
        obj = p.find_loaded("libtarget.so")
        assert obj.name == t.inited("libtarget.so") == expected
        assert obj.realpath == str(work / expected)


def test_nodeflib_skips_cache_and_system_dirs(lab, cfg, tmp_path):
    r = lab["root"]
    t = real([lab["dlo"], lab["nodeflib"]], BASE_ENV, tmp_path)
    p = emulate(lab["dlo"], BASE_ENV, cfg, lab["nodeflib"])
    result = p.dlopens[-1][1]
    assert t.proc.stdout.strip() == f"ERR {result.error}" == "ERR libz.so.1: cannot open shared object file"
    assert cfg.cache_lookup("libz.so.1") is not None  # the cache has it, but may not be used
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "zcopy"))
    t = real([lab["dlo"], lab["nodeflib"]], env, tmp_path)
    p = emulate(lab["dlo"], env, cfg, lab["nodeflib"])
    assert p.find_loaded("libz.so.1").name == t.inited("libz.so.1") == str(r / "zcopy/libz.so.1")


def test_ld_preload_copy_wins_as_already_loaded(lab, cfg, tmp_path):
    r = lab["root"]
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "A"), LD_PRELOAD=str(r / "P/libtarget.so"))
    t = real([lab["prog"]], env, tmp_path)
    p = emulate(lab["prog"], env, cfg)
    assert p.startup.ok
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == str(r / "P/libtarget.so")
    assert obj.resolution.label() == "[LD_PRELOAD]"
    needed = [x for x in p.resolutions_for("libtarget.so") if x.loader == str(lab["prog"])]
    assert [(x.via, x.label(), x.path) for x in needed] == [("already loaded", "[already loaded]", obj.name)]

    # bare names are searched (here through LD_LIBRARY_PATH); a failing preload is only a message
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "B"), LD_PRELOAD="libnope.so libtarget.so")
    t = real([lab["prog"]], env, tmp_path)
    p = emulate(lab["prog"], env, cfg)
    assert t.proc.stderr.splitlines() == p.startup.stderr == [
        "ERROR: ld.so: object 'libnope.so' from LD_PRELOAD cannot be preloaded (cannot open shared object "
        "file): ignored."]
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == str(r / "B/libtarget.so")
    assert (obj.resolution.via, obj.resolution.search) == ("LD_PRELOAD", "LD_LIBRARY_PATH")


def test_etc_ld_so_preload_comes_after_ld_preload(lab, cfg, tmp_path):
    """The machine-wide file cannot be swapped for a real run, so this checks the emulator alone."""
    r = lab["root"]
    preload = tmp_path / "ld.so.preload"
    preload.write_text(f"# site preloads\n  {r / 'P/libtarget.so'}\t:libmissing.so # trailing comment\n")
    conf = dataclasses.replace(cfg, preload_file=str(preload))
    p = emulate(lab["prog"], dict(BASE_ENV, LD_PRELOAD=str(r / "B/libtarget.so")), conf)
    assert [(o.name, o.kind) for o in p.loaded[:3]] == [
        (str(lab["prog"]), "main"), (str(r / "B/libtarget.so"), "preload"), (str(r / "P/libtarget.so"), "preload")]
    assert p.find_loaded("libtarget.so").name == str(r / "B/libtarget.so")  # first SONAME match wins
    assert p.find_loaded(str(r / "P/libtarget.so")).resolution.label() == "[/etc/ld.so.preload]"
    assert p.startup.stderr == ["ERROR: ld.so: object 'libmissing.so' from /etc/ld.so.preload cannot be "
                                "preloaded (cannot open shared object file): ignored."]


def test_wrong_class_copy_is_skipped_silently(lab, cfg, tmp_path):
    r = lab["root"]
    env = dict(BASE_ENV, LD_LIBRARY_PATH=f"{r / 'W'}:{r / 'A'}")
    t = real([lab["prog"]], env, tmp_path)
    assert t.proc.returncode == 0, t.proc.stderr
    p = emulate(lab["prog"], env, cfg)
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == str(r / "A/libtarget.so")
    assert (str(r / "W/libtarget.so"), "wrong ELF class: ELFCLASS32", "LD_LIBRARY_PATH") in obj.resolution.tried
    # only the wrong-class copy: ld.so names the class in its error
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "W"))
    t = real([lab["prog"]], env, tmp_path)
    p = emulate(lab["prog"], env, cfg)
    assert t.proc.returncode == 127
    assert t.proc.stderr.splitlines() == p.startup.stderr == [
        f"{lab['prog']}: error while loading shared libraries: libtarget.so: wrong ELF class: ELFCLASS32"]


@pytest.mark.parametrize("bad, message, at_startup", [
    ("notelf", "invalid ELF header", "invalid ELF header"),
    ("empty", "file too short", "file too short"),
    # before libc is relocated ld.so knows only a few errno texts
    ("dir", "cannot read file data: Is a directory", "cannot read file data: Error 21"),
])
def test_unusable_file_on_the_path_is_fatal(lab, cfg, tmp_path, bad, message, at_startup):
    r = lab["root"]
    path = r / "bad" / bad / "libtarget.so"
    env = dict(BASE_ENV, LD_LIBRARY_PATH=f"{path.parent}:{r / 'A'}")
    t = real([lab["prog"]], env, tmp_path)
    p = emulate(lab["prog"], env, cfg)
    assert t.proc.returncode == 127
    assert t.proc.stderr.splitlines() == p.startup.stderr == [
        f"{lab['prog']}: error while loading shared libraries: {path}: {at_startup}"]
    res = p.startup.resolution
    assert res.path is None and res.error == f"{path}: {at_startup}"
    assert res.tried[-1] == (str(path), message, "LD_LIBRARY_PATH")
    # through dlopen the same search ends with libc's message
    t = real([lab["dlo"], "libtarget.so"], env, tmp_path)
    p = emulate(lab["dlo"], env, cfg, "libtarget.so")
    assert t.proc.stdout.strip() == f"ERR {p.dlopens[-1][1].error}" == f"ERR {path}: {message}"


def test_version_failure_reports_what_ld_so_prints(lab, cfg, tmp_path):
    r = lab["root"]
    fake = r / "cxx/fake/libstdc++.so.6"
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(fake.parent))
    t = real([lab["prog_cxx"]], env, tmp_path)
    assert t.proc.returncode == 1
    p = emulate(lab["prog_cxx"], env, cfg)
    assert t.proc.stderr.splitlines() == p.startup.stderr
    failure = p.startup.failures[0]
    assert failure.message() == f"{fake}: version `GLIBCXX_3.4.30' not found (required by {lab['user']})"
    assert failure.provider_resolution.label() == "[LD_LIBRARY_PATH]"
    assert not p.startup.ok and {f.version for f in p.startup.all_failures} >= {"GLIBCXX_3.4.30"}

    # the same through dlopen (ctypes): only the first miss is reported, all are collected
    code = (f"import ctypes\ntry:\n    ctypes.CDLL({str(lab['user'])!r})\n"
            "except OSError as exc:\n    print(exc)\n")
    t = real([sys.executable, "-c", code], env, tmp_path)
    chain = resolve_chain(sys.executable, env, cfg, [ctypes_ext(), str(lab["user"])])
    result = chain.dlopens[-1][1]
    assert t.proc.stdout.strip() == result.error == result.failures[0].message()
    assert len(result.failures) == 1 and result.all_failures == p.startup.all_failures
    assert chain.find_loaded("libstdc++.so.6") is None  # the failed dlopen was rolled back

    # a provider without version definitions passes every need; start-up only warns, once per need
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "cxx/nover"))
    t = real([lab["prog_cxx"]], env, tmp_path)
    p = emulate(lab["prog_cxx"], env, cfg)
    assert p.startup.ok and not p.startup.failures
    warnings = [x for x in t.proc.stderr.splitlines() if "no version information available" in x]
    assert len(warnings) == len(lab_needs(lab["user"], "libstdc++.so.6")) and warnings == p.startup.stderr
    assert "symbol lookup error" in t.proc.stderr  # binding, which the emulator does not model, fails later

    # a real libstdc++ copy on LD_LIBRARY_PATH is taken and passes; without it, the cache decides
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "cxx/real"))
    t = real([lab["prog_cxx"]], env, tmp_path)
    p = emulate(lab["prog_cxx"], env, cfg)
    assert t.proc.returncode == 0 and p.startup.ok and not p.startup.failures
    assert p.find_loaded("libstdc++.so.6").name == t.inited("libstdc++.so.6") == str(r / "cxx/real/libstdc++.so.6")
    t = real([lab["prog_cxx"]], BASE_ENV, tmp_path)
    p = emulate(lab["prog_cxx"], BASE_ENV, cfg)
    obj = p.find_loaded("libstdc++.so.6")
    assert obj.name == t.inited("libstdc++.so.6") and obj.resolution.label() == "[ld.so.cache]"


def test_hostile_directory_names(lab, cfg, tmp_path):
    r = lab["root"]
    hostile = r / HOSTILE
    env = dict(BASE_ENV, LD_LIBRARY_PATH=f"{hostile}:{r / 'A'}")
    t = real([lab["prog"]], env, tmp_path, cwd=tmp_path)
    p = emulate(lab["prog"], env, cfg, cwd=tmp_path)
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == f"{hostile}/libtarget.so"
    assert obj.resolution.dir == str(hostile)
    # in DT_RPATH, '$ORIGINX' and '${PLAT}' are not DSTs and stay literal
    t = real([lab["dlo"], lab["hostile_plugin"]], BASE_ENV, tmp_path, cwd=tmp_path)
    p = emulate(lab["dlo"], BASE_ENV, cfg, lab["hostile_plugin"], cwd=tmp_path)
    obj = p.find_loaded("libtarget.so")
    assert obj.name == t.inited("libtarget.so") == f"{hostile}/libtarget.so"
    assert obj.resolution.label() == f"[rpath of {lab['hostile_plugin']}]"
    assert not list(tmp_path.rglob("pwned")) and not list(r.rglob("pwned"))


def test_resolve_chain_earlier_import_wins(lab, cfg, tmp_path):
    r = lab["root"]
    code = f"import ctypes\nctypes.CDLL({str(lab['runpath'])!r})\nctypes.CDLL({str(lab['orig_link'])!r})\n"
    t = real([sys.executable, "-c", code], BASE_ENV, tmp_path)
    assert t.proc.returncode == 0, t.proc.stderr
    chain = resolve_chain(sys.executable, BASE_ENV, cfg, [ctypes_ext(), str(lab["runpath"]), str(lab["orig_link"])])
    assert all(res.ok for _path, res in chain.dlopens)
    assert chain.find_loaded("libtarget.so").name == t.inited("libtarget.so") == str(r / "F/libtarget.so")
    second = [x for x in chain.resolutions_for("libtarget.so") if x.loader == str(lab["orig_link"])]
    assert [x.label() for x in second] == ["[already loaded]"]
    # every object the emulator maps was really initialised (python also imports more modules itself)
    assert {o.name for o in chain.loaded} - {chain.main.name} <= set(t.inits())


def test_system_search_path_and_detect_match_the_real_loader(lab, cfg, tmp_path):
    r = lab["root"]
    env = dict(BASE_ENV, LD_LIBRARY_PATH=str(r / "A"))
    t = real([lab["dlo"], "libnothere.so"], env, tmp_path)
    p = emulate(lab["dlo"], env, cfg, "libnothere.so")
    assert t.proc.stdout.strip() == f"ERR {p.dlopens[-1][1].error}"
    expected_system = [f"{d}/{s}".rstrip("/") for d in cfg.system_dirs for s in cfg.subdirs()]
    assert t.search_paths("system search path")[0] == expected_system
    assert t.search_paths("LD_LIBRARY_PATH")[0] == [f"{r / 'A'}/{s}".rstrip("/") for s in cfg.subdirs()]
    res = p.resolutions_for("libnothere.so")[-1]
    real_tried = [x for x in t.trying("libnothere.so") if os.path.isdir(os.path.dirname(x))]
    assert [c.path for c in res.tried if c.reason == "missing"] == real_tried

    helped = subprocess.run([cfg.ld_so, "--help"], capture_output=True, text=True, env={"LC_ALL": "C"},
                            timeout=30).stdout
    assert cfg.source == "ld.so"
    assert cfg.system_dirs == [n for n, note in parse_ld_so_help(helped)["system_dirs"] if "system" in note]
    assert LoaderConfig.detect() is LoaderConfig.detect()
    fallback = LoaderConfig.detect(str(tmp_path / "no-ld.so"))
    assert fallback.source == "defaults" and fallback.system_dirs == cfg.system_dirs
    assert fallback.cache == cfg.cache


def test_from_ld_so_output_without_diagnostics_or_legacy():
    help_text = ("Shared library search path:\n  (libraries located via /etc/ld.so.cache)\n"
                 "  /lib64 (system search path)\n  /usr/lib64 (system search path)\n\n"
                 "Subdirectories of glibc-hwcaps directories, in priority order:\n"
                 "  x86-64-v4\n  x86-64-v3 (supported, searched)\n  x86-64-v2 (supported, searched)\n")
    conf = LoaderConfig.from_ld_so_output("", help_text, read_cache=False)
    assert conf.system_dirs == ["/lib64", "/usr/lib64"]
    assert conf.hwcaps_subdirs == ["x86-64-v3", "x86-64-v2"] and conf.legacy_subdirs == []
    assert conf.subdirs() == ["glibc-hwcaps/x86-64-v3/", "glibc-hwcaps/x86-64-v2/", ""]
    diag = ('dl_dst_lib="lib64"\ndl_hwcaps_subdirs="x86-64-v4:x86-64-v3:x86-64-v2"\n'
            'dl_hwcaps_subdirs_active=0x6\ndl_platform="x86_64"\npath.system_dirs[0x1]="/usr/lib64/"\n'
            'path.system_dirs[0x0]="/lib64/"\nversion.version="2.39"\n')
    conf = LoaderConfig.from_ld_so_output(diag, "", read_cache=False)
    assert (conf.system_dirs, conf.dst_lib, conf.platform, conf.glibc_version) == (
        ["/lib64", "/usr/lib64"], "lib64", "x86_64", "2.39")
    assert conf.hwcaps_subdirs == ["x86-64-v3", "x86-64-v2"]
    assert legacy_subdirs(["haswell", "tls", "x86_64"], "haswell")[:3] == ["tls/haswell/x86_64", "tls/haswell",
                                                                          "tls/x86_64"]


def test_dst_expansion_rules():
    assert expand_dst("$ORIGIN/../lib:${ORIGIN}/x", "/o", "lib64", "haswell") == "/o/../lib:/o/x"
    assert expand_dst("$ORIGINX/$LIB/${PLATFORM}", "/o", "lib64", "haswell") == "$ORIGINX/lib64/haswell"
    assert expand_dst("$(id)/${PLAT}/$", "/o", "lib", "p") == "$(id)/${PLAT}/$"
    assert expand_dst("/x/$PLATFORM", "/o", "lib", None) is None  # known token without value: dropped


def test_whole_stdlib_extension_closure_matches(cfg, tmp_path):
    exts = sorted(glob.glob(os.path.join(os.path.dirname(ctypes_ext()), "*.so")))
    assert len(exts) > 10
    code = ("import ctypes, sys\nfor p in sys.argv[1:]:\n    try:\n        ctypes.CDLL(p)\n"
            "    except OSError as exc:\n        print(exc)\n")
    t = real([sys.executable, "-c", code, *exts], BASE_ENV, tmp_path)
    elf.cache_clear()
    chain = resolve_chain(sys.executable, BASE_ENV, cfg, [ctypes_ext(), *exts])
    errors = [res.error for _p, res in chain.dlopens if res.error]
    assert errors == t.proc.stdout.splitlines()
    assert {o.name for o in chain.loaded} - {chain.main.name} == set(t.inits()) - {chain.main.name}


HWCAPS_AMD = Path(__file__).parent / "fixtures" / "lddebug" / "hwcaps-amd-2.36"


def _recorded_system_search(trace: str) -> list[str]:
    line = next(x for x in trace.splitlines() if "(system search path)" in x)
    return re.search(r"search path=(\S+)", line).group(1).split(":")


def test_legacy_hwcap_subdirs_match_the_recorded_amd_loader():
    """An AMD EPYC (AT_PLATFORM x86_64, glibc 2.36): ld.so searched tls/x86_64/x86_64 and tls/x86_64 twice."""
    diag = (HWCAPS_AMD / "list-diagnostics.txt").read_text()
    helped = (HWCAPS_AMD / "help.txt").read_text()
    trace = (HWCAPS_AMD / "dlopen-missing.ld").read_text()
    recorded = _recorded_system_search(trace)
    assert "/lib/x86_64-linux-gnu/tls/x86_64/x86_64" in recorded
    for diag_text, help_text in ((diag, helped), (diag, ""), ("", helped)):
        conf = LoaderConfig.from_ld_so_output(diag_text, help_text, read_cache=False)
        emulated = [f"{d}/{s}".rstrip("/") for d in conf.system_dirs for s in conf.subdirs()]
        assert emulated == recorded
    tried = [re.search(r"trying file=(\S+)", x).group(1) for x in trace.splitlines() if "trying file=" in x]
    conf = LoaderConfig.from_ld_so_output(diag, helped, read_cache=False)
    assert tried == [f"{d}/{s}libzdoctor-nothere.so" for d in conf.system_dirs for s in conf.subdirs()]


def test_legacy_hwcap_subdirs_follow_glibc_for_intel_and_from_cpu_flags():
    # glibc 2.36 on an Intel CPU with AVX-512: dl_hwcap = x86_64|avx512_1, platform haswell.
    intel = legacy_subdirs_from_hwcap(0x6, "haswell")
    assert intel[0] == "tls/haswell/avx512_1/x86_64" and intel.index("tls") == 7
    assert intel[7:] == ["tls", "haswell/avx512_1/x86_64", "haswell/avx512_1", "haswell/x86_64", "haswell",
                         "avx512_1/x86_64", "avx512_1", "x86_64"]
    assert legacy_subdirs(["haswell", "tls", "avx512_1", "x86_64"], "haswell") == intel
    amd = legacy_subdirs_from_hwcap(0x2, "x86_64")
    assert amd == ["tls/x86_64/x86_64", "tls/x86_64", "tls/x86_64", "tls", "x86_64/x86_64", "x86_64", "x86_64"]
    assert legacy_subdirs(["x86_64", "tls", "x86_64"], "x86_64") == amd
    assert legacy_subdirs_from_hwcap(0x2, None) == ["tls/x86_64", "tls", "x86_64"]
    avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "bmi1", "bmi2",
              "abm", "movbe", "popcnt"}
    assert x86_64_hwcap_and_platform(avx512, "AuthenticAMD") == (0x2, "x86_64")
    assert x86_64_hwcap_and_platform(avx512, "GenuineIntel") == (0x6, "haswell")
    assert x86_64_hwcap_and_platform(avx512 | {"avx512er", "avx512pf"}, "GenuineIntel") == (0x2, "xeon_phi")
    assert x86_64_hwcap_and_platform({"sse2"}, "GenuineIntel") == (0x2, "x86_64")
    diag_239 = (HWCAPS_AMD / "list-diagnostics.txt").read_text().replace('"2.36"', '"2.39"')
    assert LoaderConfig.from_ld_so_output(diag_239, "", read_cache=False).legacy_subdirs == []


def test_defaults_from_cpu_flags_search_the_subdirs_the_real_loader_searches(cfg):
    """Without ld.so's own output (--list-diagnostics and --help missing), the CPU flags and this process's
    glibc give the same hwcaps and legacy subdirectories as the real loader on this machine."""
    if cfg.source != "ld.so":
        pytest.skip("the real loader's configuration could not be read here")
    guessed = LoaderConfig.defaults(read_cache=False)
    assert guessed.subdirs() == cfg.subdirs()
