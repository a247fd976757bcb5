"""Prefetch reads exactly the files serving reads, in order, and never leaves the volume."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.prefetch import model_files


def folder_with(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "model"
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    return folder


def test_weights_come_last_and_extras_are_left_out(tmp_path: Path) -> None:
    """Config files, then the tokenizer, then model.safetensors; no ONNX export, second copy of the
    weights or README."""
    folder = folder_with(
        tmp_path,
        "model.safetensors",
        "pytorch_model.bin",
        "onnx/model.onnx",
        "README.md",
        "tokenizer.json",
        "config.json",
    )
    assert [p.name for p in model_files(folder)] == ["config.json", "tokenizer.json", "model.safetensors"]


def test_a_sharded_checkpoint_reads_its_index_then_its_shards(tmp_path: Path) -> None:
    """model.safetensors.index.json names the shards: the index, then each shard once."""
    folder = folder_with(tmp_path, "config.json", "a.safetensors", "b.safetensors", "stale.safetensors")
    weight_map = {"x": "b.safetensors", "y": "a.safetensors", "z": "b.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    names = [p.name for p in model_files(folder)]
    assert names == ["config.json", "model.safetensors.index.json", "a.safetensors", "b.safetensors"]


def test_pytorch_bin_is_read_only_without_safetensors(tmp_path: Path) -> None:
    """pytorch_model.bin is the weights only where no safetensors file exists."""
    folder = folder_with(tmp_path, "config.json", "pytorch_model.bin")
    assert [p.name for p in model_files(folder)] == ["config.json", "pytorch_model.bin"]


def test_module_configs_named_by_modules_json_are_read(tmp_path: Path) -> None:
    """The sentence-transformers modules' own config files are read, after modules.json."""
    folder = folder_with(tmp_path, "config.json", "1_Pooling/config.json", "2_Dense/config.json")
    modules = [{"path": ""}, {"path": "1_Pooling"}, {"path": "2_Dense"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    files = [p.relative_to(folder).as_posix() for p in model_files(folder)]
    assert files == ["config.json", "modules.json", "1_Pooling/config.json", "2_Dense/config.json"]


def test_a_symlink_out_of_the_volume_is_not_followed(tmp_path: Path) -> None:
    """A weight file that links outside the model folder is left alone."""
    folder = folder_with(tmp_path, "config.json")
    (tmp_path / "elsewhere.safetensors").write_text("secret")
    (folder / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    assert [p.name for p in model_files(folder)] == ["config.json"]


def test_a_hub_snapshot_follows_its_links_into_the_repos_blobs(tmp_path: Path) -> None:
    """In a Hugging Face cache a snapshot's files link into the repo's blobs/: those are read."""
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "c0ffee").write_text("{}")
    (repo / "blobs" / "beef").write_text("weights")
    snapshot = repo / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(repo / "blobs" / "c0ffee")
    (snapshot / "model.safetensors").symlink_to(repo / "blobs" / "beef")
    assert [p.name for p in model_files(snapshot)] == ["config.json", "model.safetensors"]
