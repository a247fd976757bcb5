"""OpenAI's Batch API request bodies (the `openai` package's batch_create_params)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=128)
    endpoint: str = Field(max_length=64)
    completion_window: Literal["24h"] = "24h"
    # OpenAI's bounds: 16 keys, keys up to 64 characters, values up to 512
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
