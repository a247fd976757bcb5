"""FastAPI factory: routes, error handlers, middleware. Imports no torch."""

from __future__ import annotations

from importlib import metadata

from fastapi import FastAPI
from starlette.types import ASGIApp

from server import errors
from server.middleware import ApiKeyGuard, RequestTracking
from server.routes import classify, embeddings, health, models, score, tokenize
from server.runtime import Runtime


def create_app(rt: Runtime) -> FastAPI:
    app = FastAPI(
        title="warmpool",
        version=metadata.version("warmpool"),
        description="Pooling models (embeddings, classification, scoring) over an OpenAI/vLLM API.",
    )
    app.state.runtime = rt
    errors.install(app)
    for module in (health, models, embeddings, classify, score, tokenize):
        app.include_router(module.router)
    return app


def with_middleware(app: FastAPI) -> ASGIApp:
    """The ASGI app uvicorn serves: request tracking outermost, then the optional API key."""
    rt: Runtime = app.state.runtime
    key = rt.settings.resolved_api_key()
    inner: ASGIApp = ApiKeyGuard(app, key) if key else app
    return RequestTracking(inner, rt)
