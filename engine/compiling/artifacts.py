"""A compiled artifact's safety in the cache: nothing in it can stop an engine's start.

An artifact is machine code an engine maps into itself: a torn write or a bad disk block in it is
not an exception but a crash. So a package carries a manifest (every file's sha256, written after
the files when it is built) that is checked before it is mapped; and an engine leaves a marker,
locked, while it loads and first runs one: an engine that finds a marker whose lock nobody holds
knows the artifact killed the engine that took it. Either way the artifact is quarantined (moved
into the cache's quarantine/ with the reason beside it; the newest few kept, for the operator)
and the engine serves eager and builds it again, as for a missing one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

MANIFEST = "manifest.json"
QUARANTINE = "quarantine"
QUARANTINE_KEEP = 4  # quarantined artifacts kept (the newest); each is a few MB
REASON = "reason.txt"
LOADING = ".loading"  # in the cache: one marker per engine loading an artifact, named KEY.PID
CHUNK = 1 << 20


class CorruptArtifact(Exception):
    """An artifact whose files are not the ones it was built with (or that has no manifest)."""


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def write_manifest(folder: Path) -> None:
    """Record the sha256 of every file in `folder`: written beside them, then renamed into place
    and synced, so a manifest is only ever whole and only after the files it covers."""
    files = {p.name: _digest(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    partial = folder / f".{MANIFEST}.partial"
    with open(partial, "w") as file:
        json.dump({"sha256": files}, file, sort_keys=True)
        file.flush()
        os.fsync(file.fileno())
    os.rename(partial, folder / MANIFEST)


def verify(folder: Path) -> None:
    """CorruptArtifact unless every file the manifest names is there with its checksum."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["sha256"]
    except FileNotFoundError:
        raise CorruptArtifact(f"it has no {MANIFEST} (built before checksums, or torn)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptArtifact(f"its {MANIFEST} is unreadable: {type(exc).__name__}") from None
    for name, digest in sorted(files.items()):
        try:
            if _digest(folder / name) != digest:
                raise CorruptArtifact(f"{name} does not match its sha256 in {MANIFEST} (torn or overwritten)")
        except FileNotFoundError:
            raise CorruptArtifact(f"{name} is missing") from None


def quarantine(artifact: Path, reason: str) -> str | None:
    """Move `artifact` into the cache's quarantine/ with `reason` beside it (what is moved aside
    is never loaded again), keeping the newest QUARANTINE_KEEP; its path there, relative to the
    cache, or None if another engine moved it first. Where it cannot be moved, it is removed."""
    root = artifact.parent / QUARANTINE
    with contextlib.suppress(OSError):  # room for it; another engine may be pruning too
        kept = sorted(root.iterdir(), key=lambda p: p.stat().st_mtime)
        for old in kept[: max(len(kept) - QUARANTINE_KEEP + 1, 0)]:
            shutil.rmtree(old, ignore_errors=True)
    try:
        root.mkdir(exist_ok=True)
        aside = root / f"{artifact.name}.{time.strftime('%Y%m%dT%H%M%S')}.{os.getpid()}"
        os.rename(artifact, aside)
    except FileNotFoundError:
        return None
    except OSError:
        shutil.rmtree(artifact, ignore_errors=True)
        return None
    with contextlib.suppress(OSError):
        (aside / REASON).write_text(reason + "\n")
    return f"{QUARANTINE}/{aside.name}"


@contextlib.contextmanager
def loading(cache: Path, key: str) -> Iterator[None]:
    """This engine loads and first runs artifact `key` within: its marker is there, locked, until
    the end (a crash leaves it, unlocked, for the next engine's `crashed_loading`)."""
    folder = cache / LOADING
    folder.mkdir(exist_ok=True)
    marker = folder / f"{key}.{os.getpid()}"
    locking = folder / f".{marker.name}"  # locked before it takes its name: no one sees it unlocked
    with open(locking, "w") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        os.rename(locking, marker)
        try:
            yield
        finally:
            marker.unlink(missing_ok=True)


def crashed_loading(cache: Path, key: str) -> list[int]:
    """The pids of engines that died while loading artifact `key`: its markers no live engine
    holds the lock of (a pid reused since does not matter). Those markers are removed."""
    dead = []
    for marker in (cache / LOADING).glob(f"{key}.*"):
        try:
            file = open(marker)  # noqa: SIM115  (closed below; gone meanwhile: its engine finished)
        except FileNotFoundError:
            continue
        with file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # an engine loading it now
            marker.unlink(missing_ok=True)
        with contextlib.suppress(ValueError):
            dead.append(int(marker.name.rsplit(".", 1)[1]))
    return dead
