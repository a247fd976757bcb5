"""The native families (BERT, RoBERTa, XLM-RoBERTa, MPNet, ModernBERT, EmbeddingGemma, NomicBERT, GTE)
and sentence-transformers' Dense modules give sentence-transformers' and transformers' numbers: whole forward
passes of tiny random models in-process, tokenized as the server tokenizes, and the pieces in which the
families differ."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import functools
import importlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from common.native import NATIVE_ACTIVATIONS, NATIVE_FAMILIES
from common.st_modules import DENSE_ACTIVATIONS, DenseLayer
from common.wire import Tokens
from engine.families import MODULES, gemma3, nomic_gte
from engine.families.modernbert import layer_types, rope_theta
from engine.families.mpnet import relative_position_bucket
from engine.heads import dense
from engine.layers.encoder import ACTIVATIONS, band_mask
from engine.layers.packed import Packed, offset_positions
from engine.runtime.device import Placement
from engine.runtime.model import PoolingModel
from server.core.outputs import activate, normalize
from tests import tiny_models
from tests.tiny_models import MAX_TOKENS, SMALL, TINY, TinyFolders
from tests.unit.pools import pool as pool_of

EMBEDDERS = [
    "xlm-roberta",
    "roberta",
    "mpnet",
    "bert",
    "modernbert",
    "embeddinggemma",
    "nomic-bert",
    "gte",
    "qwen3",
    "distilbert",
]  # distilbert: the transformers fallback
NATIVE = [name for name in TINY if name != "distilbert"]
TEXTS = [
    "",
    "a",
    "Hello world, the warm pool model",
    "naïve café 日本語 🙂 Привет мир, and ∮ ☃ 🚀 the tokenizers do not know",
    "a literal <pad> in a text: RoBERTa and MPNet give it the padding position",
    "the warm pool engine keeps models loaded " * 20,  # far past MAX_TOKENS: cut there
]
PAIRS = [
    ("what is a warm pool", "Hello world, the warm pool model"),
    ("日本語", "naïve café " * 40),  # cut at MAX_TOKENS
    ("", "x"),
    ("Привет мир", "a literal <pad> here"),
]

Engines = Callable[[str], PoolingModel]


@pytest.fixture(scope="module")
def engines(tiny: TinyFolders) -> Engines:
    """The engine's model of a TINY folder, loaded once per module."""
    return functools.cache(lambda name: PoolingModel(read_model_folder(tiny[name]), threads=1))


def server_tokens(folder: Path, inputs: list[str] | list[tuple[str, str]]) -> list[Tokens]:
    """The inputs as the server tokenizes them, cut at the model's maximum."""
    info = read_model_folder(folder)
    pool, limit = pool_of(folder, info.pair_template), info.max_model_len  # a Qwen3 reranker's prompt
    if isinstance(inputs[0], tuple):
        return pool.encode_pairs(inputs, truncate=limit)  # type: ignore[arg-type]
    return pool.encode_batch(inputs, truncate=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(TINY))
def test_folders_of_a_native_family_are_served_natively(tiny: TinyFolders, name: str) -> None:
    """Every tiny folder of bert, roberta, xlm-roberta and mpnet, as transformers and sentence-transformers
    save them, is read as native; the DistilBERT one is left to transformers."""
    assert read_model_folder(tiny[name]).native is (name in NATIVE)


@pytest.mark.parametrize("name", EMBEDDERS)
def test_embeddings_match_sentence_transformers(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """The engine's vectors, normalised where the folder says so, are SentenceTransformer.encode's within
    1e-5: every pooling mode the folders use, their Dense modules, texts empty, unicode, with a literal pad
    token, and one cut at the model's maximum length."""
    from sentence_transformers import SentenceTransformer

    model = engines(name)
    tokens = server_tokens(tiny[name], TEXTS)
    assert len(tokens[-1].input_ids) == model.info.max_model_len == MAX_TOKENS  # the long text was cut
    got = model.forward(tokens)
    got = normalize(got) if model.info.normalize else got
    expected = SentenceTransformer(str(tiny[name]), device="cpu").encode(TEXTS)
    assert got.shape == expected.shape == (len(TEXTS), model.info.dimensions)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("name", "prompt"), [(name, p) for name in TINY for p in TINY[name].prompts])
