"""`warmpool embed`'s files (orchestrator/embed/): the corpus readers, shards, and the outputs an
interrupted run leaves for --resume."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.embed import sinks
from orchestrator.embed.corpus import Corpus, InputError, Row, Shard

RECORDS = [{"id": f"doc-{i}", "text": f"text number {i}", "extra": i} for i in range(10)]


def write_corpus(folder: Path, suffix: str, records: list[dict[str, object]] = RECORDS) -> Path:
    path = folder / f"corpus{suffix}"
    if suffix == ".jsonl":
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    elif suffix == ".csv":
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    else:
        pq.write_table(pa.Table.from_pylist(records), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_each_format_reads_the_same_rows_with_their_ids(tmp_path: Path, suffix: str) -> None:
    corpus = Corpus(write_corpus(tmp_path, suffix))
    corpus.check()
    assert list(corpus.rows()) == [Row(i, f"doc-{i}", f"text number {i}") for i in range(10)]
    assert corpus.count() == 10


def test_field_names_another_text_column(tmp_path: Path) -> None:
    records = [{"body": "a"}, {"body": "b"}]
    assert [r.text for r in Corpus(write_corpus(tmp_path, ".csv", records), field="body").rows()] == ["a", "b"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_missing_text_column_is_refused_before_any_row(tmp_path: Path, suffix: str) -> None:
    with pytest.raises(InputError, match="no column 'body'"):
        Corpus(write_corpus(tmp_path, suffix), field="body").check()


def test_a_row_without_text_is_an_input_error(tmp_path: Path) -> None:
    corpus = Corpus(write_corpus(tmp_path, ".jsonl", [{"text": "a"}, {"text": 3}]))
    with pytest.raises(InputError, match="row 1 has a int"):
        list(corpus.rows())


def test_blank_jsonl_lines_are_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n{"text": "b"}\n')
    assert [(r.index, r.text) for r in Corpus(path).rows()] == [(0, "a"), (1, "b")]
    assert Corpus(path).count() == 2


@pytest.mark.parametrize("total", [0, 1, 7, 10])
def test_shards_partition_the_rows(tmp_path: Path, total: int) -> None:
    corpus = Corpus(write_corpus(tmp_path, ".jsonl", RECORDS[:total]) if total else tmp_path / "none.jsonl")
    if not total:
        corpus.path.write_bytes(b"")
    shards = [Shard(i, 3) for i in range(3)]
    taken = [[r.index for r in corpus.rows(shard)] for shard in shards]
    assert sorted(i for part in taken for i in part) == list(range(total))
    assert [len(part) for part in taken] == [shard.size(total) for shard in shards]


@pytest.mark.parametrize("text", ["3", "3/3", "-1/2", "a/b", "1/0"])
def test_a_bad_shard_is_a_usage_error(text: str) -> None:
    with pytest.raises(InputError):
        Shard.parse(text)


def rows(first: int, count: int) -> tuple[list[Row], np.ndarray]:
    chunk = [Row(i, f"doc-{i}", f"t{i}") for i in range(first, first + count)]
    return chunk, np.arange(first * 4, (first + count) * 4, dtype=np.float32).reshape(count, 4)


def test_jsonl_resume_drops_a_line_cut_short(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    sink = sinks.open_sink(out, resume=False)
    sink.write(*rows(0, 3))
    sink.flush()
    with out.open("ab") as file:
        file.write(b'{"row": 3, "id": "doc-3", "embed')  # killed mid-write
    assert list(sinks.open_sink(out, resume=True).existing()) == [(i, f"doc-{i}") for i in range(3)]
    assert out.read_bytes().endswith(b"]}\n")


def test_parquet_parts_of_an_interrupted_run_are_resumed_and_joined(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    first = sinks.open_sink(out, resume=False)
    first.write(*rows(0, 3))
    first.flush()  # interrupted here: the parts stay, OUT is not there yet
    assert not out.exists()
    second = sinks.open_sink(out, resume=True)
    assert list(second.existing()) == [(i, f"doc-{i}") for i in range(3)]
    second.write(*rows(3, 2))
    second.close()
    table = pq.read_table(out)
    assert table.column("row").to_pylist() == list(range(5))
    assert np.array_equal(np.array(table.column("embedding").to_pylist()), np.arange(20).reshape(5, 4))
    assert not (tmp_path / "out.parquet.parts").exists()


def test_parquet_parts_with_and_without_ids_join_into_one_table(tmp_path: Path) -> None:
    """A JSONL input whose first rows have no id: the first part has no id column, the next has one."""
    out = tmp_path / "out.parquet"
    sink = sinks.open_sink(out, resume=False)
    no_ids, vectors = rows(0, 2)
    sink.write([Row(r.index, None, r.text) for r in no_ids], vectors)
    sink.flush()
    sink.write(*rows(2, 2))
    sink.close()
    assert pq.read_table(out).column("id").to_pylist() == [None, None, "doc-2", "doc-3"]


def test_an_existing_output_is_refused_without_resume(tmp_path: Path) -> None:
    (tmp_path / "out.jsonl").write_bytes(b'{"row": 0, "embedding": [1.0]}\n')
    with pytest.raises(InputError, match="--resume"):
        sinks.open_sink(tmp_path / "out.jsonl", resume=False)


def test_npy_is_readable_after_each_chunk_and_refuses_resume(tmp_path: Path) -> None:
    out = tmp_path / "out.npy"
    sink = sinks.open_sink(out, resume=False)
    sink.write(*rows(0, 2))
    assert np.array_equal(np.load(out), rows(0, 2)[1])  # an interruption here leaves these rows
    sink.write(*rows(2, 3))
    sink.close()
    assert np.array_equal(np.load(out), np.arange(20, dtype=np.float32).reshape(5, 4))
    with pytest.raises(InputError, match=r"\.npy"):
        sinks.open_sink(out, resume=True)
