"""Request inputs on the executor: model selection, admission per input, errors that name the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from common.modelfolder import ModelFolder, read_model_folder
from common.settings import Settings
from server.core.admission import Admission
from server.core.inputs import RequestContext, max_chars, tokenize_inputs
from server.core.services import ServedModel
from server.http.errors import APIError
from server.routes.score import tokenize_pairs
from server.tokenizing.tokenizer import TokenizerPool


@pytest.fixture(scope="module")
def folder(model_dir: Path) -> ModelFolder:
    return read_model_folder(model_dir)


@pytest.fixture(scope="module")
def tokenizers(model_dir: Path) -> TokenizerPool:
    return TokenizerPool(model_dir)


def context(folder: ModelFolder, tokenizers: TokenizerPool, **folder_changes: Any) -> RequestContext:
    """A context on one served model named "minilm", with 100 admission permits."""
    model = ServedModel("minilm", dataclasses.replace(folder, **folder_changes), tokenizers, engine=None)  # type: ignore[arg-type]  (no engine runs here)
    return RequestContext(model, {"minilm": model}, Settings(), Admission(100))


def test_an_unknown_model_is_a_404_naming_the_served_ones(folder: ModelFolder, tokenizers: TokenizerPool) -> None:
    """A `model` field no served model has is a 404 whose message lists what is served."""
    ctx = context(folder, tokenizers)
    with pytest.raises(APIError) as caught:
        ctx.select_model("gpt-4")
    assert caught.value.status == 404 and caught.value.param == "model"
    assert "'gpt-4'" in caught.value.message and "'minilm'" in caught.value.message


def test_the_served_name_or_none_selects_the_model(folder: ModelFolder, tokenizers: TokenizerPool) -> None:
    """Naming the served model, or no model, keeps the request on it."""
    ctx = context(folder, tokenizers)
    ctx.select_model(None)
    ctx.select_model("minilm")
    assert ctx.model_name == "minilm"


def test_inputs_take_one_permit_each(folder: ModelFolder, tokenizers: TokenizerPool) -> None:
    """Tokenizing a list admits one permit per input before any tokenizing."""
    ctx = context(folder, tokenizers)
    tokens = tokenize_inputs(["a", "b", "c"], ctx, None)
    assert len(tokens) == 3 and ctx.admitted == 3


def test_a_bi_encoder_pair_request_takes_a_permit_per_unique_text(
    folder: ModelFolder, tokenizers: TokenizerPool
) -> None:
    """On an embedding model, a query against five documents (three of them the same text) embeds
    four unique texts (the query and three documents): four permits, not one per pair."""
    ctx = context(folder, tokenizers)
    documents = ["doc one", "doc two", "doc one", "doc one", "doc three"]
    tokens, pairs = tokenize_pairs(["query"] * 5, documents, ctx, None, ("query", "documents"))
    assert len(tokens) == ctx.admitted == 4 and pairs.count == 5
    assert pairs.right[0] == pairs.right[2] != pairs.right[1]


def test_a_cross_encoder_takes_a_permit_per_pair(folder: ModelFolder, tokenizers: TokenizerPool) -> None:
    """On a cross-encoder, every (query, document) pair is one forward input and one permit."""
    ctx = context(folder, tokenizers, kind="cross-encoder")
    tokens, pairs = tokenize_pairs(["q"] * 3, ["a", "b", "a"], ctx, None, ("query", "documents"))
    assert len(tokens) == ctx.admitted == 3 and pairs.cross


@pytest.mark.parametrize("kind", ["embedding", "cross-encoder"])
def test_a_too_long_document_is_named_by_the_requests_own_field(
    folder: ModelFolder, tokenizers: TokenizerPool, kind: str
) -> None:
    """/rerank errors name `documents[i]`, the field the client sent, not vLLM's `text_2`."""
    ctx = context(folder, tokenizers, kind=kind)
    with pytest.raises(APIError) as caught:
        tokenize_pairs(["q"] * 2, ["short", "word " * 400], ctx, None, ("query", "documents"))
    assert caught.value.status == 400 and caught.value.param == "documents"
    assert "documents[1]" in caught.value.message


def test_a_text_past_the_character_cap_is_refused_before_tokenizing(
    folder: ModelFolder, tokenizers: TokenizerPool
) -> None:
    """Without truncation, a text of more characters than the model's tokens could ever need is a
    400 naming the input and the cap."""
    ctx = context(folder, tokenizers)
    with pytest.raises(APIError) as caught:
        tokenize_inputs(["ok", "x" * (max_chars(folder) + 1)], ctx, None)
    assert caught.value.status == 400 and caught.value.param == "input"
    assert "input[1]" in caught.value.message and str(max_chars(folder)) in caught.value.message


def test_with_truncation_a_huge_text_gives_the_tokens_of_the_whole_text(
    folder: ModelFolder, tokenizers: TokenizerPool
) -> None:
    """Asked to truncate, a text past the cap is cut to it first, and yields exactly the tokens the
    whole text truncated would."""
    ctx = context(folder, tokenizers)
    huge = "warm pools start fast " * 20_000  # 440 KB
    (tokens,) = tokenize_inputs(huge, ctx, -1)
    assert tokens == tokenizers.encode(huge, truncate=folder.max_model_len)
    assert len(tokens.input_ids) == folder.max_model_len


def test_truncation_shorter_than_the_special_tokens_is_a_400(folder: ModelFolder, tokenizers: TokenizerPool) -> None:
    """truncate_prompt_tokens must leave room for one token besides [CLS] and [SEP]."""
    ctx = context(folder, tokenizers)
    with pytest.raises(APIError) as caught:
        tokenize_inputs("hello world", ctx, 2)
    assert caught.value.status == 400 and caught.value.param == "truncate_prompt_tokens"
    assert "between 3 and" in caught.value.message
    (tokens,) = tokenize_inputs("hello world", ctx, 3)
    assert len(tokens.input_ids) == 3


def test_a_too_long_query_is_refused_once_before_pairing(folder: ModelFolder, tokenizers: TokenizerPool) -> None:
    """On a cross-encoder, a query over the model's maximum is a 400 naming `query`, found before
    it is paired with (and tokenized against) each document."""
    ctx = context(folder, tokenizers, kind="cross-encoder")
    with pytest.raises(APIError) as caught:
        tokenize_pairs(["word " * 300] * 50, ["doc"] * 50, ctx, None, ("query", "documents"))
    assert caught.value.param == "query" and "query has" in caught.value.message


def test_pair_truncation_must_leave_room_beside_the_pairs_special_tokens(
    folder: ModelFolder, tokenizers: TokenizerPool
) -> None:
    """A cross-encoder pair carries [CLS] q [SEP] d [SEP]: truncating to 3 would keep no text, so
    the floor for pairs is 4."""
    ctx = context(folder, tokenizers, kind="cross-encoder")
    with pytest.raises(APIError) as caught:
        tokenize_pairs(["q"], ["d"], ctx, 3, ("query", "documents"))
    assert "between 4 and" in caught.value.message
    tokens, _ = tokenize_pairs(["query"], ["document"], ctx, 4, ("query", "documents"))
    assert len(tokens[0].input_ids) == 4
