"""torch's JIT extension cache read from real files: layout, locks, build.ninja, real and damaged .so
files, hostile names, symlink loops, bounds, and the prebuilt ops of a DeepSpeed package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from zdoctor.readers import jitcache as jc
from zdoctor.readers import mounts

SOURCE = r"""
#include <string>
#include <stdexcept>
extern "C" int op_entry(const char *s) {
    std::string v(s);
    if (v.empty()) throw std::runtime_error("empty");
    return static_cast<int>(v.size());
}
"""


@pytest.fixture(scope="module")
def real_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real shared library built by this machine's g++, like a JIT-built op."""
    d = tmp_path_factory.mktemp("gxx")
    src = d / "op.cpp"
    src.write_text(SOURCE)
    out = d / "op.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True, timeout=120)
    return out


def gxx_version() -> str:
    return subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True, check=True).stdout.strip()


def make_op(root: Path, name: str, *, so: Path | bytes | None = None, so_name: str | None = None,
            lock: bool = False, cxx: str | None = "c++") -> Path:
    """An op dir as torch leaves it: build.ninja, optionally the built .so and a lock."""
    d = root / name
    d.mkdir(parents=True)
    if cxx is not None:
        (d / "build.ninja").write_text(f"ninja_required_version = 1.3\ncxx = {cxx}\n\ncflags = -O3\n"
                                       "rule compile\n  command = $cxx -c $in -o $out\n")
    if so is not None:
        target = d / (so_name or f"{name}.so")
        if isinstance(so, Path):
            shutil.copyfile(so, target)
        else:
            target.write_bytes(so)
    if lock:
        os.close(os.open(d / "lock", os.O_CREAT | os.O_EXCL))
    return d


def test_roots_follow_torch_rules(tmp_path: Path) -> None:
    ext = tmp_path / "ext"
    assert jc.extension_roots({"TORCH_EXTENSIONS_DIR": str(ext), "HOME": str(tmp_path)}) == [str(ext)]
    home = tmp_path / "home"
    base = home / ".cache" / "torch_extensions"
    # Nothing built yet: the base itself, so callers can say where they looked.
    assert jc.extension_roots({"HOME": str(home)}) == [str(base)]
    for tag in ("py311_cpu", "py310_cu121", "py313t_rocm62"):
        (base / tag).mkdir(parents=True)
    (base / "py39_cpu").write_text("a file, not a tag dir")
    assert jc.extension_roots({"HOME": str(home)}) == [str(base / t) for t in
                                                       ("py310_cu121", "py311_cpu", "py313t_rocm62")]
    # Older torch put op dirs straight under the base: then the base is a root too.
    (base / "cpu_adam").mkdir()
    assert jc.extension_roots({"HOME": str(home)})[-1] == str(base)
    xdg = tmp_path / "xdg"
    assert jc.cache_base({"HOME": str(home), "XDG_CACHE_HOME": str(xdg)}) == (
        str(xdg / "torch_extensions"), "XDG_CACHE_HOME")


def test_scan_reads_an_op_dir_like_torch_leaves_it(tmp_path: Path, real_so: Path) -> None:
    root = tmp_path / "ext"
    make_op(root, "cpu_adam", so=real_so, lock=True, cxx="ccache g++")
    old = time.time() - 3600
    os.utime(root / "cpu_adam" / "lock", (old, old))
    make_op(root, "fused_adam", cxx="c++")  # never built
    env = {"TORCH_EXTENSIONS_DIR": str(root), "PATH": os.environ["PATH"]}
    ops = {op.name: op for op in jc.scan_jit_cache(env)}
    assert set(ops) == {"cpu_adam", "fused_adam"}
    op = ops["cpu_adam"]
    assert op.so_path == str(root / "cpu_adam" / "cpu_adam.so")
    assert op.lock_path == str(root / "cpu_adam" / "lock")
    assert 3590 <= op.lock_age_s <= 3700
    assert op.lock_regular and op.lock_kind == "file" and op.lock_ino == os.stat(op.lock_path).st_ino
    assert op.build_cxx == "ccache g++" and op.build_compiler == "g++"
    assert op.build_compiler_realpath == os.path.realpath(shutil.which("g++"))
    assert op.so_info["kind"] == "elf" and op.so_info["error"] is None
    assert op.so_info["compiler_version"] == gxx_version()
    assert op.so_info["glibcxx_newest"].startswith("GLIBCXX_3.4")
    assert op.in_use is True and op.tag is None and not op.corrupt
    assert ops["fused_adam"].so_path is None and ops["fused_adam"].lock_path is None
    # Facts must be plain JSON and survive a round trip.
    again = jc.JitOp.from_dict(json.loads(json.dumps(op.to_dict())))
    assert again == op


