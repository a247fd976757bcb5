"""The order the prefetch reads a model's weights in (orchestrator/readorder.py, orchestrator.prefetch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from orchestrator import prefetch
from orchestrator.readorder import converted_bytes, natural_key, tensors, weight_extents

VOCAB = 50


def checkpoint(path: Path, dtype: torch.dtype = torch.float32) -> Path:
    """A safetensors file with a vocabulary table, layers 0-11 and a head, as the file sorts them."""
    weights = {"embeddings.word_embeddings.weight": torch.zeros(VOCAB, 8, dtype=dtype)}
    weights |= {f"encoder.layer.{i}.dense.weight": torch.full((8, 8), i, dtype=dtype) for i in range(12)}
    weights["pooler.dense.weight"] = torch.zeros(8, 8, dtype=dtype)
    save_file(weights, str(path))
    return path


def in_order(weights: list[Path], vocab: int | None, views: str | None) -> list[tuple[Path, int, int]]:
    """weight_extents' stretches, those read now then those read last."""
    now, last = weight_extents(weights, vocab, views)
    return now + last


def names_in_order(path: Path, extents: list[tuple[Path, int, int]]) -> list[str]:
    """The tensors of `path` in the order `extents` reads their first bytes."""
    _, found = tensors(path)

    def position(byte: int) -> int:  # how many bytes are read before it
        before = 0
        for _, start, length in extents:
            if start <= byte < start + length:
                return before + byte - start
            before += length
        raise AssertionError(f"byte {byte} of {path} is never read")

    return [name for name, *_ in sorted(found, key=lambda t: position(t[3]))]


def test_names_compare_their_numbers_as_numbers() -> None:
    """Layer 2 sorts before layer 10, as the model's modules run, where text sorts it after."""
    names = ["encoder.layer.10.w", "encoder.layer.2.w", "embeddings.w", "encoder.layer.1.w"]
    assert sorted(names, key=natural_key) == [
        "embeddings.w",
        "encoder.layer.1.w",
        "encoder.layer.2.w",
        "encoder.layer.10.w",
    ]


def test_layers_are_read_in_the_order_the_model_runs_them(tmp_path: Path) -> None:
    """Without tables to set aside, every byte is read once: the header, then the tensors in module
    order (layer 2 before layer 10)."""
    path = checkpoint(tmp_path / "model.safetensors")
    extents, last = weight_extents([path], None, None)
    assert last == []
    assert sum(length for _, _, length in extents) == path.stat().st_size
    assert extents[0][1] == 0
    order = names_in_order(path, extents)
    assert order.index("encoder.layer.2.dense.weight") < order.index("encoder.layer.10.dense.weight")
    assert order[0] == "embeddings.word_embeddings.weight" and order[-1] == "pooler.dense.weight"


def test_a_table_that_stays_on_the_file_is_read_last(tmp_path: Path) -> None:
    """A vocabulary-sized table in the compute dtype (a view a CPU engine reads a few rows of at
    start) comes after every other tensor."""
    path = checkpoint(tmp_path / "model.safetensors")
    order = names_in_order(path, in_order([path], VOCAB, "F32"))
    assert order[-1] == "embeddings.word_embeddings.weight"
    assert order[0] == "encoder.layer.0.dense.weight"


def test_a_table_converted_at_load_is_read_in_place(tmp_path: Path) -> None:
    """A bfloat16 table served in float32 is converted whole at load, so it is read where the
    model's modules reach it: first."""
    path = checkpoint(tmp_path / "model.safetensors", torch.bfloat16)
    order = names_in_order(path, in_order([path], VOCAB, "F32"))
    assert order[0] == "embeddings.word_embeddings.weight"


def test_a_checkpoint_that_cannot_be_parsed_is_read_whole(tmp_path: Path) -> None:
    """The prefetch reads a weights file it cannot parse from its first byte to its last (the
    loader will say what is wrong with it)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "model.safetensors").write_bytes(b"\xff" * 4096)
    extents = prefetch._model(folder, "F32")
    assert (folder / "model.safetensors", 0, 4096) in extents


@pytest.mark.parametrize(("name", "deferred"), [("mpnet", True), ("distilbert", False)])
def test_only_a_native_models_tables_are_set_aside(tiny, name: str, deferred: bool) -> None:  # type: ignore[no-untyped-def]
    """A native model's word-embedding table is read last on the CPU; a model transformers loads
    reads every tensor whole at load, so its table is read in module order."""
    folder = tiny[name]
    extents = prefetch._model(folder, "F32")
    path = folder / "model.safetensors"
    order = names_in_order(path, [e for e in extents if e[0] == path])
    assert (order[-1].endswith("word_embeddings.weight")) is deferred


def test_a_converted_checkpoint_reserves_its_copy_in_the_compute_dtype(tmp_path: Path) -> None:
    """A bfloat16 checkpoint computed in float32 is built into twice its tensors' bytes; one already
    in the compute dtype, or loaded onto a GPU, into nothing beside the page cache."""
    half = checkpoint(tmp_path / "half.safetensors", torch.bfloat16)
    full = checkpoint(tmp_path / "full.safetensors")
    tensor_bytes = sum(end - begin for *_, begin, end in tensors(half)[1])
    assert converted_bytes([half], "F32") == 2 * tensor_bytes
    assert converted_bytes([full], "F32") == converted_bytes([half], "BF16") == converted_bytes([half], None) == 0


def test_the_tables_wait_for_the_modules_weights_too(tiny) -> None:  # type: ignore[no-untyped-def]
    """A model with a Dense module: its weights (which the build needs) are read before the model's
    word-embedding table (which it does not)."""
    folder = tiny["mpnet"]  # mean pooling, then a Dense module with its own model.safetensors
    extents = prefetch._model(folder, "F32")
    files = [path.relative_to(folder).as_posix() for path, _, _ in extents]
    dense = max(i for i, name in enumerate(files) if name != "model.safetensors" and name.endswith(".safetensors"))
    table = next(i for i, e in enumerate(extents) if e[0].name == "model.safetensors" and e[1] > 0 and i > dense)
    assert dense < table == len(extents) - 1
