"""Request bodies of Text Embeddings Inference's routes, as TEI documents them."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, StrictInt, StrictStr

from server.protocols.openai import (
    Body,
    LongInputOptions,
    Part,
    SparseOptions,
    TextOrTokens,
    TruncationDirection,
    VectorEncoding,
    check_input_shape,
)

# TEI's `inputs`: texts or token ids, with one clear error for a wrong shape
Inputs = Annotated[TextOrTokens, BeforeValidator(lambda value: check_input_shape(value, "inputs"))]


class TEIOptions(Body):
    """What TEI's text routes share: truncation (off by default) and its side, and a prompt name."""

    truncate: bool | None = None
    truncation_direction: TruncationDirection = "right"
    prompt_name: str | None = None


class TEIEmbedRequest(TEIOptions, LongInputOptions, VectorEncoding):
    """TEI's /embed; `encoding_format` (with `embed_dtype`, `endianness`) is our extension."""

    inputs: Inputs
    normalize: bool = True
    dimensions: int | None = Field(None, ge=1)


class TEIEmbedAllRequest(TEIOptions):
    inputs: Inputs


class TEIEmbedSparseRequest(TEIOptions, SparseOptions, LongInputOptions):
    inputs: Inputs


class TEIPredictRequest(Body):
    """A text, a [text, text] pair, or a batch of [text] and [text, text] items (and, as plain
    lists of texts, a batch of texts)."""

    inputs: StrictStr | list[StrictStr] | list[list[StrictStr]]
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "right"
    raw_scores: bool = False


class SimilarityInput(Part):
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


def truncation(options: TEIOptions | TEIPredictRequest) -> int | None:
    """TEI's `truncate: true` cuts at the model's maximum; off (the default), too long is a 400."""
    return -1 if options.truncate else None
