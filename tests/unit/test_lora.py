"""PEFT LoRA adapters served natively (engine/layers/lora.py): each adapter's vectors are sentence-transformers
+ PEFT's on the same base, a group mixing the base and adapters gives each input its own model's rows, and
what the engine cannot compute exactly is refused at load with its name."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import json
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.wire import Msg, Tokens
from engine.layers.packed import Packed
from engine.process import _run_batch
from engine.runtime.batching import Pending
from engine.runtime.device import Placement
from engine.runtime.inbox import Inbox
from engine.runtime.model import PoolingModel
from engine.runtime.threads import ThreadShare
from server.core.outputs import normalize
from tests.lora_adapters import build_adapter, reference
from tests.tiny_models import TinyFolders
from tests.unit.pools import pool as pool_of

TEXTS = ["", "a", "Hello world, the warm pool model", "naïve café 日本語 🙂", "the warm pool engine " * 20]


def tokens(folder: Path, texts: list[str], adapter: str = "") -> list[Tokens]:
    info = read_model_folder(folder)
    encoded = pool_of(folder, info.pair_template).encode_batch(texts, truncate=info.max_model_len)
    return [t._replace(adapter=adapter) for t in encoded]


def vectors(model: PoolingModel, items: list[Tokens]) -> Any:
    return normalize(model.forward(items)) if model.info.normalize else model.forward(items)


@pytest.mark.parametrize(
    ("family", "options"),
    [
        ("bert", {}),
        ("bert", {"use_rslora": True, "r": 8, "lora_alpha": 4}),
        ("xlm-roberta", {"r": 2}),
        ("modernbert", {"target_modules": ["Wqkv", "Wo", "Wi"]}),  # fused in its checkpoint already
        # grouped queries: k and v narrower than q in the fused projection; gate and up fused too
        ("qwen3", {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}),
    ],
)
def test_an_adapters_vectors_match_peft_on_sentence_transformers(
    tiny: TinyFolders, tmp_path: Path, family: str, options: dict[str, Any]
) -> None:
    """alpha / r (or alpha / sqrt(r) with rsLoRA) on every projection the adapter targets, q, k and v
    in their slices of the fused projection: SentenceTransformer.encode's vectors with PEFT's adapter
    within 1e-5, and not the base's."""
    base = tiny[family]
    adapter = build_adapter(tmp_path / "adapter", base, seed=1, **options)
    model = PoolingModel(read_model_folder(base), threads=1, adapters=[("domain", adapter)])
    got = vectors(model, tokens(base, TEXTS, "domain"))
    expected = reference(base, adapter, TEXTS)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.abs(vectors(model, tokens(base, TEXTS)) - expected).max() > 1e-2  # the update matters


def test_a_group_mixing_the_base_and_two_adapters_gives_each_input_its_own_rows(
    tiny: TinyFolders, tmp_path: Path
) -> None:
    """One forward over inputs of the base and of two adapters, interleaved, equals each served alone."""
    base = tiny["bert"]
    first = build_adapter(tmp_path / "first", base, seed=1)
    second = build_adapter(tmp_path / "second", base, seed=2, r=2, target_modules=["query", "value"])
    model = PoolingModel(read_model_folder(base), threads=1, adapters=[("first", first), ("second", second)])
    names = ["", "first", "second", "first", "", "second"]
    mixed = [t._replace(adapter=name) for t, name in zip(tokens(base, [*TEXTS, "x"]), names, strict=True)]
    got = model.forward(mixed)
    for row, item in enumerate(mixed):
        np.testing.assert_allclose(got[row], model.forward([item])[0], atol=1e-5, rtol=0)
    assert len({round(float(got[row, 0]), 4) for row in (1, 5)}) == 2  # two adapters, two results


def test_an_adapter_holds_in_the_engine_the_bytes_its_file_holds(tiny: TinyFolders, tmp_path: Path) -> None:
    """q, k and v fused: each part keeps its own B (a stacked one is zeros outside its diagonal blocks)."""
    base = tiny["bert"]
    adapter = build_adapter(tmp_path / "adapter", base, seed=1, r=8)
    model = PoolingModel(read_model_folder(base), threads=1, adapters=[("domain", adapter)])
    in_file = sum(t.numel() * t.element_size() for t in load_file(adapter / "adapter_model.safetensors").values())
    assert model.adapters is not None
    assert model.adapters.bytes["domain"] == in_file


@pytest.mark.parametrize(
    "placement",
    [
        Placement(torch.device("cpu"), torch.bfloat16),  # projections wrapped to run on bucketed row counts
        Placement(torch.device("cpu"), torch.float32, {"device": "cpu", "dtype": "int8"}, int8=True),
    ],
    ids=["bfloat16", "int8"],
)
def test_adapters_apply_on_the_projections_reduced_precision_wraps(
    tiny: TinyFolders, tmp_path: Path, placement: Placement
) -> None:
    """The updates land on the wrapped projections (engine/precision): near float32's adapter vectors."""
    base = tiny["xlm-roberta"]
    adapter = build_adapter(tmp_path / "adapter", base, seed=1)
    items = tokens(base, TEXTS, "domain")
    reduced = PoolingModel(read_model_folder(base), threads=1, placement=placement, adapters=[("domain", adapter)])
    full = PoolingModel(read_model_folder(base), threads=1, adapters=[("domain", adapter)])
    np.testing.assert_allclose(vectors(reduced, items), vectors(full, items), atol=0.05, rtol=0)
    assert np.abs(vectors(reduced, items) - vectors(full, tokens(base, TEXTS))).max() > 0.2  # not the base's


