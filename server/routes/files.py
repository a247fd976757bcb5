"""OpenAI's Files API, for the Batch API's input and output files: POST/GET /v1/files, GET and
DELETE /v1/files/{id}, GET /v1/files/{id}/content. Stored in WARMPOOL_BATCH_DIR (server/batches/store.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from server.batches.runner import BatchRunner
from server.batches.space import NoRoom
from server.batches.store import Owner
from server.batches.upload import FileForm, FormError, NotAForm
from server.core.pipeline import receive_body
from server.core.services import services
from server.http.errors import APIError, bad_request

router = APIRouter(tags=["batches"])
PURPOSES = ("batch",)  # what may be uploaded; outputs are `batch_output`
LIST_LIMIT = 10000


def runner(request: Request) -> BatchRunner:
    svc = services(request)
    assert svc.batches is not None
    if not svc.startup.draining:  # the drain stopped it: jobs resume at the next start
        svc.batches.start()
    return svc.batches


async def in_store(request: Request, fn: Any, *args: Any) -> Any:
    """A store call on the executor; an unusable batch folder is a 503 with the reason."""
    try:
        return await services(request).off_loop(fn, *args)
    except OSError as exc:
        raise unusable(exc) from None


def unusable(exc: OSError) -> APIError:
    return APIError(503, f"the batch folder is not usable: {exc}", code="batch_dir_unusable")


def owner(request: Request) -> Owner:
    """The request's tenant, whose files and batches alone it sees (another's are 404s)."""
    tenant = getattr(request.state, "tenant", None)
    return Owner(tenant.name if tenant is not None else None)


async def found(request: Request, lookup: Any, key: str, what: str) -> dict[str, Any]:
    """The request's tenant's file or batch record from the store, or OpenAI's 404 naming it."""
    record = await in_store(request, lookup, key, owner(request))
    if record is None:
        raise APIError(404, f"no {what} '{key}'", param=f"{what}_id", code=f"{what}_not_found")
    return dict(record)


async def received_form(request: Request, form: FileForm) -> None:
    """The body fed to `form` chunk by chunk as it arrives (each on the executor), never held whole."""
    svc = services(request)
    async for chunk in request.stream():
        if chunk:
            await svc.off_loop(form.feed, chunk)


@router.post("/v1/files")
async def create_file(request: Request) -> JSONResponse:
    svc = services(request)
    store = runner(request).store
    limit = svc.settings.batch_max_file_bytes
    try:
        form = FileForm(request.headers.get("content-type", ""), lambda: store.incoming(limit))
    except NotAForm as exc:
        raise APIError(415, str(exc), code="unsupported_media_type") from None
    except FormError as exc:
        raise bad_request(str(exc), exc.param) from None
    try:
        try:
            await receive_body(svc, received_form(request, form))
            filename, purpose = form.completed()
        except FormError as exc:
            raise bad_request(str(exc), exc.param) from None
        except NoRoom as exc:  # the file's or the folder's bound: nothing past it was written
            raise APIError(413, str(exc), param="file", code=exc.code) from None
        except OSError as exc:
            raise unusable(exc) from None
        if purpose not in PURPOSES:
            raise bad_request(f"'purpose' must be one of {', '.join(PURPOSES)}", "purpose")
        assert form.file is not None
        record = await in_store(request, form.file.commit, (filename or "upload.jsonl")[:256], "batch", owner(request))
    except BaseException:
        await svc.off_loop(form.discard)  # runs to its end on the executor even if this task is cancelled
        raise
    return JSONResponse(record)


async def _file(request: Request, file_id: str) -> dict[str, Any]:
    return await found(request, runner(request).store.file, file_id, "file")


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _file(request, file_id))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    await _file(request, file_id)
    return FileResponse(runner(request).store.file_path(file_id), media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> JSONResponse:
    await _file(request, file_id)
    await in_store(request, runner(request).store.delete_file, file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


@router.get("/v1/files")
async def list_files(request: Request, after: str | None = None, limit: int = LIST_LIMIT) -> Response:
    return await listed(request, runner(request).store.files, after, max(1, min(limit, LIST_LIMIT)))


async def listed(
    request: Request, records: Callable[[str | None, int, Owner], list[dict[str, Any]]], after: str | None, limit: int
) -> Response:
    """OpenAI's cursor page of the tenant's `records` (up to limit + 1: the one past the page says
    has_more), read and rendered on the executor (a page may hold thousands)."""
    whose = owner(request)

    def page() -> bytes:
        found = records(after, limit, whose)
        data = found[:limit]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        return orjson.dumps(
            {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": len(found) > limit}
        )

    return Response(await in_store(request, page), media_type="application/json")
