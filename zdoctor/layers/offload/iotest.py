"""Can DeepSpeed's NVMe offload work here, and how fast: O_DIRECT, libaio, sequential throughput.

DeepSpeed's swapper opens its swap files with O_DIRECT and drives them through libaio (the
``async_io`` op) in 1 MiB blocks with 8 requests in flight. :func:`measure` does the same with
threads (``os.pwrite``/``os.preadv`` on an O_DIRECT descriptor, ``queue_depth`` requests at once),
bounded in size and time, and always removes its test file. The test file is created once, by zdoctor,
and used only through the descriptor that created it: never reopened by name in a directory another
user may own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shlex
import stat
import threading
import time
import typing
from collections.abc import Mapping
from typing import Any

from zdoctor.core import packages
from zdoctor.core.errors import InputError
from zdoctor.core.model import Evidence
from zdoctor.core.units import parse_size  # noqa: F401 - the io size of --io-size, parsed where every option is
from zdoctor.layers.offload import GIB, MIB, aiocalls
from zdoctor.proc import runner, scratch
from zdoctor.readers.ldcache import read_ld_so_cache, runtime_soname

BLOCK = MIB  # DeepSpeed aio block_size default
QUEUE_DEPTH = 8  # DeepSpeed aio queue_depth default
DEFAULT_SIZE = GIB
FREE_SHARE = 10  # the test never uses more than 1/FREE_SHARE of the free space
MIN_SIZE = 16 * MIB
TIME_LIMIT_S = 30.0  # per phase


Progress = typing.Callable[[str, int, int], None]


def human(n: float | None) -> str:
    """Bytes for people: ``1.0 GiB``."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def rate(bps: float | None) -> str:
    """Throughput for people, decimal like drive data sheets: ``3.21 GB/s``, ``540 MB/s``."""
    if bps is None:
        return "?"
    return f"{bps / 1e9:.2f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.0f} MB/s"


