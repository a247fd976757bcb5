"""Best-effort page-cache warmer: read the files start-up is about to read, from several threads,
before the forkserver and the engine read them: the environment's native libraries (torch's, for
the forkserver's import; see orchestrator.envfiles), then the model's files.

As vLLM's prefetch does: daemon threads, ~16 MiB sequential reads, skipped when the files would
not fit in the memory really available; every error is logged and swallowed. Each reader reads into
one buffer of its own, mapped for it and unmapped when it ends: a bytes object per read would be
malloc'd, and glibc, its mmap threshold raised by the first freed block, keeps such blocks in each
thread's arena (~170 MB more in the HTTP process after 50 on-demand loads, 8 readers).
"""

from __future__ import annotations

import itertools
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from common.folderjson import ModelError
from common.modelfiles import files_to_load
from common.modelfolder import read_model_folder
from orchestrator import readorder, residency
from orchestrator.envfiles import Extent, environment_extents, packages_for
from orchestrator.memory import available_bytes

BLOCK = 16 * 1024 * 1024
# A volume that delivers the model's first PROBE_BYTES at FAST_MB_S or more keeps up with the loader's
# own reads: the prefetch stops there. Measured on a local disk at ~2.5 GB/s, reading a 4 GB checkpoint
# ahead made ready 1.2x later (its reads queued the forkserver's import behind them); a 1.3 GB one
# gained nothing either way. A network volume or a FUSE mount at 200 MB/s is read to the end.
PROBE_BYTES = 128 * 1024 * 1024
FAST_MB_S = 1000.0
MAX_FRACTION_OF_MEMORY = 0.9
OFF = "disabled (WARMPOOL_PREFETCH=off)"
ENVIRONMENT_OFF = "disabled (WARMPOOL_PREFETCH_ENVIRONMENT=off)"

Detail = dict[str, Any]
log = structlog.get_logger("warmpool.prefetch")


@dataclass
class Group:
    """One kind of files prefetch reads: the environment's or the model's."""

    extents: list[Extent]  # in reading order
    bytes_done: int = 0  # read, or found in the page cache
    bytes_cached: int = 0  # of those, found in the page cache: not read again
    skipped: str | None = None
    started: float | None = None  # when its first block was taken
    stopped: str | None = None  # why the rest was left to the loader

    @property
    def bytes_total(self) -> int:
        return sum(length for _, _, length in self.extents)

    @property
    def files(self) -> int:
        return len({path for path, _, _ in self.extents})

    def as_detail(self) -> Detail:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        return {
            **({"stopped": self.stopped} if self.stopped else {}),
            "files": self.files,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "bytes_cached": self.bytes_cached,
        }


@dataclass
class Progress:
    environment: Group
    model: Group
    errors: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def groups(self) -> list[Group]:
        """The groups to read, in reading order: the forkserver imports before the engine loads."""
        return [g for g in (self.environment, self.model) if g.skipped is None]

    def as_detail(self) -> Detail:
        """Totals over what is read, then each group on its own."""
        done = sum(g.bytes_done for g in self.groups)
        cached = sum(g.bytes_cached for g in self.groups)
        elapsed = max(time.monotonic() - self.started, 1e-6)
        return {
            "files": sum(g.files for g in self.groups),
            "bytes_done": done,
            "bytes_total": sum(g.bytes_total for g in self.groups),
            "bytes_cached": cached,
            "mb_per_s": round((done - cached) / elapsed / 1e6, 1),  # what was read, not what was found
            "errors": self.errors,
            "environment": self.environment.as_detail(),
            "model": self.model.as_detail(),
        }

    def skip_reason(self) -> str | None:
        """Why nothing is read, or None when something is."""
        if self.groups:
            return None
        return f"environment: {self.environment.skipped}; model: {self.model.skipped}"


def model_files(folder: Path) -> list[Path]:
    """The files serving the folder reads, in the order they are read (common.modelfiles), less any
    that a symlink leads out of the volume: the folder itself, or the cached repo for a Hugging Face
    snapshot, whose files link into the repo's blobs/."""
    volume = folder.parent.parent if folder.parent.name == "snapshots" else folder
    volume = volume.resolve()
    return [p for p in files_to_load(folder) if p.resolve().is_relative_to(volume)]