def test_prompted_embeddings_match_sentence_transformers(
    tiny: TinyFolders, engines: Engines, name: str, prompt: str
) -> None:
    """Each named prompt of a folder that has them (EmbeddingGemma's "task: search result | query: "),
    put before every text as the server puts it, gives SentenceTransformer.encode(prompt_name=...)'s
    vectors within 1e-5, the prompted long text cut at the model's maximum length included."""
    from sentence_transformers import SentenceTransformer

    model = engines(name)
    tokens = server_tokens(tiny[name], [model.info.prompts[prompt] + text for text in TEXTS])
    assert len(tokens[-1].input_ids) == MAX_TOKENS
    got = model.forward(tokens)
    got = normalize(got) if model.info.normalize else got
    expected = SentenceTransformer(str(tiny[name]), device="cpu").encode(TEXTS, prompt_name=prompt)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", NATIVE)
def test_a_packed_batch_gives_the_rows_of_single_forwards(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """Inputs of mixed lengths packed into one batch give, row for row, what each gives alone."""
    model = engines(name)
    tokens = server_tokens(tiny[name], PAIRS if model.info.kind != "embedding" else TEXTS)
    together = model.forward(tokens)
    alone = np.concatenate([model.forward([item]) for item in tokens])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["xlm-roberta-reranker", "modernbert-reranker"])
