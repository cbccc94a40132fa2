"""The libaio calls DeepSpeed's async_io op makes, read from the installed DeepSpeed's own sources, and a
test program that makes the same calls (init, submit a write and a read, wait for them, release).

A libaio that links ``io_setup`` can still lack what DeepSpeed calls: ``io_pgetevents`` (used by
DeepSpeed's ``csrc/aio/common/deepspeed_aio_common.cpp``) exists only from libaio 0.3.111 on, so an older
libaio (CentOS 7's 0.3.109) fails the op's build with "undefined reference to `io_pgetevents'"; and a
kernel or sandbox that refuses ``io_submit`` fails it at the first swap. The test is built with the
training environment's compiler and flags and then run.
"""

from __future__ import annotations

import os
import re
from typing import Any

#: libaio's API (libaio.h) as DeepSpeed may call it.
LIBAIO_CALLS = ("io_setup", "io_queue_init", "io_submit", "io_getevents", "io_pgetevents", "io_queue_release",
                "io_destroy", "io_cancel", "io_prep_pread", "io_prep_pwrite")
#: What a test makes when DeepSpeed's own calls are unknown: libaio's core cycle.
BASIC_CALLS = ("io_setup", "io_prep_pwrite", "io_prep_pread", "io_submit", "io_getevents", "io_destroy")
_CALL = re.compile(r"\b(" + "|".join(LIBAIO_CALLS) + r")\s*\(")
SOURCE_SUFFIXES = (".cpp", ".cc", ".c", ".h", ".hpp")
MAX_SOURCES = 200


def deepspeed_aio_calls(ds_location: str | None) -> dict[str, Any]:
    """The libaio calls in ``<deepspeed>/ops/csrc/aio`` (the sources the async_io op is built from):
    ``calls`` (sorted; None when the sources are not there), ``sources`` (files that call libaio), ``why``."""
    if not ds_location:
        return {"calls": None, "sources": [], "why": "DeepSpeed's location is unknown (not installed, or the "
                                                      "training interpreter could not be probed)"}
    root = os.path.join(ds_location, "ops", "csrc", "aio")
    if not os.path.isdir(root):
        return {"calls": None, "sources": [], "why": f"{root} does not exist in the installed DeepSpeed"}
    calls: set[str] = set()
    sources: list[str] = []
    seen = 0
    for d, _dirs, files in sorted(os.walk(root)):
        for name in sorted(files):
            if not name.endswith(SOURCE_SUFFIXES) or seen >= MAX_SOURCES:
                continue
            seen += 1
            path = os.path.join(d, name)
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    found = set(_CALL.findall(fh.read(1024 * 1024)))
            except OSError:
                continue
            if found:
                calls |= found
                sources.append(path)
    if not calls:
        return {"calls": None, "sources": [], "why": f"no libaio call found in the sources under {root}"}
    return {"calls": sorted(calls), "sources": sources, "why": None}


def plan(calls: list[str] | None) -> dict[str, str]:
    """Which call the test uses for each step: the one DeepSpeed uses where it names one."""
    have = set(calls or BASIC_CALLS)
    return {"init": "io_queue_init" if "io_queue_init" in have else "io_setup",
            "wait": "io_pgetevents" if "io_pgetevents" in have else "io_getevents",
            "release": "io_queue_release" if "io_queue_release" in have else "io_destroy"}


def call_program(calls: list[str] | None) -> bytes:
    """C source that writes and reads 4 KiB of ``argv[1]`` through libaio with the planned calls, printing
    ``OK`` or ``FAIL <call> <return value>``."""
    p = plan(calls)
    init = {"io_queue_init": "io_queue_init(8, &ctx)", "io_setup": "io_setup(8, &ctx)"}[p["init"]]
    wait = {"io_pgetevents": "io_pgetevents(ctx, 1, 1, ev, &ts, NULL)",
            "io_getevents": "io_getevents(ctx, 1, 1, ev, &ts)"}[p["wait"]]
    release = {"io_queue_release": "io_queue_release(ctx)", "io_destroy": "io_destroy(ctx)"}[p["release"]]
    src = f"""
#define _GNU_SOURCE
#include <libaio.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static int fail(const char *call, long rc) {{ printf("FAIL %s %ld\\n", call, rc); return 1; }}
static int cycle(io_context_t ctx, int fd, char *buf, int write) {{
    struct iocb cb; struct iocb *cbs[1] = {{&cb}}; struct io_event ev[1]; struct timespec ts = {{10, 0}};
    long rc;
    if (write) io_prep_pwrite(&cb, fd, buf, 4096, 0); else io_prep_pread(&cb, fd, buf, 4096, 0);
    rc = io_submit(ctx, 1, cbs);
    if (rc != 1) return fail("io_submit", rc);
    rc = {wait};
    if (rc != 1) return fail("{p['wait']}", rc);
    if ((long)ev[0].res != 4096) return fail(write ? "io_prep_pwrite" : "io_prep_pread", (long)ev[0].res);
    return 0;
}}
int main(int argc, char **argv) {{
    io_context_t ctx = 0; char out[4096], in[4096]; long rc; int fd;
    if (argc < 2) return 2;
    fd = open(argv[1], O_RDWR);
    if (fd < 0) return fail("open", -1);
    memset(out, 'z', sizeof out); memset(in, 0, sizeof in);
    rc = {init};
    if (rc < 0) return fail("{p['init']}", rc);
    if (cycle(ctx, fd, out, 1) || cycle(ctx, fd, in, 0)) return 1;
    if (memcmp(in, out, sizeof in) != 0) return fail("io_prep_pread", -1);
    rc = {release};
    if (rc < 0) return fail("{p['release']}", rc);
    printf("OK\\n");
    return 0;
}}
"""
    return src.encode()


_UNDEFINED = re.compile(r"undefined reference to [`'](\w+)'|implicit declaration of function [`'‘](\w+)")
_FAIL = re.compile(r"^FAIL (\w+) (-?\d+)$", re.MULTILINE)


def failed_call(build_stderr: str = "", run_stdout: str = "") -> tuple[str | None, int | None]:
    """(the libaio call that failed, its return value: -errno) from the build's or the run's output."""
    m = _FAIL.search(run_stdout or "")
    if m:
        return m.group(1), int(m.group(2))
    m = _UNDEFINED.search(build_stderr or "")
    if m:
        return m.group(1) or m.group(2), None
    return None, None