def plan(environment: list[Extent] | None, model: list[Extent], available: int | None, reserved: int = 0) -> Progress:
    """What to read (environment None: switched off). The RAM guard: the model's files if they fit
    in 90% of the memory available less what the engine's build will allocate beside them
    (`reserved`: a converted copy of the weights), the environment's if they fit beside them (the
    model first: without it the engine reads the weights cold; without the environment only the
    import's pages). Pages read ahead into memory that the build then needs are evicted before
    they are used and read twice: a 4 GB bfloat16 checkpoint served in float32 (8 GB) with 12 GB
    available was ready 1.5x later with the prefetch than without it."""
    progress = Progress(Group(environment or []), Group(model))
    room = available - reserved if available is not None else None
    limit = MAX_FRACTION_OF_MEMORY * room if room is not None else float("inf")
    beside = f" less the {reserved} B the engine converts the weights into" if reserved else ""
    env, weights = progress.environment, progress.model
    if not weights.bytes_total:
        weights.skipped = "nothing to read"
    elif weights.bytes_total > limit:
        weights.skipped = (
            f"model files ({weights.bytes_total} B) exceed 90% of available memory ({available} B{beside})"
        )
    if environment is None:
        env.skipped = ENVIRONMENT_OFF
    elif not env.bytes_total:
        env.skipped = "nothing to read"
    elif env.bytes_total + (weights.bytes_total if weights.skipped is None else 0) > limit:
        env.skipped = (
            f"environment files ({env.bytes_total} B) with the model's exceed 90% of available memory ({available} B)"
        )
    return progress


def start(
    folder: Path,
    preload: list[str],
    threads: int,
    enabled: bool,
    environment: bool,
    on_progress: Callable[[Detail], None],
    on_done: Callable[[Detail], None],
    on_skip: Callable[[str], None],
    views: str | None = None,
) -> None:
    """Plan the reads and read them on daemon threads; returns at once (planning reads the
    packages' RECORD files and library headers, so the first reader does it). `views`: the
    safetensors dtype a CPU engine computes in, whose vocabulary tables it leaves on the file
    (orchestrator.readorder); None on a GPU."""
    if not enabled:
        on_skip(OFF)
        return
    args = (folder, preload if environment else None, threads, views, on_progress, on_done, on_skip)
    threading.Thread(target=_plan_and_read, args=args, name="prefetch-0", daemon=True).start()


def _plan_and_read(
    folder: Path,
    preload: list[str] | None,
    threads: int,
    views: str | None,
    on_progress: Callable[[Detail], None],
    on_done: Callable[[Detail], None],
    on_skip: Callable[[str], None],
) -> None:
    model = _listed(lambda f: _model(f, views), folder) or []
    reserved = _converted(folder, views)
    progress = plan(_listed(_environment, preload), model, available_bytes(), reserved)
    reason = progress.skip_reason()
    if reason is not None:
        on_skip(reason)
        return
    blocks: queue.SimpleQueue[tuple[Group, Path, int, int]] = queue.SimpleQueue()
    for group in progress.groups:
        for path, start, length in group.extents:
            for offset in range(start, start + length, BLOCK):
                blocks.put((group, path, offset, min(BLOCK, start + length - offset)))
    lock = threading.Lock()
    remaining = [min(threads, blocks.qsize())]

    def reader() -> None:
        with mmap.mmap(-1, BLOCK) as mapped, memoryview(mapped) as buffer:
            read_blocks(buffer)
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            on_done(progress.as_detail())

    def read_blocks(buffer: memoryview) -> None:
        while True:
            try:
                group, path, offset, length = blocks.get_nowait()
            except queue.Empty:
                break
            with lock:
                group.started = group.started or time.monotonic()
                if group.stopped:
                    continue
            cached = _cached(path, offset, length)
            read = length if cached else _read_block(path, offset, length, buffer)
            with lock:
                group.bytes_done += max(read, 0)
                group.bytes_cached += length if cached else 0
                progress.errors += read < 0
                if group is progress.model and group.stopped is None:
                    group.stopped = _fast_volume(group)
                on_progress(progress.as_detail())

    for i in range(1, remaining[0]):
        threading.Thread(target=reader, name=f"prefetch-{i}", daemon=True).start()
    reader()