def plan_size(requested: int | None, avail_bytes: int | None, block: int = BLOCK) -> tuple[int, str | None]:
    """The test size in bytes, or (0, why not). ``requested`` None means the default: 1 GiB, at most a
    tenth of the free space. A request above a tenth of the free space is refused, not shrunk."""
    if requested == 0:
        return 0, "the throughput test was turned off (io size 0)"
    if avail_bytes is None:
        return 0, "the free space could not be read, so no test file is written"
    cap = avail_bytes // FREE_SHARE
    if requested is None:
        size = min(DEFAULT_SIZE, cap) // block * block
        if size < MIN_SIZE:
            return 0, (f"only {human(avail_bytes)} free: a meaningful test needs {human(MIN_SIZE)}, and the "
                       f"test never takes more than 1/{FREE_SHARE} of the free space")
        return size, None
    if requested > cap:
        return 0, (f"asked for {human(requested)}, but only {human(avail_bytes)} is free and the test takes at "
                   f"most 1/{FREE_SHARE} of it ({human(cap)}); choose a smaller size")
    return max(block, requested // block * block), None


def _aligned(size: int, fill: bytes | None = None) -> mmap.mmap:
    """A page-aligned buffer (anonymous mmap), as O_DIRECT needs."""
    buf = mmap.mmap(-1, size)
    if fill:
        buf.write(fill[:size].ljust(size, b"\0"))
        buf.seek(0)
    return buf


def _errno_name(err: int | None) -> str | None:
    return errno.errorcode.get(err) if err is not None else None


def _temp_name(directory: str, what: str) -> str:
    return os.path.join(directory, f".zdoctor-{what}-{os.getpid()}-{os.urandom(4).hex()}")


class _TestFile:
    """zdoctor's own test file in ``directory``, opened once and used only through that descriptor.

    The file is created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to a descriptor of the directory
    (so nothing the directory's owner renames over the name later is ever opened), checked with
    ``fstat`` to be the regular file just created, and switched to O_DIRECT on the same descriptor
    (``fcntl``): a file system that refuses O_DIRECT refuses there, after the file exists, so it is
    still removed. :meth:`close` removes the name only while it still names this file.
    """

    def __init__(self, directory: str, what: str) -> None:
        self.path = _temp_name(directory, what)
        self.name = os.path.basename(self.path)
        self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.fd = -1
        try:
            self.fd = os.open(self.name, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_RDWR | os.O_CLOEXEC,
                              0o600, dir_fd=self.dir_fd)
            st = os.fstat(self.fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
                raise OSError(errno.EPERM, f"{self.path} is not the file zdoctor just created")
        except BaseException:
            self.close()
            raise

    def direct(self) -> None:
        """Turn on O_DIRECT for the descriptor (EINVAL where the file system refuses it)."""
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_DIRECT)

    def close(self) -> bool:
        """Remove the file (only if the name still leads to it) and close; True when it is gone."""
        gone = True
        if self.fd >= 0:
            mine = os.fstat(self.fd)
            with contextlib.suppress(OSError):
                now = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                    os.unlink(self.name, dir_fd=self.dir_fd)
            gone = os.fstat(self.fd).st_nlink == 0
            os.close(self.fd)
            self.fd = -1
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1
        return gone


def odirect_check(directory: str, block: int = 4096) -> dict[str, Any]:
    """Write and read back one aligned block with O_DIRECT in ``directory``.

    Keys: ok (True | False | None = could not test), stage (open | write | read | create), errno,
    error, tested_in. The test file is created once (see :class:`_TestFile`) and only ever used
    through that descriptor, so a link swapped in for its name is never written; it is always removed.
    """
    out: dict[str, Any] = {"tested_in": directory, "ok": None, "stage": None, "errno": None, "error": None}
    stage = "create"
    test: _TestFile | None = None
    try:
        test = _TestFile(directory, "odirect")
        stage = "open"
        test.direct()
        stage = "write"
        with _aligned(block, os.urandom(block)) as buf:
            n = os.pwrite(test.fd, buf, 0)
            if n != block:
                raise OSError(errno.EIO, f"short write: {n} of {block} bytes")
            stage = "read"
            with _aligned(block) as back:
                got = os.preadv(test.fd, [back], 0)
                if got != block or back[:] != buf[:]:
                    raise OSError(errno.EIO, f"read back {got} bytes that differ from what was written")
        out.update(ok=True, stage="done")
    except OSError as exc:
        out.update(stage=stage, errno=_errno_name(exc.errno), error=exc.strerror or str(exc))
        # Not being allowed to create a file says nothing about O_DIRECT.
        out["ok"] = None if stage == "create" else False
    finally:
        if test is not None:
            test.close()
    return out


def explain_odirect(res: dict[str, Any]) -> str:
    """One sentence on an :func:`odirect_check` result."""
    if res.get("ok"):
        return f"O_DIRECT write and read of one aligned block worked in {res['tested_in']}"
    if res.get("ok") is None:
        return f"could not test O_DIRECT in {res['tested_in']}: cannot create a file there ({res.get('error')})"
    if res.get("stage") == "open" and res.get("errno") == "EINVAL":
        return (f"the file system of {res['tested_in']} refuses O_DIRECT (open returned EINVAL): DeepSpeed's "
                "swapper cannot open its swap files there")
    return f"O_DIRECT {res.get('stage')} failed in {res['tested_in']}: {res.get('errno')} {res.get('error')}"


# -- throughput -------------------------------------------------------------------------------------------

def _phase(fd: int, nblocks: int, block: int, queue_depth: int, write: bool, time_limit: float,
           progress: Progress | None, total: int) -> dict[str, Any]:
    """Run one phase with ``queue_depth`` threads; returns bytes, seconds, complete, error."""
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "error": None}
    stop = threading.Event()
    name = "write" if write else "read"

    def worker() -> None:
        with _aligned(block, os.urandom(block) if write else None) as buf:
            while not stop.is_set():
                with lock:
                    idx = state["next"]
                    if idx >= nblocks:
                        return
                    state["next"] = idx + 1
                try:
                    n = os.pwrite(fd, buf, idx * block) if write else os.preadv(fd, [buf], idx * block)
                    if n != block:
                        raise OSError(errno.EIO, f"short {name}: {n} of {block} bytes at block {idx}")
                except OSError as exc:
                    with lock:
                        state["error"] = state["error"] or f"{name}: {_errno_name(exc.errno) or ''} " \
                                                           f"{exc.strerror or exc}".strip()
                    stop.set()
                    return
                with lock:
                    state["done"] += n

    threads = [threading.Thread(target=worker, name=f"zdoctor-io-{i}", daemon=True)
               for i in range(max(1, min(queue_depth, nblocks)))]
    t0 = time.monotonic()
    timed_out = False
    try:
        for t in threads:
            t.start()
        while alive := [t for t in threads if t.is_alive()]:
            alive[0].join(0.05)
            if progress is not None:
                progress(name, state["done"], total)
            if time.monotonic() - t0 > time_limit and not stop.is_set():
                timed_out = True
                stop.set()
        if progress is not None:
            progress(name, state["done"], total)
        if write and state["error"] is None:
            os.fsync(fd)  # the device must really have the data before the clock stops
    finally:
        stop.set()
        for t in threads:
            t.join()
    secs = time.monotonic() - t0
    done = state["done"]
    return {"bytes": done, "seconds": round(secs, 4), "bps": done / secs if secs > 0 and done else None,
            "complete": done == nblocks * block and state["error"] is None, "timed_out": timed_out,
            "error": state["error"]}


