"""A checkpoint's tensors as views on its memory-mapped safetensors files: nothing copied, nothing read.

Each file is mapped read-only and shared (MAP_SHARED, PROT_READ) and every tensor is built with
torch.frombuffer at its offset from the header, so a parameter is the page cache's own pages: every
engine mapping the file shares them, a re-forked engine maps them again without reading, and they
cannot be written (inference never writes a weight; a write would fault rather than copy). One file
(`model.safetensors`) or the shards `model.safetensors.index.json` names, read the same way.
Parsed here rather than through safetensors' loader: whether its CPU tensors are views depends on
its version (>=0.4 is allowed; 0.8 maps the file private and writable, so a stray write silently
copies a page), and knowing which bytes each tensor occupies lets release_unused_pages drop the
pages a model no longer needs.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from common.folderjson import ModelError
from common.modelfiles import pickled_weights
from common.modelfolder import ModelFolder

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
# This process's mapped checkpoint files and their folders (weak: a mapping lives as long as a tensor on it)
_MAPPINGS: weakref.WeakKeyDictionary[mmap.mmap, Path] = weakref.WeakKeyDictionary()
# Each model built from a checkpoint -> how its keys were renamed to the model's parameter names
_RENAMES: weakref.WeakKeyDictionary[nn.Module, Callable[[str], str]] = weakref.WeakKeyDictionary()


def renamed_as(model: nn.Module, rename: Callable[[str], str]) -> None:
    """Remember how `model`'s checkpoint keys became its names (a PEFT adapter names modules as the checkpoint does)."""
    _RENAMES[model] = rename


def renamed_around(wrapper: nn.Module, inner: str, own: Callable[[str], str | None]) -> None:
    """`wrapper` runs a checkpoint's model as its module `inner`, with modules of its own after it (a head
    the same checkpoint holds, named by `own`; None for a key not of them): every other key is named as
    the inner model names it, under `inner.` (a PEFT adapter trained on the checkpoint's model then finds
    its modules in the wrapper)."""
    model = wrapper.get_submodule(inner)  # the rename holds the inner model, never the wrapper (a weak key)

    def rename(key: str) -> str:
        mine = own(key)
        return mine if mine is not None else f"{inner}.{model_name(model, key)}"

    renamed_as(wrapper, rename)


def model_name(model: nn.Module, key: str) -> str:
    """A checkpoint's key (a task model's `bert.encoder…`, `classifier.weight`) as `model` names it."""
    rename = _RENAMES.get(model)
    return rename(key) if rename is not None else key


def refuse_pickles(info: ModelFolder, allowed: bool) -> None:
    """ModelError naming the pytorch_model.bin files serving would unpickle, unless `allowed`
    (WARMPOOL_ALLOW_BIN_WEIGHTS): unpickling runs whatever the file says, and weights_only, which
    every torch.load here and in transformers passes, narrows that rather than closing it."""
    pickles = pickled_weights(info)
    if pickles and not allowed:
        names = ", ".join(str(p.relative_to(info.path)) for p in pickles)
        raise ModelError(
            f"{info.path} holds weights only as pickles ({names}), which are not loaded by default: convert them "
            "to safetensors, or set WARMPOOL_ALLOW_BIN_WEIGHTS=on to read them with torch.load(weights_only=True)"
        )


def read_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors checkpoint, by name: one file, or the shards its
    index names. ModelError when there is neither, or a file is truncated or malformed."""
    single = folder / "model.safetensors"
    if single.is_file():
        return read_safetensors(single)
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise ModelError(f"cannot load model from {folder}: no model.safetensors or model.safetensors.index.json")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted({str(name) for name in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"cannot read {index}: {type(exc).__name__}: {exc}") from exc
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(read_safetensors(folder / shard))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise ModelError(f"cannot load model from {folder}: tensors the index names are in no shard: {missing[:5]}")
    return tensors


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """One safetensors file's tensors, each a view on the file mapped read-only and shared."""
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 8:
                raise ValueError(f"{size} bytes, shorter than a header")
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > min(MAX_HEADER, size - 8):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(handle.read(length))
            # mmap of an empty data section fails; a file of only a header has no tensors to view
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + length else None
            if mapped is not None:
                _MAPPINGS[mapped] = path.parent
        header.pop("__metadata__", None)
        return {name: _view(mapped, 8 + length, size, name, entry) for name, entry in header.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
        raise ModelError(f"cannot load model from {path}: {type(exc).__name__}: {exc}") from exc


def release_unused_pages(model: nn.Module, folder: Path) -> int:
    """Drop from this process's page tables the pages of `folder`'s mapped checkpoint that no
    parameter or buffer of `model` lies on (q/k/v read into a fused copy, tensors converted to
    another dtype, tensors the model has no place for); returns the bytes dropped. They stay in the
    page cache, but no longer count in this process's RSS and PSS: the forkserver would otherwise
    hold a private share of every page it read to build a copy. Harmless for a page still in use:
    it faults back in."""
    tensors = [*model.parameters(), *model.buffers()]  # oneDNN's packed weights own their memory: no file's
    storages = [t.untyped_storage() for t in tensors if not t.is_mkldnn]
    kept = sorted((s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages)
    released = 0
    for mapped in [m for m, where in list(_MAPPINGS.items()) if where == folder]:
        base, size = _address(mapped), len(mapped)
        in_use = [(begin - base, end - base) for begin, end in kept if base <= begin < base + size]
        start = 0  # the first byte after the last stretch in use
        for begin, end in [*in_use, (size, size)]:
            first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages between the stretches only
            last = begin // mmap.PAGESIZE * mmap.PAGESIZE
            if last > first:
                mapped.madvise(mmap.MADV_DONTNEED, first, last - first)
                released += last - first
            start = max(start, end)
    return released


def _address(mapped: mmap.mmap) -> int:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return int(torch.frombuffer(mapped, dtype=torch.uint8, count=1).data_ptr())


def _view(mapped: mmap.mmap | None, data_start: int, size: int, name: str, entry: dict[str, object]) -> torch.Tensor:
    dtype = DTYPES.get(str(entry["dtype"]))
    if dtype is None:
        raise ValueError(f"tensor {name}: dtype {entry['dtype']} is not supported")
    shape = [int(n) for n in entry["shape"]]  # type: ignore[attr-defined]
    begin, end = (int(n) for n in entry["data_offsets"])  # type: ignore[attr-defined]
    count = 1
    for n in shape:
        count *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not 0 <= begin <= end <= size - data_start or end - begin != count * itemsize:
        raise ValueError(f"tensor {name}: bytes {begin}-{end} do not hold {shape} {entry['dtype']} (truncated?)")
    if count == 0 or mapped is None:
        return torch.empty(shape, dtype=dtype)
    offset = data_start + begin
    with warnings.catch_warnings():
        # read-only on purpose: torch warns that it cannot enforce that, and nothing writes weights
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        tensor = torch.frombuffer(mapped, dtype=dtype, count=count, offset=offset).view(shape)
    # safetensors writers align every tensor to its element size; a file that does not is copied
    # rather than handed to kernels that may assume alignment
    return tensor if offset % itemsize == 0 else tensor.clone()
