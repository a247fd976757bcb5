"""Model listing and version."""

from __future__ import annotations

import time
from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server.runtime import runtime

router = APIRouter(tags=["models"])
_CREATED = int(time.time())


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    rt = runtime(request)
    info = rt.model
    card = {
        "id": rt.settings.model_name,
        "object": "model",
        "created": _CREATED,
        "owned_by": "warmpool",
        "root": str(rt.settings.model_path),
        "kind": info.kind if info else None,
        "max_model_len": info.max_model_len if info else None,
        "dimensions": info.dimensions if info else None,
    }
    return JSONResponse({"object": "list", "data": [card]})


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": metadata.version("warmpool")})