def measure(directory: str, size: int, *, block: int = BLOCK, queue_depth: int = QUEUE_DEPTH,
            time_limit: float = TIME_LIMIT_S, progress: Progress | None = None) -> dict[str, Any]:
    """Sequential O_DIRECT write (then fsync) and read of ``size`` bytes in ``directory``.

    ``progress(phase, done_bytes, total_bytes)`` is called from this thread about every 50 ms. Each
    phase stops at ``time_limit`` seconds (the result says so). The test file is removed in every case,
    also on KeyboardInterrupt. Keys: ran, file, size_bytes, block_bytes, queue_depth, time_limit_s,
    write {bytes, seconds, bps, complete, timed_out, error}, read {...}, error, removed.
    """
    nblocks = max(1, size // block)
    total = nblocks * block
    out: dict[str, Any] = {"ran": True, "file": None, "size_bytes": total, "block_bytes": block,
                           "queue_depth": queue_depth, "time_limit_s": time_limit, "write": None, "read": None,
                           "error": None, "removed": False}
    test: _TestFile | None = None
    try:
        test = _TestFile(directory, "iotest")
        out["file"] = test.path
        test.direct()
        out["write"] = _phase(test.fd, nblocks, block, queue_depth, True, time_limit, progress, total)
        written = out["write"]["bytes"] // block
        if written:
            out["read"] = _phase(test.fd, written, block, queue_depth, False, time_limit, progress,
                                 written * block)
        out["error"] = (out["write"] or {}).get("error") or (out["read"] or {}).get("error")
    except OSError as exc:
        out["error"] = f"{_errno_name(exc.errno) or ''} {exc.strerror or exc}".strip()
    finally:
        out["removed"] = test.close() if test is not None else True
    return out


# -- libaio -----------------------------------------------------------------------------------------------

def os_release(path: str = "/etc/os-release") -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                k, sep, v = line.strip().partition("=")
                if sep:
                    out[k] = v.strip().strip('"')
    except OSError:
        pass
    return out


def libaio_package(release: Mapping[str, str]) -> dict[str, str | None]:
    """The package with libaio's headers and linkable library for this distribution (os-release's raw
    keys), and its install line (what DeepSpeed's async_io builder asks for), from :mod:`zdoctor.core.packages`."""
    distro = {"id": (release.get("ID") or "").lower() or None, "id_like": release.get("ID_LIKE", "").lower().split(),
              "version_id": release.get("VERSION_ID")}
    pm = packages.node_manager(distro)
    if pm is None:
        return {"package": None, "install": None}
    name = packages.package_name("libaio headers", pm.family)
    return {"package": name, "install": pm.install(name)[-1]}


def _flag_dirs(flags: str, flag: str) -> list[str]:
    try:
        words = shlex.split(flags)
    except ValueError:
        words = flags.split()
    out = []
    for i, w in enumerate(words):
        if w == flag and i + 1 < len(words):
            out.append(words[i + 1])
        elif w.startswith(flag) and len(w) > len(flag):
            out.append(w[len(flag):])
    return out


def _search(name: str, dirs: list[str]) -> str | None:
    for d in dirs:
        cand = os.path.join(d, name)
        if os.path.exists(cand):
            return cand
    return None


def runtime_library(name: str, env: Mapping[str, str], ld_cache: str) -> str | None:
    """Where the loader finds ``lib<name>.so.N`` for the training environment ``env``: the file in a
    directory of its LD_LIBRARY_PATH, else the soname the ld.so cache ``ld_cache`` lists; None when
    neither has it (an unreadable cache counts as listing nothing)."""
    prefix = f"lib{name}.so."
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        try:
            names = sorted(n for n in os.listdir(d) if n.startswith(prefix)) if d else []
        except OSError:
            continue
        for n in names:
            if os.path.isfile(os.path.join(d, n)):
                return os.path.join(d, n)
    try:
        return runtime_soname(read_ld_so_cache(ld_cache), name)
    except InputError:
        return None


def libaio_status(env: Mapping[str, str] | None = None, *, release_path: str = "/etc/os-release",
                  compile_test: bool = True, timeout: float = 30.0, ds_location: str | None = None,
                  ld_cache: str = "/etc/ld.so.cache") -> tuple[dict[str, Any], list[Evidence]]:
    """Whether DeepSpeed's ``async_io`` op can be built and make its calls in the training environment ``env``.

    Looks for the runtime library (:func:`runtime_library`: LD_LIBRARY_PATH, then ``ld_cache``), the
    header and the unversioned ``libaio.so`` (honouring CFLAGS/CPATH/LDFLAGS/LIBRARY_PATH/CONDA_PREFIX
    as the op build does), then compiles, links and runs a program making the libaio calls the installed
    DeepSpeed's csrc/aio makes (:mod:`zdoctor.layers.offload.aiocalls`; libaio's core cycle when those are
    unknown) with the environment's C compiler: the decisive test. Keys: ok, runtime, header,
    dev_library, link_test {ran, ok, compiler, error, calls, calls_source, ran_ok, failed_call, returned},
    package, install, distro.
    """
    env = dict(os.environ if env is None else env)
    conda = env.get("CONDA_PREFIX")
    inc = (_flag_dirs(env.get("CFLAGS", ""), "-I") + [d for k in ("CPATH", "C_INCLUDE_PATH")
                                                       for d in env.get(k, "").split(":") if d]
           + ([os.path.join(conda, "include")] if conda else []) + ["/usr/local/include", "/usr/include"])
    libdirs = (_flag_dirs(env.get("LDFLAGS", ""), "-L") + [d for d in env.get("LIBRARY_PATH", "").split(":") if d]
               + ([os.path.join(conda, "lib")] if conda else [])
               + ["/usr/local/lib", "/usr/lib64", "/lib64", "/usr/lib"]
               + sorted(d for base in ("/usr/lib", "/lib") if os.path.isdir(base)
                        for d in (os.path.join(base, x) for x in os.listdir(base))
                        if d.endswith("-linux-gnu") and os.path.isdir(d)))
    release = os_release(release_path)
    pkg = libaio_package(release)
    facts: dict[str, Any] = {
        "runtime": runtime_library("aio", env, ld_cache),
        "header": _search("libaio.h", inc),
        "dev_library": _search("libaio.so", libdirs),
        "link_test": {"ran": False, "ok": None, "compiler": None, "error": None},
        "distro": release.get("ID"), **pkg,
    }
    evidence: list[Evidence] = []
    cc = env.get("CC") or next((c for name in ("cc", "gcc") for c in runner.which_all(name, env.get("PATH"))),
                               None)
    if compile_test and cc:
        ds = aiocalls.deepspeed_aio_calls(ds_location)
        with scratch.private_folder("aio-") as tmp:
            exe = os.path.join(tmp, "aio_test")
            argv = (shlex.split(cc) + shlex.split(env.get("CFLAGS", "")) + ["-x", "c", "-", "-o", exe]
                    + shlex.split(env.get("LDFLAGS", "")) + ["-laio"])
            ev = runner.run(argv, env=env, stdin=aiocalls.call_program(ds["calls"]), timeout=timeout, cwd=tmp,
                            label="compile and link a libaio test program (as DeepSpeed's async_io build does)")
            evidence.append(ev)
            linked = ev.exit_code == 0
            lt: dict[str, Any] = {"ran": True, "ok": linked, "compiler": cc,
                                  "error": None if linked else (ev.error or _first_error(ev.stderr)),
                                  "calls": ds["calls"], "calls_source": ds["sources"], "calls_why": ds["why"],
                                  "plan": aiocalls.plan(ds["calls"]), "ran_ok": None, "failed_call": None,
                                  "returned": None}
            if linked:
                data = os.path.join(tmp, "aio_data")
                with open(data, "wb") as fh:
                    fh.write(b"\0" * 4096)
                run_ev = runner.run([exe, data], env=env, timeout=timeout, cwd=tmp,
                                    label="run the libaio test program (the calls DeepSpeed's async_io makes)")
                evidence.append(run_ev)
                lt["ran_ok"] = run_ev.exit_code == 0 and "OK" in (run_ev.stdout or "")
                if not lt["ran_ok"]:
                    lt["failed_call"], lt["returned"] = aiocalls.failed_call(run_stdout=run_ev.stdout or "")
                    lt["error"] = run_ev.error or (run_ev.stdout or run_ev.stderr or "").strip()[-300:] \
                        or f"exit code {run_ev.exit_code}"
            else:
                lt["failed_call"], _ = aiocalls.failed_call(build_stderr=ev.stderr or "")
        facts["link_test"] = lt
        facts["ok"] = bool(linked and lt["ran_ok"])
    else:
        facts["ok"] = bool(facts["header"] and facts["dev_library"])
    return facts, evidence


def _first_error(stderr: str) -> str:
    for line in stderr.splitlines():
        if "error" in line.lower() or "cannot find" in line:
            return line.strip()
    return stderr.strip().splitlines()[-1] if stderr.strip() else "failed"
