"""The output: JSONL, Parquet or .npy (by OUT's suffix), row i of the output being the shard's row i.

Each keeps what a run has written readable when it is interrupted, so `--resume` can continue it:
- JSONL: lines appended and flushed chunk by chunk; a last line cut short is dropped on resume.
- Parquet: parts written to OUT.parts/ (each to a temporary name, then renamed: a part is whole or
  absent), joined into OUT at the end; a resumed run takes the parts (or OUT itself) as they are.
- .npy: its header rewritten after each chunk (the file holds the rows written so far), but no ids
  to check a resume against: --resume is refused for it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
import orjson

from orchestrator.embed.corpus import InputError, Row

PART_ROWS = 8192  # a Parquet part: what an interruption loses at most
NPY_HEADER_BYTES = 128  # room for any (rows, dim) shape, rewritten in place


class Sink(Protocol):
    def existing(self) -> Iterator[tuple[int, Any]]:
        """(input row, id) of each row already in OUT (a resumed run), read as they are met."""
        ...

    def write(self, rows: list[Row], vectors: np.ndarray) -> None: ...

    def flush(self) -> None:
        """What was written is in OUT's readable prefix (an interrupted run's last step)."""
        ...

    def close(self) -> None:
        """The run is complete: OUT in its final form."""
        ...


def open_sink(path: Path, resume: bool) -> Sink:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return JsonlSink(path, resume)
    if suffix == ".parquet":
        return ParquetSink(path, resume)
    if suffix == ".npy":
        if resume:
            raise InputError(f"{path}: --resume is refused for .npy (no row ids to check): use .jsonl or .parquet")
        return NpySink(path)
    raise InputError(f"{path}: an output ends in .jsonl, .parquet or .npy")


def _refuse_existing(path: Path, resume: bool) -> None:
    """An output with rows is not overwritten by accident (an empty one: a run that failed at once)."""
    if not resume and path.exists() and path.stat().st_size > 0:
        raise InputError(f"{path} exists: --resume continues it, or remove it")


class JsonlSink:
    def __init__(self, path: Path, resume: bool) -> None:
        _refuse_existing(path, resume)
        self.path = path
        if path.exists():
            _cut_to_whole_lines(path)
        self.file: BinaryIO = path.open("ab")

    def existing(self) -> Iterator[tuple[int, Any]]:
        with self.path.open("rb") as file:
            for number, line in enumerate(file, 1):
                try:
                    record = orjson.loads(line)
                    yield int(record["row"]), record.get("id")
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    raise InputError(f"{self.path}: line {number} is no row of warmpool embed's output") from None

    def write(self, rows: list[Row], vectors: np.ndarray) -> None:
        lines = b"".join(
            orjson.dumps(_record(row, vector), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
            for row, vector in zip(rows, vectors, strict=True)
        )
        self.file.write(lines)
        self.file.flush()

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _record(row: Row, vector: np.ndarray) -> dict[str, Any]:
    record: dict[str, Any] = {"row": row.index}
    if row.id is not None:
        record["id"] = row.id
    record["embedding"] = vector
    return record


def _cut_to_whole_lines(path: Path) -> None:
    """An interrupted JSONL output: a last line cut short (killed mid-write) is cut off the file."""
    whole = 0
    with path.open("rb") as file:
        for line in file:
            if not line.endswith(b"\n"):
                break
            whole += len(line)
    os.truncate(path, whole)


class ParquetSink:
    def __init__(self, path: Path, resume: bool) -> None:
        _refuse_existing(path, resume)
        self.path = path
        self.parts = path.with_name(path.name + ".parts")
        if not resume and any(self.parts.glob("part-*.parquet")):
            raise InputError(f"{self.parts} holds an interrupted run: --resume continues it, or remove it")
        self.parts.mkdir(exist_ok=True)
        if path.exists():  # a complete output, continued: it becomes the first part
            os.replace(path, self.parts / _part_name(0))
        self.count = len(self._part_files())
        self.buffer: list[tuple[Row, np.ndarray]] = []

    def _part_files(self) -> list[Path]:
        return sorted(self.parts.glob("part-*.parquet"))

    def existing(self) -> Iterator[tuple[int, Any]]:
        import pyarrow.parquet as pq

        for part in self._part_files():
            table = pq.read_table(part, columns=[c for c in ("row", "id") if c in pq.read_schema(part).names])
            ids = table.column("id").to_pylist() if "id" in table.column_names else [None] * table.num_rows
            yield from zip(table.column("row").to_pylist(), ids, strict=True)

    def write(self, rows: list[Row], vectors: np.ndarray) -> None:
        self.buffer += zip(rows, vectors, strict=True)
        if len(self.buffer) >= PART_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [row for row, _ in self.buffer]
        vectors = np.stack([vector for _, vector in self.buffer]).astype(np.float32, copy=False)
        columns = {"row": pa.array([row.index for row in rows], pa.int64())}
        if any(row.id is not None for row in rows):
            columns["id"] = pa.array([row.id for row in rows])
        columns["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])
        temporary = self.parts / f".{_part_name(self.count)}.tmp"
        pq.write_table(pa.table(columns), temporary)
        os.replace(temporary, self.parts / _part_name(self.count))
        self.count += 1
        self.buffer = []

    def close(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.flush()
        parts = self._part_files()
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        if parts:
            # parts differ where only some chunks had ids (a column missing, or all null): one schema for all
            schema = pa.unify_schemas([pq.read_schema(part) for part in parts], promote_options="permissive")
            with pq.ParquetWriter(temporary, schema) as writer:
                for part in parts:  # part by part: the corpus is never in memory at once
                    writer.write_table(_conformed(pq.read_table(part), schema))
        else:  # an empty shard: an empty table
            pq.write_table(pa.table({"row": pa.array([], pa.int64())}), temporary)
        os.replace(temporary, self.path)
        shutil.rmtree(self.parts)


def _conformed(table: Any, schema: Any) -> Any:
    import pyarrow as pa

    for name in schema.names:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
    return table.select(schema.names).cast(schema)


def _part_name(number: int) -> str:
    return f"part-{number:06d}.parquet"


class NpySink:
    """A float32 (rows, dim) array; the header, padded to a fixed size, rewritten after each chunk."""

    def __init__(self, path: Path) -> None:
        _refuse_existing(path, False)
        self.file: BinaryIO = path.open("wb")
        self.rows = 0
        self.dim: int | None = None

    def existing(self) -> Iterator[tuple[int, Any]]:
        return iter(())

    def write(self, rows: list[Row], vectors: np.ndarray) -> None:
        if self.dim is None:
            self.dim = int(vectors.shape[1])
            self.file.write(b"\0" * NPY_HEADER_BYTES)
        self.file.write(np.ascontiguousarray(vectors, dtype="<f4").tobytes())
        self.rows += len(rows)
        self.flush()

    def flush(self) -> None:
        if self.dim is None:
            return
        self.file.seek(0)
        self.file.write(npy_header(self.rows, self.dim))
        self.file.seek(0, os.SEEK_END)
        self.file.flush()

    def close(self) -> None:
        if self.dim is None:  # no rows: an empty array
            self.file.truncate(0)
            np.save(self.file, np.zeros((0, 0), np.float32))
        self.flush()
        self.file.close()


def npy_header(rows: int, dim: int) -> bytes:
    """A version 1.0 .npy header of exactly NPY_HEADER_BYTES (its dict padded with spaces, as numpy pads)."""
    text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}"
    room = NPY_HEADER_BYTES - 10  # magic, version, length
    encoded = text.ljust(room - 1).encode("latin1") + b"\n"
    return b"\x93NUMPY\x01\x00" + len(encoded).to_bytes(2, "little") + encoded
