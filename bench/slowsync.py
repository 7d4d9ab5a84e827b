"""A slower disk, for one diagnostic: an ``LD_PRELOAD`` shim that sleeps before
every ``fsync`` and ``fdatasync`` and then performs it.

This machine's disk syncs in about 0.15 ms; many disks (network block
storage, consumer SSDs under load, spinning disks) take milliseconds, and
that is where sharing one commit between writers matters. The shim keeps
every sync (durability is untouched) and only adds latency. It is built with
the system C compiler on Linux; elsewhere, or without a compiler, the
measurement is reported as not taken, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static void delay(void) {
    const char *env = getenv("CHARTER_BENCH_FSYNC_DELAY_US");
    long us = env ? atol(env) : 0;
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    if (us > 0) nanosleep(&ts, NULL);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    delay();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    delay();
    return real(fd);
}
"""


def build(into: Path) -> tuple[Path | None, str]:
    """The shim's path, or None and why it could not be built."""
    if not sys.platform.startswith("linux"):
        return None, f"the shim needs Linux (this is {sys.platform})"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) to build the shim"
    src, lib = into / "slowsync.c", into / "slowsync.so"
    src.write_text(SOURCE)
    proc = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None, f"building the shim failed: {proc.stderr.strip()[:300]}"
    return lib, f"built with {cc}"
