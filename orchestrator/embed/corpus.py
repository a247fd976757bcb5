"""The input corpus: JSONL, CSV or Parquet, read as a stream of rows (index, id, text), one shard's rows."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
PARQUET_BATCH_ROWS = 4096


class InputError(ValueError):
    """A usage or input error: exit code 2."""


@dataclass(frozen=True)
class Row:
    index: int  # the row's place in the whole input (before sharding)
    id: Any  # the id field's value, None without one
    text: str


@dataclass(frozen=True)
class Shard:
    """Rows whose index % count == index: interleaved, so each of N shards gets an even share
    however the input is ordered, and no shard needs the row count up front."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise InputError(f"--shard takes i/N (e.g. 0/4), not {text!r}") from None
        if count < 1 or not 0 <= index < count:
            raise InputError(f"--shard {text}: i must be in 0..N-1 and N at least 1")
        return cls(index, count)

    def takes(self, row: int) -> bool:
        return row % self.count == self.index

    def size(self, total: int) -> int:
        """How many of `total` rows this shard takes."""
        return max(0, (total - self.index + self.count - 1) // self.count)


@dataclass(frozen=True)
class Corpus:
    path: Path
    field: str = "text"
    id_field: str = "id"
    id_required: bool = False  # --id-field named: a row without it is an input error

    @property
    def format(self) -> str:
        fmt = FORMATS.get(self.path.suffix.lower())
        if fmt is None:
            raise InputError(f"{self.path}: an input ends in {', '.join(FORMATS)}")
        return fmt

    def check(self) -> None:
        """The file is there and, where the format says so up front, holds the text field."""
        fmt = self.format
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such file")
        names = self._columns() if fmt != "jsonl" else None
        if names is not None and self.field not in names:
            raise InputError(f"{self.path}: no column {self.field!r} (--field names another; it has {names})")
        if names is not None and self.id_required and self.id_field not in names:
            raise InputError(f"{self.path}: no column {self.id_field!r} (--id-field)")

    def count(self) -> int:
        """Rows in the whole input (a pass without parsing where the format allows)."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(self.path).metadata.num_rows)
        if self.format == "jsonl":  # lines not blank, unparsed: what rows() will find, or an error there
            with self.path.open("rb") as file:
                return sum(1 for line in file if line.strip())
        return sum(1 for _ in self._records())

    def rows(self, shard: Shard = Shard()) -> Iterator[Row]:
        for index, record in enumerate(self._records()):
            if shard.takes(index):
                yield self._row(index, record)

    def _row(self, index: int, record: dict[str, Any]) -> Row:
        text = record.get(self.field)
        if not isinstance(text, str):
            what = "no" if text is None else f"a {type(text).__name__} as its"
            raise InputError(f"{self.path}: row {index} has {what} {self.field!r} field (a string is needed)")
        if self.id_required and record.get(self.id_field) is None:
            raise InputError(f"{self.path}: row {index} has no {self.id_field!r} field")
        return Row(index, record.get(self.id_field), text)

    def _records(self) -> Iterator[dict[str, Any]]:
        fmt = self.format
        if fmt == "jsonl":
            yield from self._jsonl()
        elif fmt == "csv":
            with self.path.open(newline="", encoding="utf-8") as file:
                yield from csv.DictReader(file)
        else:
            yield from self._parquet()

    def _jsonl(self) -> Iterator[dict[str, Any]]:
        with self.path.open("rb") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue  # blank lines are no rows
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise InputError(f"{self.path}:{number}: not JSON ({exc})") from None
                if not isinstance(record, dict):
                    raise InputError(f"{self.path}:{number}: a JSON object a line is needed")
                yield record

    def _parquet(self) -> Iterator[dict[str, Any]]:
        import pyarrow.parquet as pq

        file = pq.ParquetFile(self.path)
        columns = [c for c in (self.field, self.id_field) if c in file.schema_arrow.names]
        for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
            yield from batch.to_pylist()

    def _columns(self) -> list[str]:
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return list(pq.ParquetFile(self.path).schema_arrow.names)
        with self.path.open(newline="", encoding="utf-8") as file:
            return list(next(csv.reader(file), []))
