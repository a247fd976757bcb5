"""Whether a stretch of a file is already in the page cache (mincore(2) through ctypes), so that the
prefetch spends neither the volume nor a core on what a start will find there anyway: re-reading a
cached 1.34 GB checkpoint costs ~0.25 s of copying on 2 cores that the forkserver's import wants.

mincore tells the truth only to the file's owner and to whoever may write it (since Linux 5.0 it
answers "all resident" to the others, so as not to leak what other users read): for anyone else,
such as an image's user reading a root-owned read-only volume, the answer is "cannot tell" and
the prefetch reads as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value
SAMPLES = 16  # pages checked per stretch
CAP_FOWNER = 3  # linux/capability.h


def trustworthy(fd: int) -> bool:
    """Whether mincore's answer on this open file is the truth (see the module's docstring): the
    kernel's own test is ownership or CAP_FOWNER (root without it, as in a container that drops
    every capability, is lied to like anyone else)."""
    return os.fstat(fd).st_uid == os.geteuid() or _has_cap_fowner()


def _has_cap_fowner() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    effective = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(effective, 16) >> CAP_FOWNER & 1)


def all_resident(fd: int, offset: int, length: int) -> bool:
    """The pages of [offset, offset + length) of the open file are in the page cache, by SAMPLES pages
    spread over it (the first and the last among them): mincore costs ~70 ns a page, 70 ms of a core
    for a cached 4 GB checkpoint page by page, 3 ms so. A stretch with pages missing between the
    samples is left to the loader's own reads. False when it cannot be told (an answer nobody may
    trust, a failed call)."""
    if length <= 0 or not trustworthy(fd):
        return False
    start = offset // PAGE * PAGE
    size = offset + length - start
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if addr in (None, _MAP_FAILED):
        return False
    try:
        pages = (size + PAGE - 1) // PAGE
        sampled = sorted({page * (pages - 1) // max(SAMPLES - 1, 1) for page in range(SAMPLES)})
        vec = (ctypes.c_ubyte * 1)()
        for page in sampled:
            if _libc.mincore(ctypes.c_void_p(addr + page * PAGE), PAGE, vec) != 0 or not vec[0] & 1:
                return False
        return True
    finally:
        _libc.munmap(ctypes.c_void_p(addr), size)
