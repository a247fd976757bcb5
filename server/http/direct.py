"""Routes whose endpoint needs nothing but the Request are called straight from the ASGI scope.

Every pooling route parses and validates its own body on the executor, so FastAPI's router,
dependency solver and its exception and exit-stack middleware do no work for them, yet cost
~0.3 ms of CPU a request: on 2 cores that CPU comes out of the engines' share. FastAPI still
serves everything else (404, 405, /docs, /openapi.json) and its schema still lists these routes.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from server.http import errors

Endpoint = Callable[[Request], Awaitable[Response]]


class DirectRoutes:
    def __init__(self, app: FastAPI, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.table: dict[tuple[str, str], Endpoint] = {}
        for route in routes:
            endpoint = _direct(route)
            if endpoint is not None:
                for method in route.methods:  # type: ignore[attr-defined]
                    self.table[(method, route.path)] = endpoint  # type: ignore[attr-defined]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = None
        if scope["type"] == "http" and not scope.get("root_path"):
            endpoint = self.table.get((scope["method"], scope["path"]))
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        try:
            response = await endpoint(Request(scope, receive, send))
        except Exception as exc:
            response = errors.response_for(exc)
        await response(scope, receive, send)


def _direct(route: Any) -> Endpoint | None:
    """The endpoint as a `request -> Response` call, if it takes at most the Request, returns a
    Response itself and has no dependencies; None for any route FastAPI must run."""
    if not isinstance(route, APIRoute) or route.dependencies:
        return None
    endpoint = route.endpoint
    hints = typing.get_type_hints(endpoint)
    returns = hints.pop("return", None)
    if not (inspect.isclass(returns) and issubclass(returns, Response)):
        return None
    params = list(inspect.signature(endpoint).parameters)
    if not params:
        return lambda request: endpoint()  # type: ignore[no-any-return]
    if len(params) == 1 and hints.get(params[0]) is Request:
        return endpoint  # type: ignore[no-any-return]
    return None