def test_versioned_so_is_the_one_loaded(tmp_path: Path, real_so: Path) -> None:
    root = tmp_path / "ext"
    d = make_op(root, "quantizer", so=real_so, so_name="quantizer_v1.so")
    shutil.copyfile(real_so, d / "quantizer_v3.so")
    (op,) = jc.scan_jit_cache({"TORCH_EXTENSIONS_DIR": str(root)})
    assert op.so_path == str(d / "quantizer_v3.so")
    assert len(op.so_files) == 2


def test_tags_against_the_target_interpreter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = home / ".cache" / "torch_extensions"
    make_op(base / "py310_cpu", "cpu_adam", lock=True)
    make_op(base / "py311_cpu", "cpu_adam", lock=True)
    make_op(base / "py311_cu121", "cpu_adam")
    env = {"HOME": str(home)}
    ops = {op.tag: op for op in jc.scan_jit_cache(env, "3.11.7 (main, Jan  1 2024) [GCC 12.2.0]")}
    assert ops["py310_cpu"].python_tag_mismatch is True and ops["py310_cpu"].in_use is False
    assert ops["py311_cpu"].python_tag_mismatch is False and ops["py311_cpu"].in_use is None
    # With torch's build known, only the exact tag is in use.
    expected = jc.expected_tag("3.11.7", "", "12.1", None, torch_known=True)
    assert expected == "py311_cu121"
    ops = {op.tag: op for op in jc.scan_jit_cache(env, "3.11.7", expected=expected)}
    assert [t for t, op in ops.items() if op.in_use] == ["py311_cu121"]
    assert jc.expected_tag("3.13.1", "t", None, None, torch_known=True) == "py313t_cpu"
    assert jc.expected_tag("3.11.7", "", None, None, torch_known=False) is None
    # Without an interpreter version nothing is claimed.
    assert {op.python_tag_mismatch for op in jc.scan_jit_cache(env)} == {None}


def test_damaged_so_files_are_named_and_others_unaffected(tmp_path: Path, real_so: Path) -> None:
    root = tmp_path / "ext"
    make_op(root, "good", so=real_so)
    make_op(root, "garbage", so=b"this is not an ELF file at all\n" * 10)
    make_op(root, "empty", so=b"")
    make_op(root, "trunc", so=real_so.read_bytes()[:600])  # a link killed part-way
    ops = {op.name: op for op in jc.scan_jit_cache({"TORCH_EXTENSIONS_DIR": str(root)})}
    assert ops["good"].so_info["kind"] == "elf" and not ops["good"].corrupt
    assert ops["garbage"].so_info["kind"] == "not-elf" and ops["garbage"].corrupt
    assert ops["empty"].so_info["kind"] == "not-elf" and "empty" in ops["empty"].so_info["error"]
    assert ops["trunc"].so_info["kind"] in ("truncated", "corrupt") and ops["trunc"].corrupt


def test_hostile_names_loops_and_fifos_never_break_the_scan(tmp_path: Path, real_so: Path) -> None:
    root = tmp_path / "ext"
    names = ["a b", "x\ny", "$(touch PWNED)", "q'uote", "-rf", "tab\there"]
    for n in names:
        make_op(root, n, so=real_so, lock=True)
    raw = os.fsencode(str(root)) + b"/bad\xffbytes"
    os.mkdir(raw)
    os.close(os.open(raw + b"/lock", os.O_CREAT | os.O_EXCL))
    (root / "loop").symlink_to(root / "loop")  # ELOOP
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    (root / "up").symlink_to(root)  # a dir that contains itself
    fifo_op = root / "fifo"
    fifo_op.mkdir()
    os.mkfifo(fifo_op / "build.ninja")  # reading it would block forever
    (root / "not-a-dir.txt").write_text("x")
    ops = jc.scan_jit_cache({"TORCH_EXTENSIONS_DIR": str(root)})
    got = {op.name for op in ops}
    assert set(names) <= got
    assert "bad\udcffbytes" in got and "fifo" in got and "up" in got
    assert "loop" not in got and "dangling" not in got and "not-a-dir.txt" not in got
    fifo = next(op for op in ops if op.name == "fifo")
    assert fifo.build_cxx is None and any("not a regular file" in e for e in fifo.errors)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()
    hostile = next(op for op in ops if op.name == "x\ny")
    assert hostile.lock_path == str(root / "x\ny" / "lock") and hostile.so_info["kind"] == "elf"
    json.dumps([op.to_dict() for op in ops])  # surrogates and newlines stay serializable


