"""The Batch API's durable state in WARMPOOL_BATCH_DIR: files in files/, a running job's output and
error lines in outputs/, and the records and each job's progress in SQLite (WAL).

Synchronous: every call runs on the executor. A group of output lines is appended and fsynced,
then its progress (input offset, next line, output offsets, counts) committed: after a crash
(SIGKILL included) `reopen` truncates the outputs to the committed offsets, so the job resumes at
its first uncommitted line with no line lost or written twice.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from server.batches.space import PARTIAL, FileTooLarge, FolderSpace
from server.batches.states import moved

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, record TEXT NOT NULL, created_at INTEGER NOT NULL, owner TEXT
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, record TEXT NOT NULL, created_at INTEGER NOT NULL,
    in_offset INTEGER NOT NULL DEFAULT 0, next_line INTEGER NOT NULL DEFAULT 0,
    out_offset INTEGER NOT NULL DEFAULT 0, err_offset INTEGER NOT NULL DEFAULT 0, owner TEXT
);
"""
TABLES = ("files", "batches")


@dataclass(frozen=True)
class Owner:
    """Whose records a request sees: its tenant's (server/tenants/), or, on a server without keys, those
    made without one (None). Calls without an Owner are the server's own and see every record."""

    tenant: str | None


@dataclass(frozen=True)
class Progress:
    """What a job has committed: the input's byte offset and line number it goes on from, and the
    lengths of its output and error files."""

    in_offset: int = 0
    next_line: int = 0
    out_offset: int = 0
    err_offset: int = 0


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


