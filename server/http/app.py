"""FastAPI factory: routes, error handlers, middleware. Imports no torch."""

from __future__ import annotations

from importlib import metadata

from fastapi import FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from common.settings import Settings
from server.batches.runner import BatchRunner
from server.core.services import Services
from server.http import errors
from server.http.direct import DirectRoutes
from server.http.middleware import BodyLimit, RequestTracking, is_open
from server.routes import (
    adapters,
    batches,
    classify,
    cohere,
    embeddings,
    files,
    health,
    metrics,
    models,
    score,
    sparse,
    status_page,
    tei,
    tokenize,
    vertex,
)
from server.tenants.guard import TenantGuard, key_source
from server.tenants.watcher import KeysWatcher


def create_app(svc: Services) -> FastAPI:
    app = FastAPI(
        title="warmpool",
        version=metadata.version("warmpool"),
        description="Pooling models (embeddings, classification, scoring) over OpenAI, vLLM, TEI and Cohere APIs.",
    )
    app.state.services = svc
    svc.batches = BatchRunner(svc)
    errors.install(app)
    modules = (
        health,
        metrics,
        models,
        adapters,
        embeddings,
        classify,
        score,
        tokenize,
        tei,
        sparse,
        cohere,
        files,
        batches,
        status_page,
    )
    for module in modules:
        app.include_router(module.router)
    app.state.api_routes = [route for module in modules for route in module.router.routes]
    app.state.api_routes += platform_routes(app, svc.settings)
    # The paths metrics label requests with; anything else is "other", so labels stay bounded.
    app.state.route_paths = {getattr(r, "path", "") for r in app.state.api_routes}
    return app


def platform_routes(app: FastAPI, settings: Settings) -> list[BaseRoute]:
    """The routes a platform names at start (Vertex AI's health and predict routes)."""
    before = len(app.router.routes)
    if settings.health_route:
        app.add_api_route(settings.health_route, health.ready, methods=["GET"], tags=["health"])
    if settings.predict_route:
        app.add_api_route(
            settings.predict_route, vertex.predict, methods=["POST"], tags=["vertex"], openapi_extra=vertex.OPENAPI
        )
    return app.router.routes[before:]


def probe_paths(settings: Settings) -> tuple[str, ...]:
    return tuple(path for path in ("/ping", settings.health_route) if path)


def with_middleware(app: FastAPI) -> ASGIApp:
    """The ASGI app uvicorn serves: tracking outermost, then the key check (with a key or a keys file
    configured), then the body limit."""
    svc: Services = app.state.services
    inner: ASGIApp = BodyLimit(DirectRoutes(app, app.state.api_routes), svc)
    probes = probe_paths(svc.settings)
    keys = key_source(svc.settings)
    if keys is not None:
        svc.keys = keys if isinstance(keys, KeysWatcher) else None
        svc.key_source = keys  # gRPC's calls check keys with it too
        inner = TenantGuard(inner, keys, svc.metrics, lambda path, method: is_open(path, method, probes))
    return RequestTracking(inner, svc, app.state.route_paths, probes)
