"""Evict files from the page cache and measure how much of them is resident, without root.

posix_fadvise(DONTNEED) drops a file's clean pages that no process has mapped (a running torch
process keeps its libraries resident, so `resident()` says whether the eviction worked);
mincore(2) through ctypes says which pages are in memory (truly only to the file's owner or
someone who may write it, root included: since Linux 5.0 it says "all resident" to the others,
such as the image's user in a container). Standard library only, so that the
container benchmark can run this file inside the image:
`python pagecache.py evict|resident PATH...`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def files_under(paths: Iterable[Path]) -> Iterator[Path]:
    """Regular files under each path (a file stands for itself); symlinks are not followed."""
    for root in paths:
        if root.is_file():
            yield root
            continue
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder) / name
                if path.is_file() and not path.is_symlink():
                    yield path


def evict(paths: Iterable[Path]) -> int:
    """Drop the files' clean, unmapped pages from the page cache; returns how many files."""
    count = 0
    for path in files_under(paths):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


def resident_pages(path: Path) -> tuple[int, int]:
    """(pages in the page cache, pages in the file)."""
    size = path.stat().st_size
    pages = (size + PAGE - 1) // PAGE
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in vec), pages
        finally:
            _libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def resident(paths: Iterable[Path]) -> tuple[int, int]:
    """(bytes resident, bytes in total) over the files under paths."""
    done = total = 0
    for path in files_under(paths):
        try:
            have, pages = resident_pages(path)
        except OSError:
            continue
        done += have * PAGE
        total += pages * PAGE
    return done, total


if __name__ == "__main__":
    command, targets = sys.argv[1], [Path(p) for p in sys.argv[2:]]
    if command == "evict":
        evict(targets)
    have, total = resident(targets)
    print(f"{have} {total}")
