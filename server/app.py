"""FastAPI factory: routes, error handlers, middleware. Imports no torch."""

from __future__ import annotations

from importlib import metadata

from fastapi import FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from server import errors
from server.middleware import ApiKeyGuard, BodyLimit, RequestTracking
from server.routes import classify, embeddings, health, metrics, models, score, tokenize
from server.runtime import Runtime


def create_app(rt: Runtime) -> FastAPI:
    app = FastAPI(
        title="warmpool",
        version=metadata.version("warmpool"),
        description="Pooling models (embeddings, classification, scoring) over an OpenAI/vLLM API.",
    )
    app.state.runtime = rt
    errors.install(app)
    for module in (health, metrics, models, embeddings, classify, score, tokenize):
        app.include_router(module.router)
    return app


def with_middleware(app: FastAPI) -> ASGIApp:
    """The ASGI app uvicorn serves: tracking outermost, then the API key, then the body limit."""
    rt: Runtime = app.state.runtime
    key = rt.settings.resolved_api_key()
    inner: ASGIApp = BodyLimit(app, rt)
    if key:
        inner = ApiKeyGuard(inner, key)
    routes = {route.path for route in app.routes if isinstance(route, BaseRoute) and hasattr(route, "path")}
    return RequestTracking(inner, rt, routes)
