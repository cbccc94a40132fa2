"""The ELF reader on real files built here, and on every kind of bad input."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from envkit import build_extension, make_old_libstdcxx, system_libstdcxx

from zdoctor.readers import elf
from zdoctor.readers.elf import ElfInfo, read_elf
from zdoctor.readers.versions import (
    gcc_release_for,
    gcc_release_providing,
    gcc_series,
    missing,
    newest,
    parse_version,
    sort_key,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("elf")
    (d / "lib.c").write_text("int answer(void) { return 42; }\n")
    out = {}
    out["runpath"] = d / "librun.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(d / "lib.c"), "-o", str(out["runpath"]),
                    "-Wl,-soname,librun.so.1", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib:/opt/x",
                    "-Wl,-z,nodefaultlib", "-Wl,--no-as-needed", "-lm"], check=True)
    out["rpath"] = d / "librp.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(d / "lib.c"), "-o", str(out["rpath"]),
                    "-Wl,--disable-new-dtags,-rpath,$ORIGIN"], check=True)
    out["ext"] = build_extension(d, "needsnew")
    out["old"] = make_old_libstdcxx(d / "old")
    return out


def test_dynamic_tags_of_a_real_library(built):
    info = read_elf(str(built["runpath"]))
    assert info.ok and info.kind == "elf"
    assert (info.elfclass, info.machine, info.elftype) == (64, "EM_X86_64", "ET_DYN")
    assert info.soname == "librun.so.1"
    assert info.runpath == "$ORIGIN/../lib:/opt/x" and info.rpath is None
    assert "libm.so.6" in info.needed and "libc.so.6" in info.needed
    assert info.nodeflib
    assert any(c.startswith("GCC: (") for c in info.compilers())
    rp = read_elf(str(built["rpath"]))
    assert rp.rpath == "$ORIGIN" and rp.runpath is None and not rp.nodeflib


def test_version_needs_and_definitions(built):
    ext = read_elf(str(built["ext"]))
    needs = dict(ext.needs_from("libstdc++.so.6"))
    assert "GLIBCXX_3.4.30" in needs and needs["GLIBCXX_3.4.30"] is False
    system = read_elf(str(system_libstdcxx()))
    assert system.provides("GLIBCXX_3.4.30") and system.newest("GLIBCXX") == "GLIBCXX_3.4.30"
    old = read_elf(str(built["old"]))
    assert old.ok and old.newest("GLIBCXX") == "GLIBCXX_3.4.28" and old.newest("CXXABI") == "CXXABI_1.3.12"
    assert not old.provides("GLIBCXX_3.4.30") and old.provides("GLIBCXX_3.4.19")
    assert missing(ext.needs_from("libstdc++.so.6"), old.verdef) == ["GLIBCXX_3.4.30"]
    assert missing(ext.needs_from("libstdc++.so.6"), system.verdef) == []


def test_the_reader_agrees_with_readelf(built):
    """Every version name readelf -V prints for the extension and libstdc++ is read, and no more."""
    for path in (built["ext"], system_libstdcxx()):
        text = subprocess.run(["readelf", "-V", "-W", str(path)], capture_output=True, text=True).stdout
        info = read_elf(str(path))
        need_names = {ln.split("Name:")[1].split()[0] for ln in text.splitlines() if "Flags:" in ln and "Name:" in ln
                      and "Version:" in ln}
        ours = {v for needs in info.verneed.values() for v, _ in needs}
        assert ours == need_names
        if info.verdef is not None:
            def_section = text.split("Version definition section")[1].split("Version needs section")[0]
            names = {ln.split("Name:")[1].split()[0] for ln in def_section.splitlines() if "Name:" in ln}
            soname = info.soname
            assert set(info.verdef) | {soname} == names


def test_stripped_section_headers_fall_back_to_pt_dynamic(built, tmp_path):
    """With the section header table gone, the dynamic tags still come from PT_DYNAMIC."""
    import struct

    data = bytearray(built["runpath"].read_bytes())
    struct.pack_into("<Q", data, 0x28, 0)  # e_shoff = 0
    struct.pack_into("<HH", data, 0x3C, 0, 0)  # e_shnum = 0, e_shstrndx = 0
    (tmp_path / "stripped.so").write_bytes(bytes(data))
    info = read_elf(str(tmp_path / "stripped.so"))
    assert info.ok, info.error
    assert info.runpath == "$ORIGIN/../lib:/opt/x" and "libm.so.6" in info.needed
    assert info.soname == "librun.so.1" and info.nodeflib


@pytest.mark.parametrize("content,kind", [
    (b"", "not-elf"),
    (b"#!/bin/sh\necho hi\n", "not-elf"),
    (b"\x7fELF\x02\x01\x01", "truncated"),
])
def test_bad_inputs_are_evidence_not_exceptions(tmp_path, content, kind):
    p = tmp_path / "libbad.so"
    p.write_bytes(content)
    info = read_elf(str(p))
    assert info.kind == kind and info.error and not info.ok


def test_truncated_real_library(built, tmp_path):
    data = built["ext"].read_bytes()
    for cut in (64, 2000, len(data) // 2):
        p = tmp_path / f"cut{cut}.so"
        p.write_bytes(data[:cut])
        info = read_elf(str(p))
        assert not info.ok and info.kind in ("truncated", "corrupt"), (cut, info)
        assert "truncated" in info.error or "corrupt" in info.error


def test_garbage_after_a_valid_header(built, tmp_path):
    data = bytearray(built["ext"].read_bytes())
    data[64:4096] = os.urandom(4096 - 64)
    p = tmp_path / "garbage.so"
    p.write_bytes(bytes(data))
    info = read_elf(str(p))  # must not raise, whatever the random bytes are
    assert isinstance(info, ElfInfo)


def test_missing_directory_and_special_files(tmp_path):
    assert read_elf(str(tmp_path / "nope.so")).kind == "missing"
    assert read_elf(str(tmp_path / "a" / "b.so")).kind == "missing"
    assert read_elf(str(tmp_path)).kind == "not-regular"
    fifo = tmp_path / "fifo.so"
    os.mkfifo(fifo)
    assert read_elf(str(fifo)).kind == "not-regular"  # never opened: opening a FIFO would block


def test_huge_sparse_file_is_read_lazily(tmp_path):
    p = tmp_path / "huge.so"
    with open(p, "wb") as fh:
        fh.write(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
        fh.truncate(8 * 1024**3)  # 8 GiB of holes
    info = read_elf(str(p))
    assert not info.ok and info.kind == "not-loadable"


def test_object_files_are_not_loadable(tmp_path):
    (tmp_path / "a.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-c", str(tmp_path / "a.c"), "-o", str(tmp_path / "a.o")], check=True)
    info = read_elf(str(tmp_path / "a.o"))
    assert info.kind == "not-loadable" and "ET_REL" in info.error


def test_unreadable_file(tmp_path, built):
    p = tmp_path / "secret.so"
    shutil.copy(built["rpath"], p)
    p.chmod(0)
    if os.access(p, os.R_OK):  # root reads anything: prove the path through a directory we cannot list
        info = read_elf("/proc/1/root/" + "x" * 300 + ".so")
        assert not info.ok and info.kind in ("unreadable", "missing")
    else:
        assert read_elf(str(p)).kind == "unreadable"


def test_hostile_path_names(built, tmp_path):
    d = tmp_path / "a b $(touch x);\n'\""
    d.mkdir()
    shutil.copy(built["rpath"], d / "lib.so")
    info = read_elf(str(d / "lib.so"))
    assert info.ok and info.rpath == "$ORIGIN"
    assert not (tmp_path / "x").exists()


def test_cache_is_keyed_on_the_file_identity(built, tmp_path):
    p = tmp_path / "lib.so"
    shutil.copy(built["rpath"], p)
    first = read_elf(str(p))
    assert read_elf(str(p)) is first
    link = tmp_path / "link.so"
    link.symlink_to(p)
    assert read_elf(str(link)).path == str(link) and read_elf(str(link)).rpath == first.rpath
    shutil.copy(built["runpath"], p)  # new content, new mtime/size
    os.utime(p, ns=(first.size, os.stat(p).st_mtime_ns + 10**9))
    assert read_elf(str(p)).runpath == "$ORIGIN/../lib:/opt/x"
    elf.cache_clear()
    assert read_elf(str(p)) is not first


def test_round_trip(built):
    info = read_elf(str(built["ext"]))
    again = ElfInfo.from_dict(info.to_dict())
    assert again == info


def test_versions_compare_numerically():
    assert parse_version("GLIBCXX_3.4.9") == ("GLIBCXX", (3, 4, 9))
    assert parse_version("CXXABI_FLOAT128") is None and parse_version("GLIBC_PRIVATE") is None
    names = ["GLIBCXX_3.4.29", "GLIBCXX_3.4.9", "GLIBCXX_3.4", "CXXABI_1.3.13"]
    assert sorted(names, key=sort_key)[-1] == "GLIBCXX_3.4.29"
    assert max(n for n in names if n.startswith("GLIBCXX")) == "GLIBCXX_3.4.9"  # what string order gets wrong
    assert newest(names, "GLIBCXX") == "GLIBCXX_3.4.29"
    assert missing([("GLIBCXX_3.4.30", False), ("GLIBCXX_3.4.31", True)], ["GLIBCXX_3.4.29"]) == ["GLIBCXX_3.4.30"]
    assert missing([("GLIBCXX_3.4.30", False)], None) == []  # no version definitions: passes
    assert gcc_release_for("GLIBCXX_3.4.30") == "12.1" and gcc_release_for("GLIBCXX_3.4.29") == "11.1"
    assert gcc_release_for("CXXABI_1.3.13") == "11.1" and gcc_release_for("GLIBC_2.34") is None
    assert gcc_release_providing(["GLIBCXX_3.4.30", "CXXABI_1.3.13", "GLIBC_2.14"]) == "12.1"
    assert gcc_release_providing(["GLIBCXX_3.4.99"]) is None


def test_gcc_series_of_a_copy():
    assert gcc_series("GLIBCXX_3.4.28") == "9.3 to 10.x"  # conda's old libstdcxx-ng territory
    assert gcc_series("GLIBCXX_3.4.29") == "11.x"  # 11.2 and 11.4 share it: not an ABI break
    assert gcc_series("GLIBCXX_3.4.30") == "12.x"
    assert gcc_series("GLIBCXX_3.4.31") == "13.1"
    assert gcc_series("GLIBCXX_3.4.99") is None and gcc_series(None) is None


def reference(path: Path) -> dict[str, object]:
    """The same fields as pyelftools reads them: the oracle the struct reader is held to."""
    from elftools.elf.dynamic import DynamicSection, DynamicSegment
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

    out: dict[str, object] = {"needed": [], "soname": None, "rpath": None, "runpath": None, "flags_1": 0,
                              "verneed": {}, "verdef": None, "interp": None}
    with open(path, "rb") as fh:
        f = ELFFile(fh)
        out.update(elfclass=f.elfclass, machine=f["e_machine"], elftype=f["e_type"])
        sections = list(f.iter_sections())
        dyn = next((s for s in sections if isinstance(s, DynamicSection)), None)
        dyn = dyn or next((s for s in f.iter_segments() if isinstance(s, DynamicSegment)), None)
        for seg in f.iter_segments():
            if seg["p_type"] == "PT_INTERP":
                out["interp"] = seg.get_interp_name()
        for tag in dyn.iter_tags() if dyn is not None else ():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                out["needed"].append(tag.needed)  # type: ignore[attr-defined]
            elif kind in ("DT_SONAME", "DT_RPATH", "DT_RUNPATH"):
                out[kind[3:].lower()] = getattr(tag, kind[3:].lower())
            elif kind == "DT_FLAGS_1":
                out["flags_1"] = int(tag.entry.d_val)
        for sec in sections:
            if isinstance(sec, GNUVerNeedSection):
                for need, auxes in sec.iter_versions():
                    out["verneed"][need.name] = [(a.name, bool(a["vna_flags"] & elf.VER_FLG_WEAK))  # type: ignore[index]
                                                 for a in auxes]
            elif isinstance(sec, GNUVerDefSection):
                names = []
                for vdef, auxes in sec.iter_versions():
                    first = next(iter(auxes), None)
                    if not vdef["vd_flags"] & elf.VER_FLG_BASE and first is not None:
                        names.append(first.name)
                out["verdef"] = names
    return out


def test_the_struct_reader_reads_what_pyelftools_reads(built, tmp_path):
    """Real files of this machine (the interpreter, the C and C++ runtimes, libraries built here) and one
    whose section headers are gone: every field the loader needs, as pyelftools reads it."""
    files = [Path(os.path.realpath(sys.executable)), system_libstdcxx(), *built.values()]
    files += [Path(p) for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libm.so.6",
                                "/bin/ls") if os.path.exists(p)]
    data = bytearray(system_libstdcxx().read_bytes())
    struct.pack_into("<Q", data, 0x28, 0)
    struct.pack_into("<HH", data, 0x3C, 0, 0)
    (tmp_path / "headless.so").write_bytes(bytes(data))
    files.append(tmp_path / "headless.so")
    for path in files:
        elf.cache_clear()
        info = read_elf(str(path))
        assert info.ok, (path, info.error)
        want = reference(path)
        got = {k: getattr(info, k) for k in want}
        assert got == want, path
