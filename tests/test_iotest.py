"""O_DIRECT, the bounded throughput test, sizes, and libaio: on real files, real tmpfs/ramfs mounts, and a
real compiler link of a libaio test program."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from zdoctor.core.errors import InputError
from zdoctor.layers.offload import GIB, MIB
from zdoctor.layers.offload import iotest as io


# -- sizes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,size", [("0", 0), ("256M", 256 * MIB), ("1G", GIB), ("1g", GIB), ("1.5G", 3 * GIB // 2),
                                       ("512MiB", 512 * MIB), ("64 MB", 64 * MIB), ("4096", 4096), ("2T", 2048 * GIB)])
def test_parse_size(text, size):
    assert io.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "-1", "1X", "1 G G", "G"])
def test_parse_size_rejects_garbage(text):
    with pytest.raises(InputError, match="io size"):
        io.parse_size(text)


def test_plan_size_defaults_caps_and_refusals():
    assert io.plan_size(None, 100 * GIB) == (GIB, None)  # default 1 GiB
    assert io.plan_size(None, 2 * GIB)[0] == 2 * GIB // 10 // MIB * MIB  # at most a tenth of the free space
    size, why = io.plan_size(None, 100 * MIB)
    assert size == 0 and "only 100.0 MiB free" in why
    size, why = io.plan_size(4 * GIB, 10 * GIB)
    assert size == 0 and "at most 1/10" in why  # refused, not silently shrunk
    assert io.plan_size(32 * MIB + 5, 10 * GIB) == (32 * MIB, None)
    assert io.plan_size(0, 10 * GIB)[0] == 0
    assert io.plan_size(None, None)[0] == 0


# -- O_DIRECT ---------------------------------------------------------------------------------------------
def leftovers(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith(".zdoctor-")]


@contextlib.contextmanager
def mounted(fstype: str, where: Path, options: str):
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", fstype, "-o", options, fstype, str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a {fstype} at {where} (tests run as root): {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def kernel_allows_odirect(d: Path) -> bool:
    """Ground truth, asked of the kernel directly."""
    p = d / "probe"
    p.write_bytes(b"")
    try:
        os.close(os.open(p, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        p.unlink()


def test_odirect_works_on_a_disk_filesystem(tmp_path):
    res = io.odirect_check(str(tmp_path))
    assert res["ok"] is True and res["stage"] == "done"
    assert leftovers(tmp_path) == []


def test_odirect_refused_by_ramfs(tmp_path):
    with mounted("ramfs", tmp_path / "r", "mode=0755") as d:
        res = io.odirect_check(str(d))
        assert (res["ok"], res["stage"], res["errno"]) == (False, "open", "EINVAL")
        assert "refuses O_DIRECT" in io.explain_odirect(res)
        assert leftovers(d) == []


def test_odirect_on_tmpfs_reports_what_the_kernel_does(tmp_path):
    # tmpfs accepts O_DIRECT since Linux 6.6 and refuses it before: the check must say which
    with mounted("tmpfs", tmp_path / "t", "size=4m") as d:
        res = io.odirect_check(str(d))
        assert res["ok"] is kernel_allows_odirect(d)
        assert leftovers(d) == []


def test_odirect_untestable_on_a_read_only_mount(tmp_path):
    with mounted("tmpfs", tmp_path / "ro", "ro,size=1m") as d:
        res = io.odirect_check(str(d))
        assert res["ok"] is None and res["stage"] == "create" and res["errno"] == "EROFS"


# -- throughput ----------------------------------------------------------------------------------------------
def test_measure_small_file_reports_rates_and_progress(tmp_path):
    seen: list[tuple[str, int, int]] = []
    res = io.measure(str(tmp_path), 32 * MIB, progress=lambda *a: seen.append(a))
    assert res["error"] is None and res["removed"] and leftovers(tmp_path) == []
    for phase in ("write", "read"):
        assert res[phase]["complete"] and res[phase]["bytes"] == 32 * MIB and res[phase]["bps"] > 0
    writes = [done for ph, done, total in seen if ph == "write"]
    assert writes == sorted(writes) and writes[-1] == 32 * MIB
    assert seen[-1] == ("read", 32 * MIB, 32 * MIB)


def test_measure_removes_its_file_on_keyboard_interrupt(tmp_path):
    def interrupt(phase, done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        io.measure(str(tmp_path), 64 * MIB, progress=interrupt)
    assert leftovers(tmp_path) == []


def test_measure_stops_at_the_time_limit(tmp_path):
    res = io.measure(str(tmp_path), 512 * MIB, time_limit=0.0, queue_depth=1)
    assert res["write"]["timed_out"] and not res["write"]["complete"]
    assert 0 < res["write"]["bytes"] < 512 * MIB
    assert res["removed"] and leftovers(tmp_path) == []


def test_measure_reports_a_full_disk(tmp_path):
    with mounted("tmpfs", tmp_path / "small", "size=2m") as d:
        res = io.measure(str(d), 8 * MIB)
        assert res["error"] and ("ENOSPC" in res["error"] or "EINVAL" in res["error"])
        assert res["removed"] and leftovers(d) == []


# -- libaio ----------------------------------------------------------------------------------------------------
def fake_libaio(tmp: Path) -> dict[str, str]:
    """A real header and shared library with libaio's calls over the kernel's AIO system calls."""
    from aiokit import build_libaio

    return build_libaio(tmp)


def test_libaio_found_through_the_build_flags(tmp_path):
    env = fake_libaio(tmp_path)
    facts, ev = io.libaio_status(env)
    assert facts["ok"] is True and facts["link_test"]["ok"] is True
    assert facts["header"] == str(tmp_path / "include" / "libaio.h")
    assert facts["dev_library"] == str(tmp_path / "lib" / "libaio.so")
    assert facts["link_test"]["ran_ok"] is True
    assert ev[0].exit_code == 0 and f"-I{tmp_path / 'include'}" in ev[0].argv


def _cache_of(lib_dir: Path, out: Path) -> Path:
    """A real ld.so cache of ``lib_dir`` alone, written by ldconfig."""
    (out / "ld.so.conf").write_text(f"{lib_dir}\n")
    subprocess.run(["/sbin/ldconfig", "-X", "-C", str(out / "ld.so.cache"), "-f", str(out / "ld.so.conf")],
                   check=True, capture_output=True)
    return out / "ld.so.cache"


def test_the_runtime_library_is_read_from_the_cache_and_the_training_path_without_a_child(tmp_path, monkeypatch):
    fake_libaio(tmp_path)
    lib = tmp_path / "lib"
    cache = _cache_of(lib, tmp_path)
    empty = _cache_of(tmp_path / "include", tmp_path / "include")  # a real cache that lists no library

    def no_child(*a, **k):
        raise AssertionError(f"a child process was started: {a!r}")

    monkeypatch.setattr(subprocess, "Popen", no_child)  # ctypes.util.find_library runs ldconfig through it
    facts, ev = io.libaio_status({"PATH": os.environ["PATH"]}, ld_cache=str(cache), compile_test=False)
    assert facts["runtime"] == "libaio.so.1" and ev == []
    assert io.runtime_library("aio", {}, str(empty)) is None  # this machine's own cache plays no part
    # the training environment's LD_LIBRARY_PATH comes first, as it does for the loader
    assert io.runtime_library("aio", {"LD_LIBRARY_PATH": f"/nonexistent:{lib}"}, str(empty)) == str(lib / "libaio.so.1")
    (tmp_path / "bad.cache").write_bytes(b"not a cache")
    assert io.runtime_library("aio", {}, str(tmp_path / "bad.cache")) is None


def test_libaio_without_flags_matches_the_system():
    facts, ev = io.libaio_status({"PATH": os.environ["PATH"]})
    system_has = os.path.exists("/usr/include/libaio.h")
    assert facts["ok"] is system_has and facts["link_test"]["ran"]
    if not system_has:
        assert "libaio.h" in facts["link_test"]["error"]
    assert facts["install"] == io.libaio_package(io.os_release())["install"]


def test_libaio_without_a_compiler_looks_for_files(tmp_path):
    env = fake_libaio(tmp_path)
    env["PATH"] = str(tmp_path / "empty")
    facts, ev = io.libaio_status(env)
    assert ev == [] and not facts["link_test"]["ran"] and facts["ok"] is True


@pytest.mark.parametrize("release,install", [
    ({"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "24.04"}, "apt-get install -y libaio-dev"),
    ({"ID": "debian", "VERSION_ID": "12"}, "apt-get install -y libaio-dev"),
    ({"ID": "rocky", "ID_LIKE": "rhel centos fedora", "VERSION_ID": "9.3"}, "dnf install -y libaio-devel"),
    ({"ID": "centos", "ID_LIKE": "rhel fedora", "VERSION_ID": "7"}, "yum install -y libaio-devel"),
    ({"ID": "amzn", "ID_LIKE": "centos rhel fedora", "VERSION_ID": "2"}, "yum install -y libaio-devel"),
    ({"ID": "opensuse-leap", "ID_LIKE": "suse opensuse", "VERSION_ID": "15.5"}, "zypper install -y libaio-devel"),
    ({"ID": "arch"}, "pacman -S --noconfirm libaio"),
    ({"ID": "alpine"}, "apk add libaio-dev"),
    ({"ID": "plan9"}, None),
])
def test_libaio_package_per_distribution(release, install):
    assert io.libaio_package(release)["install"] == install

