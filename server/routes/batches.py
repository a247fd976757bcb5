"""OpenAI's Batch API: POST /v1/batches, GET /v1/batches/{id}, GET /v1/batches, POST
/v1/batches/{id}/cancel. Jobs run in this process (server/batches/runner.py)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.batches import lines
from server.batches.endpoints import ENDPOINTS
from server.batches.states import StateError
from server.batches.store import BatchStore, Owner, new_id, usage
from server.core import inputs
from server.core.inputs import require_kind
from server.core.pipeline import read_body
from server.core.services import Services, services
from server.http.errors import APIError, bad_request
from server.protocols.batches import BatchRequest
from server.protocols.openai import openapi_body
from server.routes.files import found, in_store, listed, owner, runner

router = APIRouter(tags=["batches"])
WINDOW_S = 24 * 3600  # completion_window "24h": a job still running past it expires
LIST_LIMIT_BATCHES = 100  # OpenAI's bound on a page of batches
Allowed = frozenset[str] | None  # the models a tenant may use (None: every model)


def checked_batch(svc: Services, store: BatchStore, raw: bytes, whose: Owner, allowed: Allowed) -> dict[str, Any]:
    """The new job's record; 400 for an input file that is missing (or another tenant's), not JSONL,
    or whose lines name an endpoint or a model this server does not serve (or the tenant may not use)."""
    body = inputs.parse(BatchRequest, raw)
    if body.endpoint not in ENDPOINTS:
        raise bad_request(f"'endpoint' must be one of {', '.join(ENDPOINTS)}", "endpoint")
    source = store.file(body.input_file_id, whose)
    if source is None or source["purpose"] != "batch":
        raise bad_request(f"no batch input file '{body.input_file_id}'", "input_file_id")
    found = lines.scan(store.file_path(body.input_file_id))
    if found.objects == 0:
        raise bad_request("the input file is not JSONL: no line is a JSON object", "input_file_id")
    names: set[str | None] = set()
    for model in found.models:
        served = svc.models.get(model) if model is not None else svc.default_model()
        name = model if model is not None else served.name if served is not None else None
        names.add(name)
        refused = allowed is not None and name is not None and name not in allowed
        if refused or (model is not None and model not in svc.configured and served is None):
            raise bad_request(
                f"the input file names model '{model}', which this server does not serve", "input_file_id"
            )
        kinds = ENDPOINTS[body.endpoint].kinds
        if served is not None and kinds:
            try:
                require_kind(served.folder, body.endpoint, *kinds)
            except APIError as exc:
                raise bad_request(exc.message, "endpoint") from None
    now = int(time.time())
    return {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": body.endpoint,
        "errors": None,
        "input_file_id": body.input_file_id,
        "completion_window": body.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "expires_at": now + WINDOW_S,
        "request_counts": {"total": found.total, "completed": 0, "failed": 0},
        "metadata": body.metadata,
        "model": names.pop() if len(names) == 1 else None,  # lines naming several models: none
        "usage": usage(None, 0),
    }


def created(svc: Services, store: BatchStore, raw: bytes, whose: Owner, allowed: Allowed) -> dict[str, Any]:
    record = checked_batch(svc, store, raw, whose, allowed)
    store.add_batch(record, whose)
    return record


@router.post("/v1/batches", openapi_extra=openapi_body(BatchRequest))
async def create_batch(request: Request) -> JSONResponse:
    svc = services(request)
    batches = runner(request)
    raw = await read_body(request, svc)
    tenant = getattr(request.state, "tenant", None)
    allowed = tenant.models if tenant is not None else None
    record = await in_store(request, created, svc, batches.store, raw, owner(request), allowed)
    batches.wake()
    return JSONResponse(record)


async def _batch(request: Request, batch_id: str) -> dict[str, Any]:
    return await found(request, runner(request).store.batch, batch_id, "batch")


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _batch(request, batch_id))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> JSONResponse:
    await _batch(request, batch_id)
    batches = runner(request)
    try:
        record = await in_store(request, batches.store.move, batch_id, "cancelling")
    except StateError as exc:
        raise APIError(409, str(exc), param="batch_id", code="batch_not_cancellable") from None
    batches.cancel(batch_id)
    return JSONResponse(record)


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> Response:
    return await listed(request, runner(request).store.batches, after, max(1, min(limit, LIST_LIMIT_BATCHES)))
