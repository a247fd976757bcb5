"""Best-effort page-cache warmer: read the files serving will read, from several threads, before
the HTTP process and the engine read them.

As vLLM's prefetch does: daemon threads, ~16 MiB sequential reads, skipped when the
files would not fit in the memory really available; every error is logged and swallowed.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from common.modelfolder import files_to_load
from orchestrator.memory import available_bytes

BLOCK = 16 * 1024 * 1024
MAX_FRACTION_OF_MEMORY = 0.9

log = structlog.get_logger("warmpool.prefetch")


@dataclass
class Progress:
    files: int
    bytes_total: int
    bytes_done: int = 0
    errors: int = 0
    started: float = 0.0

    def as_detail(self) -> dict[str, float | int]:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        return {
            "files": self.files,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "mb_per_s": round(self.bytes_done / elapsed / 1e6, 1),
            "errors": self.errors,
        }


def model_files(folder: Path) -> list[Path]:
    """The files serving the folder reads, in the order they are read (common.modelfolder), less any
    that a symlink leads out of the volume: the folder itself, or the cached repo for a Hugging Face
    snapshot, whose files link into the repo's blobs/."""
    volume = folder.parent.parent if folder.parent.name == "snapshots" else folder
    volume = volume.resolve()
    return [p for p in files_to_load(folder) if p.resolve().is_relative_to(volume)]


def skip_reason(files: list[Path], total: int, enabled: bool) -> str | None:
    if not enabled:
        return "disabled (WARMPOOL_PREFETCH=off)"
    if not files or total == 0:
        return "nothing to read"
    available = available_bytes()
    if available is not None and total > MAX_FRACTION_OF_MEMORY * available:
        return f"model files ({total} B) exceed 90% of available memory ({available} B)"
    return None


def start(
    folder: Path,
    threads: int,
    enabled: bool,
    on_progress: Callable[[dict[str, float | int]], None],
    on_done: Callable[[dict[str, float | int]], None],
    on_skip: Callable[[str], None],
) -> None:
    """Plan the reads and start daemon readers; returns at once."""
    try:
        files = model_files(folder) if folder.is_dir() else []
        total = sum(p.stat().st_size for p in files)
    except OSError as exc:
        log.warning("prefetch_listing_failed", error=str(exc))
        files, total = [], 0
    reason = skip_reason(files, total, enabled)
    if reason is not None:
        on_skip(reason)
        return
    blocks: queue.SimpleQueue[tuple[Path, int, int]] = queue.SimpleQueue()
    for path in files:
        size = path.stat().st_size
        for offset in range(0, size, BLOCK):
            blocks.put((path, offset, min(BLOCK, size - offset)))
    progress = Progress(files=len(files), bytes_total=total, started=time.monotonic())
    lock = threading.Lock()
    remaining = [min(threads, blocks.qsize())]

    def reader() -> None:
        while True:
            try:
                path, offset, length = blocks.get_nowait()
            except queue.Empty:
                break
            read = _read_block(path, offset, length)
            with lock:
                progress.bytes_done += max(read, 0)
                progress.errors += read < 0
                on_progress(progress.as_detail())
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            on_done(progress.as_detail())

    for i in range(remaining[0]):
        threading.Thread(target=reader, name=f"prefetch-{i}", daemon=True).start()


def _read_block(path: Path, offset: int, length: int) -> int:
    """Read one block into the page cache; -1 on error (logged, never raised)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        log.warning("prefetch_read_failed", path=str(path), error=str(exc))
        return -1
    try:
        done = 0
        while done < length:
            chunk = os.pread(fd, min(length - done, BLOCK), offset + done)
            if not chunk:
                break
            done += len(chunk)
        return done
    except OSError as exc:
        log.warning("prefetch_read_failed", path=str(path), error=str(exc))
        return -1
    finally:
        os.close(fd)
