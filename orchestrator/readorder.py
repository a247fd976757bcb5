"""The order in which a start reads a model's bytes, so that the prefetch reads what the loader needs
before anything it does not, in the order it needs it (orchestrator.prefetch).

On a volume that delivers N MB/s, a start is ready no sooner than the bytes it needs take to arrive,
and a prefetch that spends the volume on bytes the loader never reads makes it later. Measured on a
BERT-large-shaped checkpoint behind a 200 MB/s FUSE volume: reading the whole 1.34 GB in file order
made ready 0.2 s later and the first embedding 0.5 s later than no prefetch at all, which reads only
what is touched. What a native CPU engine never reads at start: the rows of a vocabulary-sized table
(word embeddings, an LM head) beyond the few tokens warm-up uses, because such a table stays a view
on the mapped file when the checkpoint's dtype is the compute dtype (engine/layers/checkpoint.py). Those
tables are read last, after everything the start needs: still worth having in the page cache before
requests bring new tokens, never ahead of a byte the start waits for.

The rest is read tensor by tensor in the order the model's modules use them: names compared with
their numbers as numbers (layer 2 before layer 10), where the file sorts them as text.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from orchestrator.envfiles import Extent

# WARMPOOL_DTYPE -> the safetensors dtype a CPU engine computes in (int8: float32 around int8 projections)
CPU_COMPUTE = {"auto": "F32", "float32": "F32", "int8": "F32", "bfloat16": "BF16", "float16": "F16"}
HEADER_LIMIT = 100 << 20  # safetensors' own bound on a header
ITEM_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2}


def natural_key(name: str) -> list[tuple[int, int | str]]:
    """Sort key that compares the runs of digits in a tensor name as numbers."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part]


def tensors(path: Path) -> tuple[int, list[tuple[str, str, list[int], int, int]]]:
    """A safetensors file's header length (its 8-byte size included) and its tensors: (name, dtype,
    shape, first byte, byte after the last) as absolute file offsets. Raises ValueError or OSError."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > HEADER_LIMIT:
            raise ValueError(f"{path.name}: header of {length} bytes")
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    start = 8 + length
    found = [
        (
            name,
            str(entry["dtype"]),
            list(entry["shape"]),
            start + entry["data_offsets"][0],
            start + entry["data_offsets"][1],
        )
        for name, entry in header.items()
    ]
    return start, found


def weight_extents(weights: list[Path], vocab_size: int | None, views: str | None) -> tuple[list[Extent], list[Extent]]:
    """One checkpoint's bytes (its safetensors files) in reading order, as (now, last): each header,
    then every tensor in module order; and apart, to read after everything else the start needs (a
    module's checkpoint included), the vocabulary-sized tables that stay views in the dtype `views`
    (None: every tensor is read whole at start, as on a GPU or a model loaded through transformers).
    Neighbouring stretches of one file are merged, so reads stay large."""
    headers: list[Extent] = []
    now: list[tuple[list[tuple[int, int | str]], Extent]] = []
    last: list[tuple[list[tuple[int, int | str]], Extent]] = []
    for path in weights:
        start, found = tensors(path)
        headers.append((path, 0, start))
        for name, dtype, shape, begin, end in found:
            table = views is not None and dtype == views and len(shape) == 2 and shape[0] == vocab_size
            (last if table else now).append((natural_key(name), (path, begin, end - begin)))
    ordered = headers + [extent for _, extent in sorted(now, key=lambda item: item[0])]
    return merged(ordered), merged([extent for _, extent in sorted(last, key=lambda item: item[0])])


def converted_bytes(weights: list[Path], compute: str | None) -> int:
    """The memory a CPU engine's build allocates for the checkpoint's floating-point tensors that are
    not in its compute dtype (a bfloat16 checkpoint served in float32: twice the file), beside the
    page cache; 0 on a GPU (`compute` None), whose copies are in the GPU's memory. Fused projections
    and int8 copies are left out: at most a quarter of the weights, and the guard keeps 10% spare."""
    if compute not in ITEM_BYTES:
        return 0
    total = 0
    for path in weights:
        for _, dtype, shape, _, _ in tensors(path)[1]:
            if dtype in ITEM_BYTES and dtype != compute:
                total += ITEM_BYTES[compute] * _count(shape)
    return total


def _count(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def merged(extents: list[Extent]) -> list[Extent]:
    """Each stretch that starts where the one before it ends, in the same file, joined to it."""
    out: list[Extent] = []
    for path, offset, length in extents:
        if out and out[-1][0] == path and out[-1][1] + out[-1][2] == offset:
            out[-1] = (path, out[-1][1], out[-1][2] + length)
        elif length:
            out.append((path, offset, length))
    return out
