"""Model listing and version."""

from __future__ import annotations

import time
from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server.services import services

router = APIRouter(tags=["models"])
_CREATED = int(time.time())


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    """Every served model with its kind and limits (none before the first has loaded)."""
    svc = services(request)
    cards = [
        {
            "id": model.name,
            "object": "model",
            "created": _CREATED,
            "owned_by": "warmpool",
            "root": str(model.folder.path),
            "kind": model.folder.kind,
            "max_model_len": model.folder.max_model_len,
            "dimensions": model.folder.dimensions,
        }
        for model in svc.models.values()
    ]
    return JSONResponse({"object": "list", "data": cards})


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": metadata.version("warmpool")})
