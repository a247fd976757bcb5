"""Qwen3 folders: which are yes/no rerankers (common.causal_reranker), the reranker's prompt and scores
against its model card's computation with transformers, and the configs engine.families.qwen3 computes or
refuses. (tests/unit/test_families.py checks the embedding folder against sentence-transformers, with
and without prompts, and packed batches against single forwards, with the other families.)"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.causal_reranker import CAUSAL_RERANKERS, QWEN3_RERANKER
from common.folderjson import ModelError
from common.modelfolder import read_model_folder
from engine.families import SCORERS, qwen3
from engine.runtime.model import PoolingModel
from server.core.outputs import activate
from server.tokenizing.tokenizer import TokenizerPool
from tests.qwen3_reference import model_card_prompts, model_card_scores
from tests.tiny_models import TinyFolders

RERANKERS = ["qwen3-reranker", "qwen3-reranker-untied"]  # the LM head tied to the embeddings, or its own
PAIRS = [
    ("what is a warm pool", "Hello world, the warm pool model"),
    ("日本語", "naïve café " * 40),  # cut at the folder's maximum
    ("", "x"),
    ("Привет мир {document}", "yes or no? <|im_end|> 🙂"),  # a field name and a special token in the texts
]


def reranker_pool(folder: Path) -> TokenizerPool:
    """The HTTP side's tokenizer for the folder, as the server builds it (with its pair template)."""
    return TokenizerPool(folder, read_model_folder(folder).pair_template)


def edited(source: Path, dest: Path, config: dict[str, Any]) -> Path:
    """A copy of `source` with `config` merged into its config.json."""
    shutil.copytree(source, dest)
    original = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**original, **config}))
    return dest


def test_reranker_pairs_become_the_model_cards_prompts(tiny: TinyFolders) -> None:
    """/score's pairs reach the engine as the model card's prompt ids: instruction, query and document
    in the template, tokenized with the tokenizer's own <|endoftext|>, between the prefix and suffix,
    a long pair cut in the document to the folder's maximum with the suffix kept."""
    folder = tiny["qwen3-reranker"]
    limit = read_model_folder(folder).max_model_len
    got = [t.input_ids for t in reranker_pool(folder).encode_pairs(PAIRS, limit)]
    assert got == model_card_prompts(folder, PAIRS, limit)
    assert len(got[1]) == limit


@pytest.mark.parametrize("name", RERANKERS)
def test_reranker_scores_are_the_model_cards_yes_probability(tiny: TinyFolders, name: str) -> None:
    """The engine's single logit through the cross-encoder activation (a sigmoid) is the model card's
    softmax over the "no" and "yes" logits of Qwen3ForCausalLM at the last token, within 1e-5."""
    folder = tiny[name]
    info = read_model_folder(folder)
    tokens = reranker_pool(folder).encode_pairs(PAIRS, info.max_model_len)
    got = activate(PoolingModel(info, threads=1).forward(tokens))[:, 0]
    expected = model_card_scores(folder, [t.input_ids for t in tokens])
    assert np.ptp(expected) > 0.05  # scores that differ: a constant 0.5 would not pass
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_a_pair_cut_to_the_least_length_allowed_keeps_the_prompt_whole(tiny: TinyFolders) -> None:
    """truncate_prompt_tokens at its least (the template's tokens plus one) cuts the body alone: the
    prefix and suffix stay whole, the body keeps one token and its <|endoftext|>."""
    folder = tiny["qwen3-reranker"]
    pool = reranker_pool(folder)
    least = pool.special_tokens_pair + 1
    whole = model_card_prompts(folder, PAIRS[:1], 10_000)[0]
    with pool.held() as tok:
        prefix = tok.encode(QWEN3_RERANKER.prefix, add_special_tokens=False).ids
        suffix = tok.encode(QWEN3_RERANKER.suffix, add_special_tokens=False).ids
        eos = tok.token_to_id("<|endoftext|>")
    cut = pool.encode_pairs(PAIRS[:1], least)[0].input_ids
    assert cut == [*prefix, whole[len(prefix)], eos, *suffix]


