"""Request bodies of the routes (OpenAI, vLLM, Jina/Cohere and TEI shapes); parsed on the executor."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr, field_validator

from server.tokenizing.tokenizer import Direction

TextOrTokens = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]

_INPUT_SHAPES = "a string, a list of strings, a list of token ids, or a list of token-id lists"


def lower(value: Any) -> Any:
    """TEI's enums arrive as "Left"/"Right" from some clients and "left"/"right" from others."""
    return value.lower() if isinstance(value, str) else value


# TEI's truncation_direction, in any case
TruncationDirection = Annotated[Direction, BeforeValidator(lower)]


def check_input_shape(value: Any, field: str = "input") -> Any:
    """One clear message for every wrong shape instead of pydantic's four union branches."""
    if isinstance(value, str):
        return value
    ok = isinstance(value, list) and (
        all(isinstance(v, str) for v in value)
        or all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or all(isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v) for v in value)
    )
    if not ok:
        raise ValueError(f"'{field}' must be {_INPUT_SHAPES}")
    if not value:
        raise ValueError(f"'{field}' must not be empty")
    return value


PRIORITY_LIMIT = 2**31  # |priority| below it: any scheme clients use, and a bounded number


class Part(BaseModel):
    """A part of a request body (a document, TEI's similarity inputs)."""

    model_config = ConfigDict(extra="ignore")


class Body(Part):
    """A request body: every surface's takes vLLM's `priority` (lower runs first, 0 by default;
    read before the body is parsed: pipeline.at_priority)."""

    priority: StrictInt = Field(default=0, gt=-PRIORITY_LIMIT, lt=PRIORITY_LIMIT)


class InputRequest(Body):
    """The `input` every vLLM/OpenAI pooling route takes, with one clear error for a wrong shape."""

    input: TextOrTokens
    model: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    prompt_name: str | None = None  # one of the model's sentence-transformers prompts

    @field_validator("input", mode="before")
    @classmethod
    def _input_shape(cls, value: Any) -> Any:
        return check_input_shape(value)


class SparseOptions(Part):
    """Pruning of a sparse (SPLADE) model's weights: the `top_k` largest, those above `threshold`."""

    top_k: int | None = Field(None, ge=1)
    threshold: float | None = Field(None, ge=0)


class LongInputOptions(Part):
    """What to do with a text longer than the model takes (default WARMPOOL_LONG_INPUTS)."""

    long_inputs: Literal["refuse", "truncate", "chunk"] | None = None


class OutputOptions(Part):
    """Which of a bge-m3 model's outputs to answer, from one forward (default: the dense vector)."""

    outputs: list[Literal["dense", "sparse", "multi_vector"]] | None = Field(None, min_length=1)


class FloatBytes(Part):
    """vLLM's width and byte order of base64 vectors (float32, the host's order: what the openai
    client decodes); other formats ignore them, as vLLM's do."""

    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"


class VectorEncoding(FloatBytes):
    """How a dense vector is answered: floats, base64, quantized as Cohere's embedding types (int8,
    uint8, binary, ubinary: an extension of OpenAI's and TEI's surfaces), or vLLM's raw bytes (the
    body is the vectors' bytes; `bytes` adds a `metadata` header, `bytes_only` does not)."""

    encoding_format: Literal["float", "base64", "int8", "uint8", "binary", "ubinary", "bytes", "bytes_only"] = "float"

    @classmethod
    def of(cls, body: VectorEncoding) -> VectorEncoding:
        """The encoding alone, out of a body that takes it."""
        return cls(encoding_format=body.encoding_format, embed_dtype=body.embed_dtype, endianness=body.endianness)


class EmbeddingRequest(InputRequest, SparseOptions, LongInputOptions, OutputOptions, VectorEncoding):
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    late_chunking: bool = False  # Jina's: the inputs are one document's chunks, pooled in its context


class PoolingRequest(InputRequest, OutputOptions, FloatBytes):
    """vLLM's /pooling: answers the engine's raw output."""

    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    input_type: str | None = None  # Cohere's: search_query makes a multi-vector model's inputs queries


class ClassifyRequest(InputRequest):
    pass


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """The request schema for /openapi.json: routes read the raw body and parse it on the executor.
    Nested bodies are written out in place: a `#/$defs/...` reference means nothing inside an
    operation, and schema-driven clients and fuzzers cannot follow it."""
    schema = model.model_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline(schema, schema.pop("$defs", {}))}},
        }
    }


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {key: _inline(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    return node


class ImageURL(Part):
    url: StrictStr


class ContentPart(Part):
    """A chat-style content part: a text, or an image (a data: URL, base64, or an allowlisted URL)."""

    type: Literal["text", "image_url"]
    text: StrictStr | None = None
    image_url: ImageURL | StrictStr | None = None


class ScoreContent(Part):
    """vLLM's multimodal side of /score: each content part is one input (a text or an image)."""

    content: list[ContentPart] = Field(min_length=1)


class PassageOptions(LongInputOptions):
    """Documents longer than the model's window beside their query: `long_inputs: "chunk"` scores
    them as overlapping passages and takes the best passage's score (`passage_scoring: "mean"`: their mean)."""

    passage_scoring: Literal["max", "mean"] = "max"


class ScoreRequest(PassageOptions, Body):
    text_1: StrictStr | list[StrictStr] | ScoreContent
    text_2: StrictStr | list[StrictStr] | ScoreContent
    model: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)


class DocumentText(Part):
    """Cohere v1's document object: the text is what is ranked."""

    text: StrictStr


class DocumentImage(Part):
    """Jina's multimodal rerank document: an image (a data: URL, base64, or an allowlisted URL), for a
    CLIP or SigLIP model."""

    image: StrictStr


class RerankRequest(PassageOptions, Body):
    """Jina/Cohere shape (`documents`), or TEI's (`texts`, answered in TEI's shape)."""

    query: StrictStr
    documents: list[StrictStr | DocumentText | DocumentImage] | None = None
    texts: list[StrictStr] | None = None
    top_n: int | None = None
    return_documents: bool = True
    model: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    # TEI's fields
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: TruncationDirection = "right"


class TokenizeRequest(Body):
    prompt: StrictStr
    add_special_tokens: bool = True
    model: str | None = None


class DetokenizeRequest(Body):
    tokens: list[StrictInt]
    model: str | None = None
