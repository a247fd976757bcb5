"""The batch folder's bound (WARMPOOL_BATCH_MAX_BYTES): the bytes its files and job outputs hold, claimed
before each write, so that an upload or a job's output that would pass the bound is refused before it is
written. Synchronous, on the executor, shared by its threads."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

FOLDERS = ("files", "outputs")  # what is counted: uploads, published outputs, running jobs' outputs
PARTIAL = ".partial"  # an upload still arriving
# kept free on the folder's filesystem: SQLite's commits (a job's failure among them) still fit when
# uploads and outputs have filled the rest
FREE_RESERVE = 8 * 1024 * 1024


class NoRoom(Exception):
    """A write refused by a bound (OpenAI's 413 on upload; a job's failure reason)."""

    code = "no_room"


class FolderFull(NoRoom):
    code = "batch_storage_full"

    def __init__(self, used: int, wanted: int, limit: int) -> None:
        super().__init__(
            f"the batch folder holds {used} bytes of its limit of {limit} (WARMPOOL_BATCH_MAX_BYTES):"
            f" {wanted} more would pass it; delete files (DELETE /v1/files/{{id}}) to make room"
        )


class DiskFull(NoRoom):
    code = "batch_disk_full"

    def __init__(self, free: int, wanted: int) -> None:
        super().__init__(
            f"the batch folder's filesystem has {free} bytes free: {wanted} more would leave less than the"
            f" {FREE_RESERVE} kept for the job records"
        )


class FileTooLarge(NoRoom):
    code = "file_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the file is larger than the limit of {limit} bytes")


class FolderSpace:
    """The bytes held under the folder, counted once (at first use) and kept by each claim and release."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = root
        self.limit = limit
        self._used: int | None = None
        self._lock = threading.Lock()

    def _counted(self) -> int:
        if self._used is None:
            self._used = sum(
                path.stat().st_size
                for folder in FOLDERS
                if (self.root / folder).is_dir()
                for path in (self.root / folder).iterdir()
                if path.is_file()
            )
        return self._used

    def used(self) -> int:
        with self._lock:
            return self._counted()

    def claim(self, size: int) -> None:
        """`size` more bytes about to be written; FolderFull (nothing claimed) if they would pass the limit,
        DiskFull if they would leave the filesystem less than FREE_RESERVE."""
        with self._lock:
            used = self._counted()
            if used + size > self.limit:
                raise FolderFull(used, size, self.limit)
            free = shutil.disk_usage(self.root).free
            if free - size < FREE_RESERVE:
                raise DiskFull(free, size)
            self._used = used + size

    def release(self, size: int) -> None:
        """`size` bytes deleted (or claimed and never written)."""
        with self._lock:
            self._used = max(0, self._counted() - size)

    def recount(self) -> None:
        """Counted again from the folder: after a write that failed part way (disk full)."""
        with self._lock:
            self._used = None
