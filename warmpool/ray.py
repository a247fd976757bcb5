"""Ray Data's adapter: warmpool's engine in each actor of `Dataset.map_batches`.

    import ray
    from warmpool.ray import Embedder

    ds = ray.data.read_parquet("corpus/")
    ds = ds.map_batches(Embedder, fn_constructor_kwargs={"model_dir": "models/all-MiniLM-L6-v2"},
                        concurrency=4, num_cpus=2, batch_size=256)

Each actor loads the folder once (warmpool.inprocess.InProcessEmbedder) and answers each batch with
the batch and one more column, its texts' vectors in order. Batches come as Ray hands them (a dict of
numpy arrays, a pandas DataFrame or a pyarrow Table, by `batch_format`) and leave in the same form.
Ray itself is not imported here: the class is all map_batches needs (`pip install warmpool[ray]`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from warmpool.inprocess import BATCH_TOKENS, CompileMode, InProcessEmbedder, Precision


class Embedder:
    """A callable class for `map_batches`: the batch plus `output_column`, one float32 vector per row
    of `column`, computed as /v1/embeddings computes it (InProcessEmbedder says what each option does)."""

    def __init__(
        self,
        model_dir: str | Path,
        precision: Precision = "float32",
        compile: CompileMode = "auto",
        batch_tokens: int = BATCH_TOKENS,
        column: str = "text",
        output_column: str = "embedding",
        prompt_name: str | None = None,
        **options: Any,
    ) -> None:
        self.column = column
        self.output_column = output_column
        self.embedder = InProcessEmbedder(
            model_dir, precision, compile, batch_tokens=batch_tokens, prompt_name=prompt_name, **options
        )

    def __call__(self, batch: Any) -> Any:
        pandas, pyarrow = sys.modules.get("pandas"), sys.modules.get("pyarrow")
        if pandas is not None and isinstance(batch, pandas.DataFrame):
            self._check_columns(list(batch.columns))
            out = batch.copy(deep=False)
            out[self.output_column] = list(self.embedder.embed(batch[self.column].tolist()))
            return out
        if pyarrow is not None and isinstance(batch, pyarrow.Table):
            self._check_columns(batch.column_names)
            vectors = self.embedder.embed(batch.column(self.column).to_pylist())
            flat = pyarrow.array(vectors.reshape(-1), type=pyarrow.float32())
            return batch.append_column(
                self.output_column, pyarrow.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
            )
        if isinstance(batch, Mapping):
            self._check_columns(list(batch))
            return {**batch, self.output_column: self.embedder.embed(np.asarray(batch[self.column]).tolist())}
        raise TypeError(
            f"a batch of type {type(batch).__name__}: map_batches hands a dict of arrays, a pandas DataFrame or a "
            "pyarrow Table (batch_format 'default', 'numpy', 'pandas' or 'pyarrow')"
        )

    def _check_columns(self, columns: list[str]) -> None:
        if self.column not in columns:
            raise ValueError(
                f"the batch has no column {self.column!r} (its columns: {columns}): "
                "name the texts' column with Embedder(column=...)"
            )
        if self.output_column in columns:
            raise ValueError(
                f"the batch already has a column {self.output_column!r}: name another with Embedder(output_column=...)"
            )