def _environment(preload: list[str]) -> list[Extent]:
    return environment_extents(packages_for(preload))


def _model(folder: Path, views: str | None) -> list[Extent]:
    """The model's files in reading order; the weights of each safetensors checkpoint (the model's,
    then each module's) tensor by tensor as the loader reads them (orchestrator.readorder), whole
    where a checkpoint cannot be parsed (the loader reports why)."""
    if not folder.is_dir():
        return []
    vocab, views = _tables(folder, views)
    extents: list[Extent] = []
    tables: list[Extent] = []  # read after everything else, a module's weights included
    for (_, checkpoint), run in itertools.groupby(
        model_files(folder), key=lambda p: (p.parent, p.suffix == ".safetensors")
    ):
        paths = list(run)
        try:
            now, last = readorder.weight_extents(paths, vocab, views) if checkpoint else (_whole(paths), [])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            now, last = _whole(paths), []
        extents += now
        tables += last
    return extents + tables


def _converted(folder: Path, views: str | None) -> int:
    """What a CPU engine's build allocates converting the folder's safetensors weights (0 where
    that cannot be told: the loader reports a broken checkpoint)."""
    try:
        return readorder.converted_bytes([p for p in model_files(folder) if p.suffix == ".safetensors"], views)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return 0


def _whole(paths: list[Path]) -> list[Extent]:
    return [(path, 0, path.stat().st_size) for path in paths]


def _tables(folder: Path, views: str | None) -> tuple[int | None, str | None]:
    """The vocabulary size whose tables a native engine leaves on the file in dtype `views`; no
    tables (None, None) for a model transformers loads, which reads every tensor whole."""
    try:
        info = read_model_folder(folder)
    except ModelError:
        return None, None
    vocab = info.config.get("vocab_size")
    return (vocab, views) if info.native and isinstance(vocab, int) else (None, None)


def _listed(lister: Callable[[Any], list[Extent]], arg: Any) -> list[Extent] | None:
    """lister(arg), [] when listing fails (logged: prefetch is best-effort and must not stop the
    start); None when arg is None (that group is switched off)."""
    if arg is None:
        return None
    try:
        return lister(arg)
    except Exception as exc:
        log.warning("prefetch_listing_failed", error=str(exc))
        return []


def _fast_volume(group: Group) -> str | None:
    """Why the rest of the group is left to the loader: the volume reads fast enough by itself."""
    read = group.bytes_done - group.bytes_cached
    rate = read / max(time.monotonic() - (group.started or 0.0), 1e-6) / 1e6
    if read < PROBE_BYTES or rate < FAST_MB_S:
        return None
    return f"the volume read {read} B at {rate:.0f} MB/s: the loader's own reads keep up"


def _cached(path: Path, offset: int, length: int) -> bool:
    """The block is in the page cache already (and this process may know it): nothing to read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False  # _read_block reports it
    try:
        return residency.all_resident(fd, offset, length)
    finally:
        os.close(fd)


def _read_block(path: Path, offset: int, length: int, buffer: memoryview) -> int:
    """Read one block into the page cache (through `buffer`, overwritten); -1 on error (logged, never raised)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        log.warning("prefetch_read_failed", path=str(path), error=str(exc))
        return -1
    try:
        done = 0
        while done < length:
            with buffer[: min(length - done, len(buffer))] as window:
                got = os.preadv(fd, [window], offset + done)
            if not got:
                break
            done += got
        return done
    except OSError as exc:
        log.warning("prefetch_read_failed", path=str(path), error=str(exc))
        return -1
    finally:
        os.close(fd)
