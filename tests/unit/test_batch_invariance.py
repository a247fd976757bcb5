"""An input's answer does not depend on what it is batched with: the same bits alone and inside random
packed groups made by the engine's own batching (engine/runtime/batching.py), at every CPU precision.
The mechanism this holds to (float32 products of few rows: engine/precision/rows.py) shows on 2 torch
threads for inputs of fewer than 12 tokens, so the probes are short ones and one of ~20 tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.heads import answer
from engine.precision import gemm
from engine.runtime.batching import split_packed
from engine.runtime.device import cpu_has, cpu_has_int8, place
from engine.runtime.model import PoolingModel

PROBES = (3, 5, 11)  # tokens; each alone is a product of that many rows
COMPOSITIONS = 6  # per probe: 1..30 other inputs of 1..200 tokens, the probe at a random place


ONEDNN = "-onednn"  # the layers' products on oneDNN's packed weights (engine/precision/gemm.py)


def engine(model_dir: Path, precision: str, records: Path, monkeypatch: pytest.MonkeyPatch) -> PoolingModel:
    dtype = precision.removesuffix(ONEDNN)
    if (dtype == "bfloat16" and not cpu_has(torch.bfloat16)) or (dtype == "int8" and not cpu_has_int8()):
        pytest.skip(f"this CPU has no {dtype} instructions: the engine refuses {dtype} here")
    if precision.endswith(ONEDNN):  # chosen whatever this CPU prefers
        monkeypatch.setattr(gemm, "measure", lambda k, n, dtype=None: "onednn")
    placement = place("cpu", dtype, [])
    chosen = records if precision.endswith(ONEDNN) else None
    return PoolingModel(read_model_folder(model_dir), threads=2, placement=placement, gemm_records=chosen)


def text(rng: random.Random, n: int) -> Tokens:
    """n tokens: [CLS], n - 2 word pieces, [SEP] (one token: [CLS] alone)."""
    return Tokens([101, *(rng.randrange(1000, 30000) for _ in range(max(n - 2, 0))), 102][:n])


@pytest.mark.parametrize("precision", ["float32", "float32" + ONEDNN, "bfloat16", "bfloat16" + ONEDNN, "int8"])
def test_an_input_has_the_same_bits_alone_and_in_any_packed_group(
    model_dir: Path, precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each probe's vector, alone, is bitwise the one it gets in every group the engine's batching cuts
    from a batch of 1..30 random inputs around it (groups within the engine's token budget)."""
    model = engine(model_dir, precision, tmp_path, monkeypatch)
    rng = random.Random(7)
    for length in PROBES:
        probe = text(rng, length)
        alone = answer(model, [probe])[0].tobytes()
        differ = 0
        for _ in range(COMPOSITIONS):
            batch = [(i, text(rng, rng.randint(1, 200))) for i in range(rng.randint(1, 30))]
            batch.insert(rng.randint(0, len(batch)), (-1, probe))
            group = next(g for g in split_packed(batch) if any(key == -1 for key, _ in g))
            rows = answer(model, [tokens for _, tokens in group])
            at = next(i for i, (key, _) in enumerate(group) if key == -1)
            differ += rows[at].tobytes() != alone
        assert differ == 0, f"{precision}: a {length}-token input got other bits in {differ}/{COMPOSITIONS} groups"
