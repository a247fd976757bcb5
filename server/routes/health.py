"""Probes: answer from the first second, from the phase table alone (no engine round trip)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server.core.cached_run import cache_stats
from server.core.services import services

router = APIRouter(tags=["health"])


@router.get("/health/live")
async def live() -> JSONResponse:
    """The process and its event loop are alive."""
    return JSONResponse({"status": "alive"})


@router.get("/health/startup")
async def startup(request: Request) -> JSONResponse:
    """503 while starting or failed, 200 once ready; always the phase table."""
    svc = services(request)
    body = {
        **svc.startup.snapshot(),
        "in_flight": svc.in_flight - 1,
        "cache": cache_stats(svc.cache),
    }  # less this probe
    body["batch"] = svc.batches.progress() if svc.batches is not None else None  # the running Batch API job
    return JSONResponse(body, status_code=200 if svc.startup.started else 503)


@router.get("/health/ready")
async def ready(request: Request) -> JSONResponse:
    """200 only while every model can serve and the server is not draining; `?model=NAME` asks
    for one model (404 for a name not configured)."""
    svc = services(request)
    startup = svc.startup
    name = request.query_params.get("model")
    if name is None:
        ok = svc.ready()
    elif name in svc.configured or (not svc.configured and name in svc.models):
        phases = startup.for_model(name)
        ok = name in svc.models and phases.engine_up and not startup.draining and not startup.failed
    else:
        return JSONResponse({"status": "unknown model", "models": svc.configured}, status_code=404)
    if ok:
        return JSONResponse({"status": "ready"})
    return JSONResponse(startup.snapshot(), status_code=503, headers={"Retry-After": "1"})


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """What vLLM and TEI clients poll: the readiness answer."""
    return await ready(request)


@router.get("/ping")
async def ping(request: Request) -> JSONResponse:
    """SageMaker's health check: the readiness answer, open without the API key."""
    return await ready(request)
