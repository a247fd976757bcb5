"""The batch folder's bounds: an upload's form parsed and written as it arrives, refused as soon as a
bound is passed (nothing past it written, its partial file removed), the folder's bytes counted across
uploads, job outputs, deletes and restarts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from server.batches import space
from server.batches.space import DiskFull, FileTooLarge, FolderFull
from server.batches.store import BatchStore, Owner, Progress
from server.batches.upload import FileForm, FormError

NOBODY = Owner(None)
RETENTION_S = 3600.0
BOUNDARY = b"xYzBoundary"


def form(data: bytes, purpose: bytes = b"batch") -> bytes:
    return (
        b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose + b"\r\n"
        b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + data + b"\r\n--" + BOUNDARY + b"--\r\n"
    )


def form_for(store: BatchStore, max_file_bytes: int) -> FileForm:
    return FileForm("multipart/form-data; boundary=" + BOUNDARY.decode(), lambda: store.incoming(max_file_bytes))


def fed(upload: FileForm, body: bytes, chunk: int) -> None:
    for start in range(0, len(body), chunk):
        upload.feed(body[start : start + chunk])


def partials(store: BatchStore) -> list[Path]:
    return list((store.root / "files").glob("*.partial"))


def test_a_form_fed_in_small_chunks_writes_its_file_part_as_it_arrives(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    data = b'{"custom_id": "a"}\r\n--not-the-boundary\r\n' * 50
    upload = form_for(store, 1 << 20)
    fed(upload, form(data), chunk=7)  # boundaries split across chunks
    assert upload.completed() == ("in.jsonl", "batch")
    assert upload.file is not None
    record = upload.file.commit("in.jsonl", "batch", NOBODY)
    assert store.file_path(record["id"]).read_bytes() == data and record["bytes"] == len(data)
    assert store.used_bytes() == len(data) and partials(store) == []


def test_a_file_past_its_limit_is_refused_as_its_bytes_arrive(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    upload = form_for(store, 1000)
    body = form(b"x" * 5000)
    with pytest.raises(FileTooLarge):
        fed(upload, body, chunk=256)
    assert upload.file is not None and upload.file.size <= 1000  # nothing past the bound written
    upload.discard()
    assert partials(store) == [] and store.used_bytes() == 0


def test_an_upload_that_would_pass_the_folders_bound_is_refused_before_it_is_written(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S, max_bytes=3000)
    store.add_file("first.jsonl", "batch", b"x" * 2000, NOBODY)
    upload = form_for(store, 1 << 20)
    with pytest.raises(FolderFull, match="WARMPOOL_BATCH_MAX_BYTES"):
        fed(upload, form(b"y" * 2000), chunk=512)
    upload.discard()
    assert partials(store) == [] and store.used_bytes() == 2000


def test_a_form_cut_short_is_a_form_error(tmp_path: Path) -> None:
    upload = form_for(BatchStore(tmp_path, RETENTION_S), 1 << 20)
    upload.feed(form(b"abc")[:-10])
    with pytest.raises(FormError, match="closing boundary"):
        upload.completed()


def test_a_jobs_output_past_the_folders_bound_is_refused_unwritten(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S, max_bytes=10)
    store.add_batch({"id": "batch_1", "created_at": 0, "request_counts": {"completed": 0, "failed": 0}}, NOBODY)
    store.reopen("batch_1")
    store.append("batch_1", Progress(1, 1, 6, 0), b"abcde\n", b"", ok=1, failed=0)
    with pytest.raises(FolderFull):
        store.append("batch_1", Progress(2, 2, 12, 0), b"fghij\n", b"", ok=1, failed=0)
    assert store.output_path("batch_1", "output").read_bytes() == b"abcde\n"
    assert store.progress("batch_1") == Progress(1, 1, 6, 0)


def test_the_folders_bytes_are_counted_again_at_a_restart_and_given_back_by_deletes(tmp_path: Path) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    kept = store.add_file("a.jsonl", "batch", b"x" * 300, NOBODY)
    gone = store.add_file("b.jsonl", "batch", b"y" * 200, NOBODY)
    (tmp_path / "files" / "file-crashed.partial").write_bytes(b"z" * 999)  # an upload a crash cut short
    restarted = BatchStore(tmp_path, RETENTION_S)
    assert restarted.used_bytes() == 500 and partials(restarted) == []
    restarted.delete_file(gone["id"])
    assert restarted.used_bytes() == 300 and restarted.file(kept["id"]) is not None


def test_a_write_that_would_leave_the_disk_less_than_its_reserve_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BatchStore(tmp_path, RETENTION_S)
    free = space.FREE_RESERVE + 1000
    monkeypatch.setattr(space.shutil, "disk_usage", lambda _: SimpleNamespace(free=free))
    store.add_file("fits.jsonl", "batch", b"x" * 1000, NOBODY)
    with pytest.raises(DiskFull):
        store.add_file("past.jsonl", "batch", b"x" * 1001, NOBODY)
    assert partials(store) == [] and store.used_bytes() == 1000
