"""A model folder copied cheaply, or its checkpoint saved again another way: in another dtype, in shards
with an index (as transformers' save_pretrained does for big models), or as a pickle only; a head
pickle that runs code."""

from __future__ import annotations

import builtins
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def linked_copy(src: Path, dest: Path) -> Path:
    """A copy of folder `src` whose weights (*.safetensors) are hard links where the file system allows
    (the default model's 90 MB not written again for each copy), its other files copied with their
    times. A test may rewrite those; it must unlink a weight file before writing it (a write in place
    would change `src`'s)."""

    def copy(source: str, target: str) -> None:
        if source.endswith(".safetensors"):
            try:
                return os.link(source, target)
            except OSError:  # another file system
                pass
        shutil.copy2(source, target)

    return Path(shutil.copytree(src, dest, copy_function=copy))


def resave(src: Path, dest: Path, dtype: torch.dtype | None = None, shards: int = 1) -> Path:
    """A copy of `src` whose model.safetensors is in `dtype` (floating tensors only) and, with
    shards > 1, split into that many files named by model.safetensors.index.json."""
    shutil.copytree(src, dest)
    state = load_file(dest / "model.safetensors")
    (dest / "model.safetensors").unlink()
    if dtype is not None:
        state = {k: t.to(dtype) if t.is_floating_point() else t for k, t in state.items()}
    if shards == 1:
        save_file(state, dest / "model.safetensors", metadata={"format": "pt"})
        return dest
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k].contiguous() for k in names[i::shards]}
        save_file(part, dest / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index))
    return dest


def pickle_only(src: Path, dest: Path) -> Path:
    """A copy of `src` whose weights are pytorch_model.bin alone (torch.save's zip pickle)."""
    shutil.copytree(src, dest)
    torch.save(load_file(dest / "model.safetensors"), dest / "pytorch_model.bin")
    (dest / "model.safetensors").unlink()
    return dest


class _RunsCode:
    """Unpickled by plain pickle, it calls exec on its code: what a hostile checkpoint can do."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return builtins.exec, (self.code,)


def code_running_head(src: Path, dest: Path, name: str, marker: Path) -> Path:
    """A copy of bge-m3 folder `src` whose head `name` (sparse_linear.pt, colbert_linear.pt) keeps
    its tensors but also holds an object that, unpickled normally, creates `marker`."""
    shutil.copytree(src, dest)
    state = torch.load(dest / name, weights_only=True)
    torch.save({**state, "note": _RunsCode(f"open({str(marker)!r}, 'w').close()")}, dest / name)
    return dest


def random_bert(dest: Path, tokenizer_from: Path, shape: dict[str, int], dtype: torch.dtype, shard_mb: int = 0) -> Path:
    """A plain Hugging Face folder (served, as sentence-transformers wraps it, with mean pooling) of a
    random BertModel of `shape` with the embedded model's tokenizer, its weights in `dtype`, in one
    file or in shards of `shard_mb` MB. Built in a temporary folder: never committed."""
    from transformers import BertConfig, BertModel

    from tests.tiny_models import TOKENIZER_FILES

    torch.manual_seed(0)
    model = BertModel(BertConfig(**shape)).eval().to(dtype)
    model.save_pretrained(dest, **({"max_shard_size": f"{shard_mb}MB"} if shard_mb else {}))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, dest / name)
    return dest