def test_scan_is_bounded(tmp_path: Path) -> None:
    root = tmp_path / "ext"
    for i in range(12):
        make_op(root, f"op{i:02d}", cxx=None)
    assert len(jc.scan_jit_cache({"TORCH_EXTENSIONS_DIR": str(root)}, max_ops=5)) == 5
    assert jc.scan_jit_cache({"TORCH_EXTENSIONS_DIR": str(tmp_path / "absent")}) == []


def test_build_ninja_parsing() -> None:
    text = ("ninja_required_version = 1.3\ncxx = /opt/ccache/bin/ccache '/opt/my tools/g++'\n"
            "nvcc = /usr/local/cuda/bin/nvcc\n\nrule compile\n  command = $cxx -c $in\n")
    assert jc.parse_ninja_cxx(text) == "/opt/ccache/bin/ccache '/opt/my tools/g++'"
    assert jc.compiler_word(jc.parse_ninja_cxx(text)) == "/opt/my tools/g++"
    assert jc.parse_ninja_cxx("cxxflags = -O2\n") is None
    assert jc.compiler_word("c++") == "c++" and jc.compiler_word("") is None
    assert jc.gcc_version_of(["GCC: (Debian 12.2.0-14) 12.2.0", "GCC: (GNU) 13.2.1"]) == "13.2.1"
    assert jc.gcc_version_of(["Linker: LLD"]) is None


def test_prebuilt_ops_inside_the_package(tmp_path: Path, real_so: Path) -> None:
    ds = tmp_path / "site" / "deepspeed"
    (ds / "ops" / "adam").mkdir(parents=True)
    (ds / "ops" / "aio").mkdir(parents=True)
    (ds / "ops" / "__pycache__").mkdir(parents=True)
    shutil.copyfile(real_so, ds / "ops" / "adam" / "cpu_adam_op.cpython-311-x86_64-linux-gnu.so")
    shutil.copyfile(real_so, ds / "ops" / "aio" / "async_io_op.cpython-311-x86_64-linux-gnu.so")
    (ds / "ops" / "__pycache__" / "junk.so").write_bytes(b"x")
    (ds / "ops" / "adam" / "again").symlink_to(ds / "ops")  # a loop
    (ds / "ops" / "adam" / "__init__.py").write_text("")
    found = jc.prebuilt_ops(str(ds))
    assert found == [str(ds / "ops" / "adam" / "cpu_adam_op.cpython-311-x86_64-linux-gnu.so"),
                     str(ds / "ops" / "aio" / "async_io_op.cpython-311-x86_64-linux-gnu.so")]
    assert jc.prebuilt_ops(str(tmp_path / "nothing")) == [] and jc.prebuilt_ops(None) == []


def test_mount_lookup(tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    home = tmp_path / "shared home"
    table.write_text(f"/dev/vda / ext4 rw 0 0\nfiler:/export {str(home).replace(' ', chr(92) + '040')} "
                      "nfs4 rw 0 0\n")
    home.mkdir()
    m = mounts.mount_of(str(home / ".cache" / "torch_extensions"), str(table))
    assert (m["point"], m["fstype"], m["source"]) == (str(home), "nfs4", "filer:/export")
    assert mounts.is_network_fs("nfs4") and mounts.is_network_fs("fuse.sshfs") and not mounts.is_network_fs("ext4")
    assert mounts.mount_of(str(tmp_path), str(table))["fstype"] == "ext4"
    assert mounts.mount_of(str(tmp_path), str(tmp_path / "absent")) is None
