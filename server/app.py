"""FastAPI factory: routes, error handlers, middleware. Imports no torch."""

from __future__ import annotations

from importlib import metadata

from fastapi import FastAPI

from server import errors
from server.middleware import RequestTracking
from server.routes import embeddings, health, models
from server.runtime import Runtime


def create_app(rt: Runtime) -> FastAPI:
    app = FastAPI(
        title="warmpool",
        version=metadata.version("warmpool"),
        description="Pooling models (embeddings, classification, scoring) over an OpenAI/vLLM API.",
    )
    app.state.runtime = rt
    errors.install(app)
    for module in (health, models, embeddings):
        app.include_router(module.router)
    return app


def with_middleware(app: FastAPI) -> RequestTracking:
    """The ASGI app uvicorn serves."""
    return RequestTracking(app, app.state.runtime)