def test_groups_with_adapter_inputs_run_eager_beside_a_compiled_forward(tiny: TinyFolders, tmp_path: Path) -> None:
    """The compiled forward has no adapter updates in it: it serves base-only groups, the eager model the rest."""
    base = tiny["bert"]
    model = PoolingModel(read_model_folder(base), threads=1, adapters=[("a", build_adapter(tmp_path / "a", base, 1))])
    compiled: list[Packed] = []

    def compiled_forward(packed: Packed) -> torch.Tensor:
        compiled.append(packed)
        return model.model(packed)  # type: ignore[no-any-return]

    model.compiled = compiled_forward
    model.forward(tokens(base, TEXTS, "a"))
    assert compiled == []
    model.forward(tokens(base, TEXTS))
    assert len(compiled) == 1


def _edit_config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"use_dora": True}, "use_dora"),
        ({"bias": "lora_only"}, "bias"),
        ({"alpha_pattern": {"query": 4}}, "alpha_pattern"),
    ],
)
def test_an_adapter_the_engine_cannot_compute_exactly_is_refused_naming_why(
    tiny: TinyFolders, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    base = tiny["bert"]
    adapter = build_adapter(tmp_path / "adapter", base, seed=1)
    _edit_config(adapter, **change)
    with pytest.raises(ModelError, match=f"adapter 'domain'.*{named}"):
        PoolingModel(read_model_folder(base), threads=1, adapters=[("domain", adapter)])


def test_target_modules_the_family_does_not_have_are_refused_by_name(tiny: TinyFolders, tmp_path: Path) -> None:
    """An adapter on the word embeddings (PEFT's lora_embedding_A/B) and on a projection renamed away."""
    base = tiny["bert"]
    adapter = build_adapter(tmp_path / "adapter", base, seed=1, target_modules=["query", "word_embeddings"])
    weights = load_file(adapter / "adapter_model.safetensors")
    renamed = {
        key.replace("layer.1.attention.self.query", "layer.1.attention.self.gate"): t for key, t in weights.items()
    }
    save_file(renamed, adapter / "adapter_model.safetensors")
    with pytest.raises(ModelError, match="target modules the model does not have: gate, word_embeddings"):
        PoolingModel(read_model_folder(base), threads=1, adapters=[("domain", adapter)])


def test_an_input_naming_an_adapter_the_engine_does_not_serve_is_an_error(tiny: TinyFolders, tmp_path: Path) -> None:
    base = tiny["bert"]
    model = PoolingModel(read_model_folder(base), threads=1, adapters=[("a", build_adapter(tmp_path / "a", base, 1))])
    with pytest.raises(ValueError, match="no adapter named other"):
        model.forward(tokens(base, ["x"], "other"))
    assert isinstance(model.forward(tokens(base, ["x"], "a")), np.ndarray)  # the hooks are left clean
    torch.testing.assert_close(
        torch.from_numpy(model.forward(tokens(base, ["x"]))),
        torch.from_numpy(PoolingModel(read_model_folder(base), threads=1).forward(tokens(base, ["x"]))),
    )


def test_inputs_naming_an_adapter_the_engine_lacks_fail_alone_and_the_rest_of_their_group_runs(
    tiny: TinyFolders, tmp_path: Path
) -> None:
    """An engine that refused an adapter another engine loaded: its inputs are answered NO_ADAPTER, unrun;
    the group's other inputs (the base's, a held adapter's) get the rows the group without them gives."""
    base = tiny["bert"]
    model = PoolingModel(read_model_folder(base), threads=1, adapters=[("a", build_adapter(tmp_path / "a", base, 1))])
    names = ["", "a", "gone", "a", ""]
    plain = tokens(base, [*TEXTS[:4], "x"])  # one group
    group = list(enumerate(t._replace(adapter=n) for t, n in zip(plain, names, strict=True)))
    ours, theirs = multiprocessing.Pipe(duplex=True)
    share = ThreadShare([0.0], 0, 1, 1)
    assert _run_batch(Inbox(theirs, reader=False), model, group, 0.0, share, Pending())
    assert ours.recv() == (Msg.NO_ADAPTER, ([2], "gone"))
    kind, (keys, rows, _) = ours.recv()
    assert (kind, keys) == (Msg.RESULT, [0, 1, 3, 4])
    np.testing.assert_array_equal(rows, model.forward([t for k, t in group if k != 2]))
    assert np.abs(rows[1] - model.forward([plain[1]])[0]).max() > 1e-2  # the held adapter's update applied
    assert not ours.poll(0.1)
