"""The Batch API's store: progress committed with its lines, a crash's uncommitted lines cut off at
resume, the status machine, the input lines' checks."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from server.batches import lines
from server.batches.states import StateError, moved
from server.batches.store import BatchStore, Owner, Progress

NOBODY = Owner(None)  # a server without keys

RETENTION_S = 3600.0


def job(store: BatchStore, batch_id: str = "batch_1") -> str:
    upload = store.add_file("in.jsonl", "batch", b"", NOBODY)
    now = int(time.time())
    record = {
        "id": batch_id,
        "status": "in_progress",
        "created_at": now,
        "input_file_id": upload["id"],
        "request_counts": {"total": 4, "completed": 0, "failed": 0},
    }
    store.add_batch(record, NOBODY)
    return batch_id


def test_resume_cuts_uncommitted_lines_and_goes_on_without_loss_or_repeat(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    batch_id = job(store)
    store.reopen(batch_id)
    first = Progress(in_offset=20, next_line=2, out_offset=4, err_offset=0)
    store.append(batch_id, first, b"a\nb\n", b"", ok=2, failed=0)
    # a crash after the next group's lines were written, before its progress was committed
    with open(store.output_path(batch_id, "output"), "ab") as out:
        out.write(b"c\nd\n")

    restarted = BatchStore(tmp_path, RETENTION_S)
    assert restarted.reopen(batch_id) == first
    assert store.output_path(batch_id, "output").read_bytes() == b"a\nb\n"
    restarted.append(batch_id, Progress(40, 4, 8, 0), b"c\nd\n", b"", ok=2, failed=0)
    assert store.output_path(batch_id, "output").read_bytes() == b"a\nb\nc\nd\n"
    record = restarted.batch(batch_id)
    assert record is not None and record["request_counts"] == {"total": 4, "completed": 4, "failed": 0}


def test_usage_is_committed_with_its_groups_lines(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    batch_id = job(store)
    store.reopen(batch_id)
    store.append(batch_id, Progress(10, 1, 2, 0), b"a\n", b"", ok=1, failed=0, tokens=7)
    store.append(batch_id, Progress(20, 2, 4, 0), b"b\n", b"", ok=1, failed=0, tokens=5)
    record = BatchStore(tmp_path, RETENTION_S).batch(batch_id)
    assert record is not None and record["usage"]["input_tokens"] == record["usage"]["total_tokens"] == 12


def test_a_publish_cut_short_is_redone(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    batch_id = job(store)
    store.reopen(batch_id)
    store.append(batch_id, Progress(10, 1, 2, 0), b"a\n", b"", ok=1, failed=0)
    first = store.publish(batch_id)
    assert store.publish(batch_id) == first  # a crash before the job was marked completed: published again
    assert set(first) == {"output_file_id"}  # no line failed: no error file
    assert store.file_path(first["output_file_id"]).read_bytes() == b"a\n"


def test_a_job_cancelled_before_its_first_line_publishes_an_empty_output(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    published = store.publish(job(store))
    assert store.file_path(published["output_file_id"]).read_bytes() == b""


@pytest.mark.parametrize(
    ("status", "to"), [("completed", "cancelling"), ("validating", "completed"), ("cancelling", "in_progress")]
)
def test_status_machine_refuses_moves_it_does_not_have(status: str, to: str) -> None:
    with pytest.raises(StateError):
        moved({"status": status}, to, 1)


def test_a_move_stamps_its_time() -> None:
    assert moved({"status": "in_progress"}, "cancelling", 7) == {"status": "cancelling", "cancelling_at": 7}


def test_sweep_deletes_only_what_is_past_retention(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    kept = store.add_file("new.jsonl", "batch", b"x\n", NOBODY)
    swept = store.sweep(time.time() + RETENTION_S + 1)
    assert swept == 1 and store.file(kept["id"]) is None and not store.file_path(kept["id"]).exists()


def test_check_finds_each_malformed_line() -> None:
    raw = [
        b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}',
        b"[1, 2]",
        b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "y"}}',
        b'{"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": "x"}',
    ]
    found = lines.Scan(total=4, duplicates={2})
    checked = [lines.check(line, i, "/v1/embeddings", found.duplicates) for i, line in enumerate(raw)]
    assert [c.error and c.error[0] for c in checked] == [None, "invalid_json", "duplicate_custom_id", "invalid_body"]
    assert orjson.loads(checked[0].body) == {"input": "x"}


def test_scan_counts_lines_duplicates_and_models(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"custom_id": "a", "body": {"model": "m"}}\n\n{"custom_id": "a", "body": {}}\nnot json\n')
    found = lines.scan(source)
    assert (found.total, found.duplicates, found.models, found.objects) == (3, {1}, {"m", None}, 2)
    group, offset = lines.read_group(source, 0, 2)
    assert len(group) == 2 and lines.read_group(source, offset, 5)[0] == [b"not json\n"]


def test_a_folder_from_before_owners_opens_its_records_as_nobodys(tmp_path: Path) -> None:
    """A batch folder written before records had owners: its records are a keyless server's."""
    import sqlite3

    db = sqlite3.connect(tmp_path / "batches.sqlite3")
    db.executescript(
        "CREATE TABLE files (id TEXT PRIMARY KEY, record TEXT NOT NULL, created_at INTEGER NOT NULL);"
        "CREATE TABLE batches (id TEXT PRIMARY KEY, record TEXT NOT NULL, created_at INTEGER NOT NULL,"
        " in_offset INTEGER NOT NULL DEFAULT 0, next_line INTEGER NOT NULL DEFAULT 0,"
        " out_offset INTEGER NOT NULL DEFAULT 0, err_offset INTEGER NOT NULL DEFAULT 0);"
    )
    db.execute("INSERT INTO files VALUES ('file-old', ?, 1)", (orjson.dumps({"id": "file-old"}),))
    db.commit()
    db.close()
    store = BatchStore(tmp_path, retention_s=3600)
    assert store.file("file-old", NOBODY) == {"id": "file-old"}
    assert store.file("file-old", Owner("search")) is None
    assert [f["id"] for f in store.files(None, 10, NOBODY)] == ["file-old"]


def test_first_calls_from_several_threads_open_one_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's first query and an upload's first write arrive together: one database connection,
    not two (a second one's WAL pragma met the first's lock: 'database is locked')."""
    import sqlite3
    import threading

    opened: list[object] = []
    connect = sqlite3.connect

    def counted(*args: object, **kwargs: object) -> sqlite3.Connection:
        opened.append(args)
        time.sleep(0.05)  # widens the window two unguarded first calls would both pass through
        return connect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite3, "connect", counted)
    store = BatchStore(tmp_path, retention_s=3600)
    start = threading.Barrier(8)

    def first_call() -> None:
        start.wait()
        store.file("file-x", NOBODY)

    threads = [threading.Thread(target=first_call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(opened) == 1
