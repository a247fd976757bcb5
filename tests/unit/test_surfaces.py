"""The TEI and Cohere surfaces' pieces: prompts, embedding types, TEI's predict inputs, token spans,
left truncation, error shapes and the request schemas."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from common.folderjson import ModelError
from common.modelfolder import read_model_folder, read_prompts
from server.core.outputs import INT8_RANGE, encode_vectors, to_json
from server.http.errors import APIError, error_response
from server.protocols.openai import RerankRequest, openapi_body
from server.protocols.tei import SimilarityRequest
from server.routes.tei import predict_items
from server.texts.prompts import prompt_for_input_type, prompt_text
from server.tokenizing.tokenizer import TokenizerPool

MODEL = Path(__file__).parents[2] / "models" / "all-MiniLM-L6-v2"
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def folder():  # type: ignore[no-untyped-def]
    return dataclasses.replace(read_model_folder(MODEL), prompts=PROMPTS, default_prompt_name=None)


@pytest.fixture(scope="module")
def tokenizers() -> TokenizerPool:
    return TokenizerPool(MODEL)


def test_named_prompt_is_its_text(folder) -> None:  # type: ignore[no-untyped-def]
    """A prompt name gives the text sentence-transformers puts before each input."""
    assert prompt_text(folder, "query") == "query: "


def test_no_prompt_name_gives_the_default_prompt(folder) -> None:  # type: ignore[no-untyped-def]
    """Without a name, the model's default prompt applies, and none when it has no default."""
    assert prompt_text(folder, None) == ""
    assert prompt_text(dataclasses.replace(folder, default_prompt_name="passage"), None) == "passage: "


def test_unknown_prompt_name_is_a_400_listing_the_prompts(folder) -> None:  # type: ignore[no-untyped-def]
    """An unknown name is refused with the available names, in the form TEI clients parse."""
    with pytest.raises(APIError) as caught:
        prompt_text(folder, "nope")
    assert caught.value.status == 400
    assert 'Available prompts: ["passage", "query"]' in caught.value.message


@pytest.mark.parametrize(
    ("input_type", "expected"),
    [("search_query", "query: "), ("search_document", "passage: "), ("clustering", ""), (None, "")],
)
def test_cohere_input_type_picks_the_matching_prompt(folder, input_type: str | None, expected: str) -> None:  # type: ignore[no-untyped-def]
    """Cohere's input types map to the prompts models name for the same role, else the default."""
    assert prompt_for_input_type(folder, input_type) == expected


def test_prompts_are_read_and_checked(tmp_path: Path) -> None:
    """config_sentence_transformers.json's prompts are read; a default naming no prompt is a ModelError."""
    config = tmp_path / "config_sentence_transformers.json"
    config.write_text(json.dumps({"prompts": PROMPTS, "default_prompt_name": "query"}))
    assert read_prompts(tmp_path) == (PROMPTS, "query")
    config.write_text(json.dumps({"prompts": PROMPTS, "default_prompt_name": "other"}))
    with pytest.raises(ModelError, match="other"):
        read_prompts(tmp_path)


def test_binary_types_pack_the_signs() -> None:
    """ubinary packs the signs 8 to a byte; binary is the same less 128."""
    vectors = np.array([[0.5, -1, 0.1, -0.2, 0.3, 0.3, -0.1, 0.2, 1.0, -1, -1, -1, -1, -1, -1, -1]])
    assert encode_vectors(vectors, "ubinary") == [[0b10101101, 0b10000000]]
    assert encode_vectors(vectors, "binary") == [[0b10101101 - 128, 0]]