class BatchStore:
    def __init__(self, root: Path, retention_s: float, max_bytes: int | None = None) -> None:
        self.root = root
        self.retention_s = retention_s
        self.space = FolderSpace(root, max_bytes if max_bytes is not None else 2**63)
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, shared by the executor's threads
        self._opening = threading.Lock()  # its opening: two threads' first calls would open two

    def _conn(self) -> sqlite3.Connection:
        """The database, opened (and the folders made) at first use: an unusable folder is an
        error of the call that met it, never of the server's start."""
        if self._db is None:
            with self._opening:
                if self._db is None:
                    self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        for partial in (self.root / "files").glob(f"*{PARTIAL}"):  # uploads a crash cut short
            partial.unlink()
        db = sqlite3.connect(self.root / "batches.sqlite3", check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA)
        for table in TABLES:  # a folder made before records had owners
            if "owner" not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT")
        return db

    def used_bytes(self) -> int:
        """What the folder's files and job outputs hold (WARMPOOL_BATCH_MAX_BYTES bounds it)."""
        self._conn()
        return self.space.used()

    def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn().execute(sql, args).fetchall()

    # files
    def file_path(self, file_id: str) -> Path:
        return self.root / "files" / file_id

    def output_path(self, batch_id: str, which: str) -> Path:
        return self.root / "outputs" / f"{batch_id}.{which}.jsonl"

    def add_file(self, filename: str, purpose: str, data: bytes, owner: Owner) -> dict[str, Any]:
        incoming = self.incoming(len(data))
        try:
            incoming.write(data)
            return incoming.commit(filename, purpose, owner)
        except BaseException:
            incoming.discard()
            raise

    def incoming(self, max_file_bytes: int) -> IncomingFile:
        """A new file, written as it arrives (POST /v1/files streams its form's file part into it)."""
        self._conn()
        return IncomingFile(self, max_file_bytes)

    def _register(self, file_id: str, filename: str, purpose: str, size: int, owner: str | None) -> dict[str, Any]:
        now = int(time.time())
        record = {
            "id": file_id,
            "object": "file",
            "bytes": size,
            "created_at": now,
            "expires_at": now + int(self.retention_s),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        with self._lock:
            self._conn().execute(
                "INSERT OR REPLACE INTO files (id, record, created_at, owner) VALUES (?, ?, ?, ?)",
                (file_id, orjson.dumps(record), now, owner),
            )
        return record

    def _record(self, table: str, key: str, owner: Owner | None) -> dict[str, Any] | None:
        sql = f"SELECT record FROM {table} WHERE id = ?"  # the table is one of ours, never the client's
        rows = self._query(sql, key) if owner is None else self._query(sql + " AND owner IS ?", key, owner.tenant)
        return orjson.loads(rows[0][0]) if rows else None

    def file(self, file_id: str, owner: Owner | None = None) -> dict[str, Any] | None:
        return self._record("files", file_id, owner)

    def files(self, after: str | None, limit: int, owner: Owner) -> list[dict[str, Any]]:
        """Newest first, from after the file `after`; limit + 1 of them (the caller's has_more)."""
        return self._page("files", after, limit, owner)

    def delete_file(self, file_id: str) -> bool:
        with self._lock:
            deleted = self._conn().execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount
        self._unlink(self.file_path(file_id))
        return bool(deleted)

    def _unlink(self, path: Path) -> None:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        path.unlink(missing_ok=True)
        self.space.release(size)

    def _page(self, table: str, after: str | None, limit: int, owner: Owner) -> list[dict[str, Any]]:
        sql = f"SELECT record FROM {table} WHERE owner IS ?"  # the table is one of ours, never the client's
        args: tuple[Any, ...] = (owner.tenant,)
        if after is not None:
            sql += f" AND rowid < (SELECT rowid FROM {table} WHERE id = ?)"
            args += (after,)
        rows = self._query(sql + " ORDER BY rowid DESC LIMIT ?", *args, limit + 1)
        return [orjson.loads(r[0]) for r in rows]

    # batches
    def add_batch(self, record: dict[str, Any], owner: Owner) -> None:
        with self._lock:
            self._conn().execute(
                "INSERT INTO batches (id, record, created_at, owner) VALUES (?, ?, ?, ?)",
                (record["id"], orjson.dumps(record), record["created_at"], owner.tenant),
            )

    def batch(self, batch_id: str, owner: Owner | None = None) -> dict[str, Any] | None:
        return self._record("batches", batch_id, owner)

    def owner(self, batch_id: str) -> Owner:
        """Whose the job is: its lines run with that tenant's models and quota."""
        return Owner(self._query("SELECT owner FROM batches WHERE id = ?", batch_id)[0][0])

    def batches(self, after: str | None, limit: int, owner: Owner) -> list[dict[str, Any]]:
        return self._page("batches", after, limit, owner)

    def unfinished(self) -> list[str]:
        """Jobs to run (or to resume, after a restart), oldest first."""
        rows = self._query("SELECT id, record FROM batches ORDER BY rowid")
        live = ("validating", "in_progress", "finalizing", "cancelling")
        return [r[0] for r in rows if orjson.loads(r[1])["status"] in live]

    def move(self, batch_id: str, status: str, **fields: Any) -> dict[str, Any]:
        """The job to `status` (states.moved checks the step and stamps its time), with `fields`."""
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                (raw,) = db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
                record = moved(orjson.loads(raw), status, int(time.time()))
                record.update(fields)
                db.execute("UPDATE batches SET record = ? WHERE id = ?", (orjson.dumps(record), batch_id))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite rolls back by itself on some errors (a full disk)
                    db.execute("ROLLBACK")
                raise
        return record

    def progress(self, batch_id: str) -> Progress:
        rows = self._query("SELECT in_offset, next_line, out_offset, err_offset FROM batches WHERE id = ?", batch_id)
        return Progress(*rows[0])

    def reopen(self, batch_id: str) -> Progress:
        """The committed progress, the outputs cut back to it: lines a crash left past it are dropped
        (their input lines run again)."""
        progress = self.progress(batch_id)
        (self.root / "outputs").mkdir(exist_ok=True)
        for which, size in (("output", progress.out_offset), ("error", progress.err_offset)):
            with open(self.output_path(batch_id, which), "ab") as out:
                cut = out.tell() - size
                out.truncate(size)
                os.fsync(out.fileno())
            self.space.release(max(0, cut))
        return progress

    def append(
        self, batch_id: str, done: Progress, output: bytes, errors: bytes, ok: int, failed: int, tokens: int = 0
    ) -> None:
        """A group's lines appended and fsynced, then its progress, counts and usage (`tokens`: its
        answered lines' prompt tokens) committed; FolderFull,
        nothing written, if they would take the folder past WARMPOOL_BATCH_MAX_BYTES."""
        self.space.claim(len(output) + len(errors))
        try:
            for which, lines in (("output", output), ("error", errors)):
                if lines:
                    with open(self.output_path(batch_id, which), "ab") as out:
                        out.write(lines)
                        out.flush()
                        os.fsync(out.fileno())
        except OSError:
            self.space.recount()  # written in part: the folder says how much
            raise
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                (raw,) = db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
                record = orjson.loads(raw)
                counts = record["request_counts"]
                counts["completed"] += ok
                counts["failed"] += failed
                record["usage"] = usage(record.get("usage"), tokens)
                db.execute(
                    "UPDATE batches SET record = ?, in_offset = ?, next_line = ?, out_offset = ?, err_offset = ?"
                    " WHERE id = ?",
                    (orjson.dumps(record), done.in_offset, done.next_line, done.out_offset, done.err_offset, batch_id),
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite rolls back by itself on some errors (a full disk)
                    db.execute("ROLLBACK")
                raise

    def publish(self, batch_id: str) -> dict[str, str]:
        """The job's outputs as files (purpose batch_output): output_file_id, and error_file_id where
        any line failed. Their ids follow from the job's, so a publish a crash cut short is redone."""
        ids: dict[str, str] = {}
        progress = self.progress(batch_id)
        for which, size in (("output", progress.out_offset), ("error", progress.err_offset)):
            path = self.output_path(batch_id, which)
            if which == "error" and size == 0:
                self._unlink(path)
                continue
            file_id = f"file-{batch_id.removeprefix('batch_')}-{which}"
            if path.exists():
                path.rename(self.file_path(file_id))
            elif not self.file_path(file_id).exists():  # cancelled before its first line
                self.file_path(file_id).touch()
            self._register(file_id, f"{batch_id}_{which}.jsonl", "batch_output", size, self.owner(batch_id).tenant)
            ids[f"{which}_file_id"] = file_id
        return ids

    def sweep(self, now: float) -> int:
        """Files and finished jobs older than WARMPOOL_BATCH_RETENTION deleted; how many."""
        cutoff = int(now - self.retention_s)
        old = [r[0] for r in self._query("SELECT id FROM files WHERE created_at < ?", cutoff)]
        for file_id in old:
            self.delete_file(file_id)
        finished = ("completed", "failed", "cancelled", "expired")
        jobs = self._query("SELECT id, record FROM batches WHERE created_at < ?", cutoff)
        gone = [r[0] for r in jobs if orjson.loads(r[1])["status"] in finished]
        with self._lock:
            self._conn().executemany("DELETE FROM batches WHERE id = ?", [(i,) for i in gone])
        for batch_id in gone:
            for which in ("output", "error"):
                self._unlink(self.output_path(batch_id, which))
        return len(old) + len(gone)


def usage(so_far: dict[str, Any] | None, tokens: int) -> dict[str, Any]:
    """OpenAI's Batch `usage` with `tokens` more prompt tokens (an encoder's answers have no output tokens)."""
    total = (so_far or {}).get("input_tokens", 0) + tokens
    return {
        "input_tokens": total,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total,
    }


class IncomingFile:
    """A file written as it arrives, to files/<id>.partial: each chunk within the file's bound and claimed
    from the folder's before it is written; fsynced and renamed into place by commit, removed by discard."""

    def __init__(self, store: BatchStore, max_file_bytes: int) -> None:
        self.store = store
        self.limit = max_file_bytes
        self.file_id = new_id("file-")
        self.partial = store.file_path(self.file_id).with_name(self.file_id + PARTIAL)
        self.size = 0
        self._out = open(self.partial, "wb")  # noqa: SIM115 - closed by commit or discard

    def write(self, data: bytes | memoryview) -> None:
        if self.size + len(data) > self.limit:
            raise FileTooLarge(self.limit)
        self.store.space.claim(len(data))
        self.size += len(data)  # claimed: discard gives it back, written or not
        self._out.write(data)

    def commit(self, filename: str, purpose: str, owner: Owner) -> dict[str, Any]:
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        self.partial.rename(self.store.file_path(self.file_id))
        return self.store._register(self.file_id, filename, purpose, self.size, owner.tenant)

    def discard(self) -> None:
        """The upload given up (refused, cut short): its bytes removed and given back to the folder."""
        self._out.close()
        if self.partial.exists():
            self.partial.unlink()
            self.store.space.release(self.size)
