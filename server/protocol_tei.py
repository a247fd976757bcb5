"""Request bodies of Text Embeddings Inference's routes, as TEI documents them."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt, StrictStr, field_validator

from server.protocol import Body, TextOrTokens, check_input_shape, lower
from server.tokenizer import Direction


class TEIOptions(Body):
    """What TEI's text routes share: truncation (off by default) and its side, and a prompt name."""

    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None

    @field_validator("truncation_direction", mode="before")
    @classmethod
    def _direction(cls, value: Any) -> Any:
        return lower(value)


class TEIEmbedRequest(TEIOptions):
    inputs: TextOrTokens
    normalize: bool = True
    dimensions: int | None = Field(None, ge=1)

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs_shape(cls, value: Any) -> Any:
        return check_input_shape(value, "inputs")


class TEIEmbedAllRequest(TEIOptions):
    inputs: TextOrTokens

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs_shape(cls, value: Any) -> Any:
        return check_input_shape(value, "inputs")


class TEIPredictRequest(Body):
    """A text, a [text, text] pair, or a batch of [text] and [text, text] items (and, as plain
    lists of texts, a batch of texts)."""

    inputs: StrictStr | list[StrictStr] | list[list[StrictStr]]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    raw_scores: bool = False

    @field_validator("truncation_direction", mode="before")
    @classmethod
    def _direction(cls, value: Any) -> Any:
        return lower(value)


class SimilarityInput(Body):
    source_sentence: StrictStr
    sentences: list[StrictStr]


class SimilarityRequest(Body):
    inputs: SimilarityInput
    parameters: TEIOptions | None = None


class TEITokenizeRequest(Body):
    inputs: StrictStr | list[StrictStr]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class DecodeRequest(Body):
    ids: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: bool = True
