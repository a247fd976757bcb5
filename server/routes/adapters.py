"""LoRA adapters loaded and unloaded at run time (vLLM's /v1/load_lora_adapter, shaped as warmpool's own
/admin/models/{name}/load): behind the API key as every /admin route; folders only under WARMPOOL_ADAPTER_ROOT."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from server.core.adapters import AdapterSet
from server.core.services import ServedModel, Services, services
from server.http.errors import APIError, bad_request
from server.protocols.openai import openapi_body

router = APIRouter(tags=["adapters"])


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str  # the PEFT folder: relative to WARMPOOL_ADAPTER_ROOT, or absolute within it
    model: str | None = None  # the base model; the default model when unset


@router.post("/admin/adapters/{name}/load", openapi_extra=openapi_body(LoadAdapter))
async def load_adapter(name: str, request: Request) -> JSONResponse:
    """Load a PEFT LoRA adapter of a served model on every engine, answered once they serve it (or with
    the reason they refused it: another base, an option warmpool cannot compute exactly); idempotent."""
    svc = services(request)
    try:
        body = LoadAdapter.model_validate(orjson.loads(await request.body() or b"{}"))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise bad_request(f"the body is {{'path': FOLDER, 'model': BASE (optional)}}: {exc}") from None
    root = svc.settings.adapter_root
    if root is None:
        raise APIError(403, "run-time adapter loading is off: set WARMPOOL_ADAPTER_ROOT", code="adapters_disabled")
    model = _base(svc, body.model)
    if name in svc.configured or any(m.serves_adapter(name) for m in svc.models.values() if m is not model):
        raise APIError(409, f"'{name}' already names a model or another model's adapter", code="conflict")
    assert model.adapters is not None
    folder = under_root(Path(body.path), root)
    entry = await model.adapters.load(name, folder)
    return JSONResponse({"id": name, "parent": model.name, "root": str(folder), **entry.card()})


@router.post("/admin/adapters/{name}/unload")
async def unload_adapter(name: str, request: Request) -> JSONResponse:
    """Unload an adapter: new requests naming it get the 404 at once, those in flight finish first."""
    svc = services(request)
    adapters = next((m.adapters for m in svc.models.values() if m.serves_adapter(name)), None)
    if adapters is None:
        raise APIError(404, f"adapter '{name}' does not exist", code="model_not_found")
    await _unload(svc, adapters, name)
    return JSONResponse({"id": name, "state": "unloaded"})


async def _unload(svc: Services, adapters: AdapterSet, name: str) -> None:
    # its requests get their whole timeout to finish, the engines their load wait to answer
    deadline = asyncio.get_running_loop().time() + svc.settings.request_timeout
    await adapters.unload(name, deadline)


def _base(svc: Services, name: str | None) -> ServedModel:
    model = svc.models.get(name) if name is not None else svc.default_model()
    if model is None or model.adapters is None:
        served = ", ".join(f"'{n}'" for n in svc.models)
        raise APIError(404, f"model '{name}' is not serving; serving: {served}", param="model", code="model_not_found")
    return model


def under_root(path: Path, root: Path) -> Path:
    """The folder `path` names under `root` (relative to it, or absolute), symlinks resolved; 400 for `..`
    and 403, naming why, for a folder outside the root (absolute elsewhere, or a symlink leading out)."""
    if ".." in path.parts:
        raise APIError(400, f"path '{path}': '..' is not allowed", param="path", code="invalid_path")
    real_root = root.resolve()
    named = path if path.is_absolute() else root / path
    if not named.absolute().is_relative_to(root.absolute()) and not named.absolute().is_relative_to(real_root):
        raise APIError(
            403, f"path '{path}' is outside WARMPOOL_ADAPTER_ROOT ({root})", param="path", code="forbidden_path"
        )
    real = named.resolve()
    if not real.is_relative_to(real_root):
        raise APIError(
            403,
            f"path '{path}' leads outside WARMPOOL_ADAPTER_ROOT ({root}) through a symlink, to {real}",
            param="path",
            code="forbidden_path",
        )
    if not real.is_dir():
        raise APIError(
            400, f"path '{path}': no such folder under WARMPOOL_ADAPTER_ROOT", param="path", code="invalid_path"
        )
    return real
