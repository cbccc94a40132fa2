"""Smaller failure classes from real states: a /dev/shm-like directory the training user cannot write
(checked from a process that really runs as another uid), a Triton cache on NFS (recorded mount line)
with a lock a live process holds, a lib directory with libstdc++.so.6.0.N but no libstdc++.so.6 link
(the real loader skips it), and an inventory that counts the copy the run really failed with."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from envkit import build_extension, make_old_libstdcxx, system_libstdcxx
from test_gpu_facts import h200

from zdoctor.core.registry import load_vocabulary
from zdoctor.host import LiveHost
from zdoctor.layers.gpu.check_shmaccess import check_shm_access
from zdoctor.layers.gpu.probe_shmaccess import shm_access
from zdoctor.layers.libraries.check_libs import check_inventory
from zdoctor.layers.libraries.check_stdcxxlinks import check_stdcxx_links
from zdoctor.layers.libraries.probe_stdcxxlinks import stdcxx_links
from zdoctor.layers.toolchain.check_othercaches import check_other_caches
from zdoctor.layers.toolchain.probe_othercaches import other_caches

NOBODY = 65534


def as_nobody(path: Path) -> dict:
    """shm_access(path) computed in a forked child that dropped to uid/gid 65534."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(w, json.dumps(shm_access(str(path))).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")
def test_shm_that_the_training_user_cannot_write_and_its_remedy():
    with tempfile.TemporaryDirectory(dir="/tmp") as top:  # pytest's tmp_path is private to root
        os.chmod(top, 0o755)
        shm = Path(top) / "shm"
        shm.mkdir()
        shm.chmod(0o755)
        shm_case(shm)


def shm_case(shm: Path) -> None:
    f = as_nobody(shm)
    assert f["write_test"] is False and f["mode"] == "0o755" and f["euid"] == NOBODY
    (x,) = check_shm_access(h200(shm_access=f))
    assert x.status == "fail" and "cannot create files" in x.title and "Permission denied" in x.title
    fix = x.remedies[0]
    assert fix.commands == [f"chmod 1777 {shlex.quote(str(shm))}"] and fix.undo == [f"chmod 755 {shm}"]
    subprocess.run(["bash", "-c", fix.commands[0]], check=True)
    (ok,) = check_shm_access(h200(shm_access=as_nobody(shm)))
    assert ok.status == "ok"


def test_triton_cache_on_nfs_with_a_held_lock(tmp_path):
    home = tmp_path / "home"
    cache = home / ".triton" / "autotune"
    cache.mkdir(parents=True)
    lock = cache / "matmul-key.pickle.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        mounts = tmp_path / "mounts"
        mounts.write_text(f"fs1:/export/home {home} nfs4 rw,relatime,vers=4.2 0 0\n")
        caches = other_caches({"HOME": str(home)}, mounts=str(mounts))
        x, kernels = check_other_caches(h200(other_caches={"caches": caches}))
        assert kernels.status == "warn" and "Triton kernel cache" in kernels.title  # ~/.triton/cache, same home
        assert x.status == "warn" and "DeepSpeed Triton autotune cache is on nfs4" in x.title
        assert f"pid {holder.pid}" in x.detail and "TRITON_CACHE_DIR" in x.detail
        assert x.remedies[0].commands == ['export TRITON_CACHE_DIR="/tmp/triton-cache-$(id -u)"']
        # the lock really is held: a second taker is refused
        with open(lock) as fh, pytest.raises(BlockingIOError):
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        holder.kill()
        holder.wait()


def test_versioned_libstdcxx_without_its_link_is_skipped_by_the_loader(tmp_path):
    lib = tmp_path / "conda" / "lib"
    lib.mkdir(parents=True)
    real = system_libstdcxx()
    shutil.copy2(real, lib / real.name)
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib)}
    maps = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libstdc++.so.6'); "
                           "print(open('/proc/self/maps').read())"], env=env, capture_output=True, text=True).stdout
    assert str(lib) not in maps  # the loader never took the file without its soname link
    (x,) = check_stdcxx_links(h200(stdcxx_links={"dirs": stdcxx_links([(str(lib), "LD_LIBRARY_PATH entry 1")])}))
    assert x.status == "warn" and f"has {real.name} but no libstdc++.so.6 link" in x.title
    (lib / "libstdc++.so.6").symlink_to(real.name)
    (ok,) = check_stdcxx_links(h200(stdcxx_links={"dirs": stdcxx_links([(str(lib), "LD_LIBRARY_PATH")])}))
    assert ok.status == "ok"


def test_the_inventory_counts_the_copy_the_run_failed_with(tmp_path):
    mods = tmp_path / "mods"
    make_old_libstdcxx(mods / "vendor")
    build_extension(mods, "vendored", runpath="$ORIGIN/vendor")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_")}
    cmd = shlex.join([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(mods)!r}); import vendored"])
    load_vocabulary()
    host = LiveHost(python=sys.executable, env=env, command=cmd, timeout=60)
    facts = host.results(["libs", "livetrace"])
    assert not facts.of("livetrace")["ok"]
    (x,) = check_inventory(facts)
    assert str(mods / "vendor" / "libstdc++.so.6") in x.detail and "lacks GLIBCXX_3.4.30" in x.detail
    assert "lacks a version the training needs" in x.title or "lack a version" in x.title
