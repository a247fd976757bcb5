"""A read-only FUSE passthrough with a bandwidth cap: a stand-in for a network model volume.

This machine's disk reads ~1.3 GB/s cold, so prefetching shows little on it; behind this mount
the model folder reads like network storage. Mounted with kernel_cache, so pages stay cached
between opens (otherwise the kernel drops them on every open and prefetching can do nothing).
Needs Debian's fuse3 and PyPI's mfusepy (bench only).
Usage: python -m bench.slowfs SOURCE MOUNTPOINT [--mb-per-s 200]
"""

from __future__ import annotations

import argparse
import errno
import os
import threading
import time
from typing import Any

import mfusepy as fuse


class TokenBucket:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = 0.0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def take(self, amount: int) -> None:
        """Block until `amount` bytes may pass; readers share the one bucket."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.tokens + (now - self.last) * self.rate, self.rate * 0.05)
            self.last = now
            self.tokens -= amount
            debt = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if debt:
            time.sleep(debt)


class SlowPassthrough(fuse.Operations):  # type: ignore[misc]
    def __init__(self, root: str, bucket: TokenBucket) -> None:
        self.root = root
        self.bucket = bucket

    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._full(path))
        except OSError as exc:
            raise fuse.FuseOSError(exc.errno) from None
        keys = ("st_mode", "st_size", "st_uid", "st_gid", "st_nlink", "st_atime", "st_mtime", "st_ctime")
        return {key: getattr(st, key) for key in keys}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._full(path))]

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        return os.open(self._full(path), os.O_RDONLY)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        data = os.pread(fh, size, offset)
        self.bucket.take(len(data))
        return data

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    parser.add_argument("--mb-per-s", type=float, default=200.0)
    args = parser.parse_args()
    ops = SlowPassthrough(os.path.abspath(args.source), TokenBucket(args.mb_per_s * 1e6))
    fuse.FUSE(ops, args.mountpoint, foreground=True, ro=True, kernel_cache=True, allow_other=True)


if __name__ == "__main__":
    main()
