"""The baseline warmpool is measured against: the usual sequential start of a model server.

Imports torch and transformers, loads the model in a FastAPI lifespan, and only then binds,
as vLLM, TEI and Infinity do. Embeds inside the handler; it exists only to be timed.
Usage: python -m bench.naive_server MODEL_DIR PORT [DEVICE]
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from transformers import AutoModel, AutoTokenizer

state: dict[str, Any] = {}


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    state["device"] = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    state["tokenizer"] = AutoTokenizer.from_pretrained(sys.argv[1])
    state["model"] = AutoModel.from_pretrained(sys.argv[1]).to(state["device"]).eval()
    yield


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/embeddings")
async def embed(body: dict[str, Any]) -> dict[str, Any]:
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    batch = state["tokenizer"](texts, padding=True, truncation=True, return_tensors="pt").to(state["device"])
    with torch.inference_mode():
        hidden = state["model"](**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    return {"data": [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors.cpu())]}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
