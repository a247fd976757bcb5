"""Request bodies of Cohere's embed routes (v1 and v2), as Cohere documents them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictStr, field_validator

from server.protocols.openai import Body, LongInputOptions

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereEmbedRequest(Body, LongInputOptions):
    texts: list[StrictStr] | None = None
    model: str | None = None
    input_type: str | None = None  # search_query, search_document, classification, clustering
    embedding_types: list[EmbeddingType] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    images: list[Any] | None = None
    inputs: list[Any] | None = None

    @field_validator("truncate", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value