def test_reranker_scores_match_cross_encoder(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """An XLM-RoBERTa and a ModernBERT (mean-pooled) sequence classifier with one label score pairs as
    CrossEncoder.predict does (its sigmoid), within 1e-5, a pair cut at the model's maximum length included."""
    from sentence_transformers import CrossEncoder

    folder = tiny[name]
    tokens = server_tokens(folder, PAIRS)
    assert max(len(t.input_ids) for t in tokens) == MAX_TOKENS
    got = activate(engines(name).forward(tokens))[:, 0]
    expected = CrossEncoder(str(folder), device="cpu").predict(PAIRS)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_classifier_logits_match_transformers(tiny: TinyFolders, engines: Engines) -> None:
    """An MPNet sequence classifier's logits are transformers' within 1e-5."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tiny["mpnet-classifier"]
    got = engines("mpnet-classifier").forward(server_tokens(folder, TEXTS))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        expected = reference(**batch).logits.numpy()
    assert got.shape == (len(TEXTS), 3)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "name",
    [
        "xlm-roberta",
        "mpnet",
        "bert",
        "modernbert",
        "embeddinggemma",
        "nomic-bert",
        "gte",
        "qwen3",
        "xlm-roberta-reranker",
        "qwen3-reranker",
    ],
)
def test_half_precision_follows_float32(tiny: TinyFolders, engines: Engines, name: str) -> None:
    """In bfloat16 (as on a GPU, here on the CPU) every family runs, with its attention bias and Dense
    modules in that dtype, and stays near its float32 outputs."""
    info = read_model_folder(tiny[name])
    half = PoolingModel(info, threads=1, placement=Placement(torch.device("cpu"), torch.bfloat16))
    tokens = server_tokens(tiny[name], PAIRS if info.kind != "embedding" else TEXTS)
    np.testing.assert_allclose(half.forward(tokens), engines(name).forward(tokens), atol=0.1, rtol=0)


def test_offset_positions_match_transformers() -> None:
    """RoBERTa's position ids on the packed layout are transformers' create_position_ids_from_input_ids,
    input by input, padding ids inside an input included."""
    from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaEmbeddings

    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randint(0, 4, (n,), generator=gen) for n in (1, 9, 4, 17)]  # ids 0-3: pad (1) is frequent
    got = offset_positions(Packed.of([Tokens(ids.tolist()) for ids in inputs]), padding_idx=1)
    expected = torch.cat([XLMRobertaEmbeddings.create_position_ids_from_input_ids(ids[None], 1)[0] for ids in inputs])
    assert torch.equal(got, expected)


def test_relative_position_buckets_match_transformers() -> None:
    """MPNet's buckets of relative distance are transformers' for distances within and past 128 both ways."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    relative = torch.arange(-600, 600)
    assert torch.equal(relative_position_bucket(relative), MPNetEncoder.relative_position_bucket(relative))


@pytest.mark.parametrize(
    "old",
    [
        {"num_hidden_layers": 7},
        {"num_hidden_layers": 5, "global_attn_every_n_layers": 2, "global_rope_theta": 8e4, "local_rope_theta": 5e3},
    ],
    ids=["defaults", "named"],
)
def test_modernbert_configs_of_the_older_format_read_as_transformers_reads_them(old: dict[str, Any]) -> None:
    """Configs on the hub predate layer_types and rope_parameters (global_attn_every_n_layers,
    global/local_rope_theta, or nothing): each layer's attention and rotary base are transformers'."""
    from transformers import ModernBertConfig

    reference = ModernBertConfig(**old)
    assert layer_types(old) == reference.layer_types
    for kind in ("full_attention", "sliding_attention"):
        assert rope_theta(old, kind) == reference.rope_parameters[kind]["rope_theta"]


@pytest.mark.parametrize(
    "old",
    [
        {"num_hidden_layers": 7},
        {"num_hidden_layers": 13, "sliding_window_pattern": 4, "rope_theta": 5e5, "rope_local_base_freq": 2e3},
    ],
    ids=["defaults", "named"],
)
def test_gemma3_configs_of_the_older_format_read_as_transformers_reads_them(old: dict[str, Any]) -> None:
    """Gemma 3 configs that predate layer_types and rope_parameters (sliding_window_pattern, rope_theta
    and rope_local_base_freq, or nothing): each layer's attention and rotary base are transformers'."""
    from transformers import Gemma3TextConfig

    reference = Gemma3TextConfig(**old)
    assert gemma3.layer_types(old) == reference.layer_types
    for kind in ("full_attention", "sliding_attention"):
        assert gemma3.rope_theta(old, kind) == reference.rope_parameters[kind]["rope_theta"]


@pytest.mark.parametrize("window", [7, 8, 16])
def test_gemma3_sliding_layers_see_what_transformers_lets_them_see(window: int) -> None:
    """A bidirectional Gemma 3 sliding layer's band (sliding_window // 2 either way, from config.json's
    sliding_window, odd or even) is the mask transformers gives that layer."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    config = Gemma3TextConfig(
        vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=8, sliding_window=window, use_bidirectional_attention=True,
        layer_types=["sliding_attention"],
    )  # fmt: skip
    model, seen = Gemma3TextModel(config).eval(), []
    model.layers[0].register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True
    )
    length = 3 * window
    with torch.inference_mode():
        model(
            input_ids=torch.ones((1, length), dtype=torch.long),
            attention_mask=torch.ones((1, length), dtype=torch.long),
        )
    mask = seen[0][0, 0]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    reach = gemma3.sliding_reach({"sliding_window": window})
    got = band_mask(length, reach, torch.device("cpu"))
    assert got is not None and torch.equal(got, allowed)


@pytest.mark.parametrize("change", [{"use_bidirectional_attention": False}, {"attn_logit_softcapping": 50.0}])
def test_gemma3_folders_the_native_module_does_not_compute_are_left_to_transformers(
    tiny: TinyFolders, tmp_path: Path, change: dict[str, Any]
) -> None:
    """A causal Gemma 3 text model, or one with attention logit softcapping, is not served natively."""
    folder = tmp_path / "gemma"
    shutil.copytree(tiny["embeddinggemma"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    assert read_model_folder(tiny["embeddinggemma"]).native
    assert not read_model_folder(folder).native


# nomic-embed-text-v1.5's config.json: the original nomic-bert names and switches, not transformers'
NOMIC_ORIGINAL = {
    "activation_function": "swiglu", "causal": False, "prenorm": False, "parallel_block": False, "use_rms_norm": False,
    "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False, "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
    "max_trained_positions": 2048, "n_positions": 8192,
}  # fmt: skip
NOMIC_RENAMED = {
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "intermediate_size": "n_inner",
    "layer_norm_eps": "layer_norm_epsilon",
}


def test_a_nomic_folder_with_the_original_config_runs_as_with_transformers_config(
    tiny: TinyFolders, engines: Engines, tmp_path: Path
) -> None:
    """A nomic-bert folder whose config.json has the original layout (n_embd, n_layer, ..., rotary_emb_base,
    the switches, no hidden_act), as nomic-embed-text-v1.5's has, is native and gives the vectors of the same
    weights under transformers' config."""
    folder = tmp_path / "nomic"
    shutil.copytree(tiny["nomic-bert"], folder)
    config = json.loads((folder / "config.json").read_text())
    original = {k: v for k, v in config.items() if k not in {*NOMIC_RENAMED, "rope_parameters", "hidden_act"}}
    original |= {old: config[new] for new, old in NOMIC_RENAMED.items()} | NOMIC_ORIGINAL
    original["rotary_emb_base"] = config["rope_parameters"]["rope_theta"]
    (folder / "config.json").write_text(json.dumps(original))
    info = read_model_folder(folder)
    assert info.native and info.dimensions == engines("nomic-bert").info.dimensions
    tokens = server_tokens(folder, TEXTS)
    got = PoolingModel(info, threads=1).forward(tokens)
    np.testing.assert_allclose(got, engines("nomic-bert").forward(tokens), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "change",
    [{"prenorm": True}, {"rotary_emb_interleaved": True}, {"rotary_emb_fraction": 0.5}, {"mlp_fc1_bias": True}],
)
def test_nomic_folders_with_original_switches_not_computed_here_are_left_to_transformers(
    tiny: TinyFolders, tmp_path: Path, change: dict[str, Any]
) -> None:
    """An original nomic-bert config switch the native module does not compute (pre-norm layers, interleaved or
    partial rotary, MLP biases) makes the folder not native."""
    folder = tmp_path / "nomic"
    shutil.copytree(tiny["nomic-bert"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **NOMIC_ORIGINAL, **change}))
    assert read_model_folder(tiny["nomic-bert"]).native
    assert not read_model_folder(folder).native


