"""Model listing and version."""

from __future__ import annotations

import time
from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from common.modelfolder import ModelFolder
from server import kinds
from server.core.services import ServedModel, Services, services
from server.http.errors import APIError

router = APIRouter(tags=["models"])
_CREATED = int(time.time())


def input_modalities(folder: ModelFolder) -> list[str]:
    """What a model's inputs may be: text, and images for a CLIP or SigLIP model (server/vision/multimodal.py)."""
    return ["text", "image"] if kinds.KINDS[folder.output].takes_images else ["text"]


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    """Every configured model: the ready ones with their kind and limits, the others with their state;
    the fields OpenAI's Model and Infinity's ModelInfo read (`stats`, `capabilities`) included."""
    return JSONResponse(model_list(request, "warmpool"))


@router.get("/models")
async def list_models_infinity(request: Request) -> JSONResponse:
    """Infinity's path: its ModelInfo schema allows one owner, "infinity", and its client enforces it."""
    return JSONResponse(model_list(request, "infinity"))


def model_list(request: Request, owner: str) -> dict[str, object]:
    svc = services(request)
    cards = []
    for name in svc.configured or list(svc.models):
        card: dict[str, object] = {"id": name, "object": "model", "created": _CREATED, "owned_by": owner}
        model = svc.models.get(name)
        queued = model.engine.queued_inputs if model else 0
        stats = {"queue_absolute": queued, "batch_size": svc.settings.max_batch_size}
        if svc.cache is not None:  # the process's result cache, shared by its models: in its memory too
            stats["cache_bytes"] = svc.cache.lru.bytes
        card |= {"backend": "warmpool", "stats": stats}
        if svc.loader is not None and name in svc.configured:  # state, resident, memory_bytes, last_used
            card |= svc.loader.describe(name)
        if model is None:
            failed = svc.startup.for_model(name).failed
            state = card.get("state") if card.get("state") not in (None, "ready") else None
            cards.append({**card, "state": state or ("failed" if failed else "starting"), "capabilities": []})
            continue
        folder = model.folder
        kind = kinds.KINDS[folder.output]
        served = {
            **card,
            "state": "ready",
            "root": str(folder.path),
            "kind": folder.kind,
            "max_model_len": folder.max_model_len,
            "dimensions": folder.dimensions,
            "capabilities": list(kind.capabilities),
            "input_modalities": input_modalities(folder),
            **kind.card(folder, svc.settings),
        }
        cards.append(served)
        # each LoRA adapter as vLLM lists its LoRA modules: its own id and root, its base as `parent`
        if model.adapters is not None:
            cards += [
                {**served, "id": a.name, "root": str(a.folder), "parent": name, **a.card(), **refusals(model, a.name)}
                for a in model.adapters.entries.values()
            ]
    tenant = getattr(request.state, "tenant", None)
    if tenant is not None and tenant.models is not None:  # a tenant sees the models it may use
        cards = [card for card in cards if card["id"] in tenant.models]
    return {"object": "list", "data": cards}


def refusals(model: ServedModel, adapter: str) -> dict[str, object]:
    """An adapter some engines refused (its folder gone before they were re-forked): how many, and
    `unavailable` once every engine taking work has (its requests are then answered 503)."""
    refused = len(model.engine.adapters.refused(adapter))
    if not refused:
        return {}
    return {"engines_refused": refused} | ({"state": "unavailable"} if refused >= model.engine.attached else {})


@router.post("/admin/models/{name}/load")
async def load_model(name: str, request: Request) -> JSONResponse:
    """Load a configured model now (Triton's explicit control): idempotent, answered once it serves
    (503 past WARMPOOL_LOAD_WAIT, while it goes on loading); a failed model is tried again."""
    svc = _loader_of(request, name)
    assert svc.loader is not None
    await svc.loader.until_loaded(name, retry=True)
    return JSONResponse({"id": name, **svc.loader.describe(name)})


@router.post("/admin/models/{name}/unload")
async def unload_model(name: str, request: Request) -> JSONResponse:
    """Unload a resident=auto model once its in-flight requests have finished: idempotent; 409 for a
    resident=always model and for the last model loaded."""
    svc = _loader_of(request, name)
    assert svc.loader is not None
    await svc.loader.unload(name)
    return JSONResponse({"id": name, **svc.loader.describe(name)})


def _loader_of(request: Request, name: str) -> Services:
    svc = services(request)
    if svc.loader is None or name not in svc.configured:
        served = ", ".join(f"'{n}'" for n in svc.configured)
        raise APIError(404, f"model '{name}' does not exist; this server serves {served}", code="model_not_found")
    return svc


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": metadata.version("warmpool")})