def test_int8_buckets_each_vector_over_its_own_fixed_range() -> None:
    """int8 floors each value into 256 buckets over [-R, R], R = INT8_RANGE * |v| / sqrt(d) (sentence-
    transformers' arithmetic); uint8 is int8 plus 128; a value past R is clipped."""
    assert INT8_RANGE == 5.0  # R = 2.5 for unit vectors of 4 dimensions: buckets 5/255 wide
    vectors = np.array([[0.5, -0.5, 0.5, -0.5], [1.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    assert encode_vectors(vectors, "int8") == [[25, -26, 25, -26], [50, -1, -1, -1]]
    assert encode_vectors(vectors, "uint8") == [[153, 102, 153, 102], [178, 127, 127, 127]]
    spike = np.eye(1, 100, dtype=np.float32)  # R = 0.5 < 1: clipped to the top bucket
    assert encode_vectors(spike, "int8")[0][:2] == [127, -1]


def test_base64_is_the_float32_bytes() -> None:
    """base64 carries each vector's little-endian float32 bytes."""
    vectors = np.array([[0.25, -1.5]], dtype=np.float32)
    (encoded,) = encode_vectors(vectors, "base64")
    assert np.array_equal(np.frombuffer(base64.b64decode(encoded), "<f4"), vectors[0])


@pytest.mark.parametrize(
    ("value", "items", "single"),
    [
        ("a", ["a"], True),
        (["a"], ["a"], True),
        (["a", "b"], [("a", "b")], True),
        ([["a"], ["b", "c"]], ["a", ("b", "c")], False),
    ],
)
def test_predict_inputs_as_tei_reads_them(value, items, single) -> None:  # type: ignore[no-untyped-def]
    """A text or a list of one or two texts is one input (a text, a pair); a list of lists a batch."""
    assert predict_items(value) == (items, single)


@pytest.mark.parametrize("value", [[], ["a", "b", "c"], [["a", "b", "c"]], [[]]])
def test_predict_inputs_of_the_wrong_shape_are_a_400(value) -> None:  # type: ignore[no-untyped-def]
    """An empty list, three texts or an empty item is refused, naming `inputs`."""
    with pytest.raises(APIError) as caught:
        predict_items(value)
    assert caught.value.status == 400 and caught.value.param == "inputs"


def test_token_spans_cover_the_text(tokenizers: TokenizerPool) -> None:
    """Each non-special token's span is the slice of the text it came from, in characters."""
    text = "Héllo wörld, unbelievable!"
    (spans,) = tokenizers.spans([text], add_special_tokens=True, max_tokens=256, budget=lambda size, field: None)
    assert spans[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert all(text[s["start"] : s["stop"]] == s["text"] for s in spans if not s["special"])
    assert [s["text"] for s in spans[1:3]] == ["Héllo", "wörld"]


def test_the_span_budget_is_told_at_least_what_the_answer_takes(tokenizers: TokenizerPool) -> None:
    """The size `spans` gives its budget before building the answer is no less than the JSON it
    then becomes, for ASCII, multi-byte text, special tokens and long offsets alike."""
    texts = ["Héllo wörld, unbelievable! 🚀 " * 40, "short", "x" * 3000, "日本語のテキスト" * 50]
    told: list[int] = []
    spans = tokenizers.spans(texts, True, 4096, lambda size, field: told.append(size))
    assert told and len(to_json(spans)) <= told[0]


def test_left_truncation_keeps_the_end(tokenizers: TokenizerPool) -> None:
    """Truncating from the left keeps the last tokens and the special tokens."""
    right, left = (tokenizers.encode_batch(["a b c d e f"], 4, direction)[0] for direction in ("right", "left"))
    assert tokenizers.decode(right.input_ids) == "[CLS] a b [SEP]"
    assert tokenizers.decode(left.input_ids) == "[CLS] e f [SEP]"


@pytest.mark.parametrize(
    ("shape", "body"),
    [
        ("tei", {"error": "bad", "error_type": "validation"}),
        ("openai", {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": 400}}),
    ],
)
def test_errors_leave_in_their_surface_shape(shape: str, body: dict) -> None:  # type: ignore[type-arg]
    """One error, rendered in the shape of the surface the request spoke."""
    error = APIError(400, "bad")
    error.shape = shape  # type: ignore[assignment]
    assert json.loads(error_response(error).body) == body


def test_cohere_errors_carry_an_id_and_a_message() -> None:
    """Cohere's error body: {"id", "message"}."""
    error = APIError(429, "slow down")
    error.shape = "cohere"
    body = json.loads(error_response(error).body)
    assert body["message"] == "slow down" and body["id"]


@pytest.mark.parametrize("model", [SimilarityRequest, RerankRequest])
def test_request_schemas_have_no_dangling_references(model) -> None:  # type: ignore[no-untyped-def]
    """Nested bodies are written out in the operation's schema: no `$ref` is left to follow."""
    schema = openapi_body(model)["requestBody"]["content"]["application/json"]["schema"]
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema


def test_per_token_outcome_keeps_each_inputs_rows() -> None:
    """Per-token results of different lengths stay one array per input; pooled rows are stacked."""
    from server.core.outcome import Outcome

    ragged = Outcome.of([np.zeros((3, 2)), np.ones((1, 2))], 0.0, 0.0).vectors
    assert [v.shape for v in ragged] == [(3, 2), (1, 2)]
    assert Outcome.of([np.zeros(2), np.ones(2)], 0.0, 0.0).vectors.shape == (2, 2)


def test_a_group_mixing_pooled_and_per_token_inputs_answers_each_in_its_place() -> None:
    """The engine runs each kind on its own and puts every answer back at its input's position."""
    from common.wire import Tokens
    from engine.heads import answer

    class Model:
        default_head = "pooled"

        def forward(self, items: list[Tokens]) -> np.ndarray:
            return np.array([[len(t.input_ids)] for t in items], dtype=np.float32)

        def forward_tokens(self, items: list[Tokens]) -> list[np.ndarray]:
            return [np.zeros((len(t.input_ids), 1)) for t in items]

    items = [Tokens([1, 2]), Tokens([1, 2, 3], head="tokens"), Tokens([1])]
    out = answer(Model(), items)  # type: ignore[arg-type]
    assert [np.shape(o) for o in out] == [(1,), (3, 1), (1,)]
    assert [float(out[0][0]), float(out[2][0])] == [2.0, 1.0]
