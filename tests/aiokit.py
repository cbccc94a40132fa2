"""A libaio built here: libaio's API (its header's types and inline io_prep_* helpers, the same binary
layout as the kernel's struct iocb and io_event) over the kernel's real AIO system calls, as libaio
itself is. ``with_pgetevents=False`` is a libaio before 0.3.111, which has no io_pgetevents."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HEADER = r"""
#ifndef __LIBAIO_H
#define __LIBAIO_H
#include <stddef.h>
#include <string.h>
#include <signal.h>
#include <time.h>
typedef struct io_context *io_context_t;
typedef enum io_iocb_cmd { IO_CMD_PREAD = 0, IO_CMD_PWRITE = 1 } io_iocb_cmd_t;
struct io_iocb_common { void *buf; unsigned long nbytes; long long offset; long long __pad3; unsigned flags;
                        unsigned resfd; };
struct iocb { void *data; unsigned key; unsigned aio_rw_flags; short aio_lio_opcode; short aio_reqprio;
              int aio_fildes; union { struct io_iocb_common c; } u; };
struct io_event { void *data; struct iocb *obj; unsigned long res; unsigned long res2; };
int io_setup(int maxevents, io_context_t *ctxp);
int io_destroy(io_context_t ctx);
int io_queue_init(int maxevents, io_context_t *ctxp);
int io_queue_release(io_context_t ctx);
int io_submit(io_context_t ctx, long nr, struct iocb *ios[]);
int io_getevents(io_context_t ctx, long min_nr, long nr, struct io_event *events, struct timespec *timeout);
#ifdef ZD_PGETEVENTS
int io_pgetevents(io_context_t ctx, long min_nr, long nr, struct io_event *events, struct timespec *timeout,
                  sigset_t *sigmask);
#endif
static inline void io_prep_pread(struct iocb *iocb, int fd, void *buf, size_t count, long long offset) {
    memset(iocb, 0, sizeof(*iocb)); iocb->aio_fildes = fd; iocb->aio_lio_opcode = IO_CMD_PREAD;
    iocb->u.c.buf = buf; iocb->u.c.nbytes = count; iocb->u.c.offset = offset; }
static inline void io_prep_pwrite(struct iocb *iocb, int fd, void *buf, size_t count, long long offset) {
    memset(iocb, 0, sizeof(*iocb)); iocb->aio_fildes = fd; iocb->aio_lio_opcode = IO_CMD_PWRITE;
    iocb->u.c.buf = buf; iocb->u.c.nbytes = count; iocb->u.c.offset = offset; }
#endif
"""

SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>
#include "libaio.h"
static int ret(long rc) { return rc < 0 ? -errno : (int)rc; }
int io_setup(int n, io_context_t *c) { return ret(syscall(SYS_io_setup, n, c)); }
int io_destroy(io_context_t c) { return ret(syscall(SYS_io_destroy, c)); }
int io_queue_init(int n, io_context_t *c) { return io_setup(n, c); }
int io_queue_release(io_context_t c) { return io_destroy(c); }
int io_submit(io_context_t c, long nr, struct iocb *ios[]) { return ret(syscall(SYS_io_submit, c, nr, ios)); }
int io_getevents(io_context_t c, long mn, long nr, struct io_event *e, struct timespec *t) {
    return ret(syscall(SYS_io_getevents, c, mn, nr, e, t)); }
#ifdef ZD_PGETEVENTS
int io_pgetevents(io_context_t c, long mn, long nr, struct io_event *e, struct timespec *t, sigset_t *m) {
    struct { const sigset_t *m; size_t n; } s = { m, _NSIG / 8 };
    return ret(syscall(SYS_io_pgetevents, c, mn, nr, e, t, m ? &s : NULL)); }
#endif
"""


def build_libaio(root: Path, *, with_pgetevents: bool = True) -> dict[str, str]:
    """Header and shared library under ``root``; the build flags that find them, as DeepSpeed's op build
    reads them."""
    inc, lib = root / "include", root / "lib"
    inc.mkdir(parents=True)
    lib.mkdir()
    defs = "#define ZD_PGETEVENTS 1\n" if with_pgetevents else ""
    (inc / "libaio.h").write_text(defs + HEADER)
    src = root / "libaio.c"
    src.write_text(SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-I", str(inc), "-o", str(lib / "libaio.so.1"), str(src)]
                   + (["-DZD_PGETEVENTS=1"] if with_pgetevents else []), check=True)
    os.symlink("libaio.so.1", lib / "libaio.so")
    return {"PATH": os.environ["PATH"], "CFLAGS": f"-I{inc}", "LDFLAGS": f"-L{lib} -Wl,-rpath,{lib}"}