def test_a_causal_lm_without_modules_is_a_yes_no_reranker(tiny: TinyFolders) -> None:
    """A Qwen3ForCausalLM folder without sentence-transformers modules is served natively as a
    cross-encoder with Qwen3-Reranker's template, scored by the tokenizer's "no" and "yes" ids."""
    from transformers import AutoTokenizer

    folder = tiny["qwen3-reranker"]
    info = read_model_folder(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert (info.kind, info.native, info.pair_template) == ("cross-encoder", True, QWEN3_RERANKER)
    assert info.score_tokens == (tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes"))


def test_a_causal_lm_with_sentence_transformers_modules_is_an_embedding_model(
    tiny: TinyFolders, tmp_path: Path
) -> None:
    """Qwen3-Embedding's config names Qwen3ForCausalLM: with its modules.json the folder stays an
    embedding model (last token, normalised), served natively, its pairs not templated."""
    folder = edited(tiny["qwen3"], tmp_path / "embedding", {"architectures": ["Qwen3ForCausalLM"]})
    info = read_model_folder(folder)
    assert (info.kind, info.pooling, info.normalize, info.native) == ("embedding", "lasttoken", True, True)
    assert info.pair_template is None and info.score_tokens is None


def test_a_causal_lm_without_modules_or_yes_no_tokens_is_refused(tiny: TinyFolders, tmp_path: Path) -> None:
    """A Qwen3ForCausalLM folder that is neither (no modules, no single "yes" token) fails with a
    ModelError that says what it lacks for either."""
    folder = tmp_path / "neither"
    shutil.copytree(tiny["qwen3-reranker"], folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    del tokenizer["model"]["vocab"]["yes"]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ModelError, match=r"no single 'yes' and 'no' tokens.*add modules\.json"):
        read_model_folder(folder)


CANNOT = [{"use_sliding_window": True}, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}]


@pytest.mark.parametrize("change", CANNOT, ids=["sliding-window", "yarn"])
def test_a_reranker_the_native_engine_cannot_run_is_refused(
    tiny: TinyFolders, tmp_path: Path, change: dict[str, Any]
) -> None:
    """A yes/no reranker with sliding-window attention or scaled rotary positions is refused (there
    is no transformers path that would score it), naming the native engine's conditions."""
    folder = edited(tiny["qwen3-reranker"], tmp_path / "reranker", change)
    with pytest.raises(ModelError, match="only the native engine runs"):
        read_model_folder(folder)


@pytest.mark.parametrize("change", CANNOT, ids=["sliding-window", "yarn"])
def test_embedding_folders_the_native_module_does_not_compute_are_left_to_transformers(
    tiny: TinyFolders, tmp_path: Path, change: dict[str, Any]
) -> None:
    """A Qwen3 embedding folder with sliding-window attention or scaled rotary positions is served by
    transformers; the native engine refuses such a config outright."""
    folder = edited(tiny["qwen3"], tmp_path / "embedding", change)
    assert read_model_folder(tiny["qwen3"]).native
    assert not read_model_folder(folder).native
    with pytest.raises(ModelError, match="not implemented by the native Qwen3 engine"):
        qwen3.load(folder, json.loads((folder / "config.json").read_text()), None)


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"rope_theta": 1_000_000.0, "rope_scaling": None},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 5e3}},
    ],
    ids=["defaults", "old", "rope_parameters"],
)
def test_rope_theta_reads_configs_as_transformers_reads_them(config: dict[str, Any]) -> None:
    """The rotary base of a config with none, an old top-level rope_theta, or rope_parameters is
    transformers' Qwen3Config's."""
    from transformers import Qwen3Config

    assert qwen3.rope_theta(config) == Qwen3Config(**config).rope_parameters["rope_theta"]


def test_every_causal_reranker_family_has_a_scorer() -> None:
    """The model types common.causal_reranker serves as yes/no rerankers are exactly those
    engine.families can load as one."""
    assert set(SCORERS) == set(CAUSAL_RERANKERS)
