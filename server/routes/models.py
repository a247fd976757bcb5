"""Model listing and version."""

from __future__ import annotations

import time
from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from common.modelfolder import ModelFolder
from server.services import services

router = APIRouter(tags=["models"])
_CREATED = int(time.time())


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    """Every configured model: the ready ones with their kind and limits, the others with their state."""
    svc = services(request)
    cards = []
    for name in svc.configured or list(svc.models):
        card: dict[str, object] = {"id": name, "object": "model", "created": _CREATED, "owned_by": "warmpool"}
        model = svc.models.get(name)
        if model is None:
            failed = svc.startup.for_model(name).failed
            cards.append({**card, "state": "failed" if failed else "starting"})
            continue
        folder = model.folder
        cards.append(
            {
                **card,
                "state": "ready",
                "root": str(folder.path),
                "kind": folder.kind,
                "max_model_len": folder.max_model_len,
                "dimensions": folder.dimensions,
                **_outputs(folder),
            }
        )
    return JSONResponse({"object": "list", "data": cards})


def _outputs(folder: ModelFolder) -> dict[str, object]:
    """What an embedding model answers, and how it pools: a dense vector, or sparse weights."""
    if folder.kind == "sparse":
        return {"outputs": ["sparse"], "pooling": "splade"}
    if folder.kind == "embedding":
        return {"outputs": ["dense"], "pooling": folder.pooling}
    return {}


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": metadata.version("warmpool")})