@pytest.mark.parametrize("stem", ["NomicBert", "Gte"])
def test_masked_lm_checkpoints_load_by_name_and_match_transformers(stem: str, tmp_path: Path) -> None:
    """A NomicBertForMaskedLM and a GteForMaskedLM checkpoint, in the layout transformers saves (the encoder
    under the task model's prefix, Nomic's Wqkv/fc11/fc12/fc2, GTE's qkv_proj/up_gate_proj), load onto the
    native encoder, whose hidden states (token types included) are transformers' within 1e-5."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, f"{stem}Config")(
        vocab_size=50, intermediate_size=48, type_vocab_size=2, max_position_embeddings=64, **SMALL
    )
    reference = tiny_models.jitter(getattr(transformers, f"{stem}ForMaskedLM")(config), seed=0).eval()
    reference.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [f"{stem}ForMaskedLM"] and read_model_folder(tmp_path).native
    inputs = [Tokens(torch.randint(0, 50, (n,)).tolist(), [0] * (n - 2) + [1, 1]) for n in (5, 17, 2)]
    with torch.inference_mode():
        got = nomic_gte.load(tmp_path, saved, None)(Packed.of(inputs))
        expected = [
            reference.base_model(
                input_ids=torch.tensor([t.input_ids]), token_type_ids=torch.tensor([t.token_type_ids])
            ).last_hidden_state[0]
            for t in inputs
        ]
    np.testing.assert_allclose(got.numpy(), torch.cat(expected).numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", sorted(NATIVE_FAMILIES))
def test_every_native_family_names_an_engine_module_that_loads(model_type: str) -> None:
    """The module common.native names for a model_type is an engine family module with a `load`."""
    module = MODULES[NATIVE_FAMILIES[model_type].module]
    assert module.__name__.startswith("engine.families.") and callable(module.load)


@pytest.mark.parametrize("name", sorted(NATIVE_ACTIVATIONS))
def test_hidden_activations_match_transformers(name: str) -> None:
    """Each hidden_act a native family accepts computes transformers' ACT2FN function within 1e-6."""
    from transformers.activations import ACT2FN

    x = torch.linspace(-6, 6, 1001)
    torch.testing.assert_close(ACTIVATIONS[name](x), ACT2FN[name](x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("class_path", sorted(DENSE_ACTIVATIONS))
def test_dense_activations_match_their_torch_modules(class_path: str) -> None:
    """Each Dense activation_function accepted computes what its torch.nn class computes."""
    module, _, name = class_path.rpartition(".")
    x = torch.linspace(-6, 6, 1001)
    expected = getattr(importlib.import_module(module), name)()(x)
    torch.testing.assert_close(dense.ACTIVATIONS[DENSE_ACTIVATIONS[class_path]](x), expected, atol=0, rtol=0)


def test_a_dense_module_without_weights_is_a_model_error_naming_its_folder(tmp_path: Path) -> None:
    """A Dense module whose folder has neither weights file fails the load with a ModelError naming it."""
    with pytest.raises(ModelError, match="Dense module") as caught:
        dense.load((DenseLayer(path=tmp_path, in_features=4, out_features=2),), torch.device("cpu"), torch.float32)
    assert str(tmp_path) in str(caught.value)
