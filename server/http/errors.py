"""Every error leaves in the shape its surface documents, which clients parse: OpenAI's
{"error": {message, type, param, code}} by default; TEI's {"error": message, "error_type": ...}
and Cohere's {"id", "message"} for requests made in those surfaces' shapes."""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from server.core.ids import random_uuid

log = structlog.get_logger("warmpool.errors")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


# TEI's error_type per status (its ErrorType enum): clients branch on it.
_TEI_TYPES = {429: "overloaded", 503: "unhealthy", 500: "backend", 408: "backend"}

Shape = Literal["openai", "tei", "cohere"]


class ClientDisconnected(Exception):
    """The client left before its answer; its queued inputs were cancelled."""


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}
        self.shape: Shape = "openai"  # the surface whose error body the client reads


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def field_of(where: str) -> str:
    """The request's field an input's name is in (an error's `param`): `input` of `input[2]`, `text_2`
    of `text_2.content[0]`."""
    return where.split("[")[0].split(".")[0]


def error_response(exc: APIError) -> Response:
    if exc.status == 429 and exc.param is None and not exc.extra and exc.shape != "cohere":
        # a flood's refusals: the same few bodies (the overload's, a tenant's quotas), encoded once
        body_bytes = _refusal_body(exc.shape, exc.message, exc.code)
        return Response(body_bytes, status_code=429, headers=exc.headers, media_type="application/json")
    return JSONResponse(_body(exc), status_code=exc.status, headers=exc.headers)


@functools.lru_cache(maxsize=64)  # bounded: the 429s' messages name a limit or a tenant, never the input
def _refusal_body(shape: Shape, message: str, code: str | None) -> bytes:
    exc = APIError(429, message, code=code)
    exc.shape = shape
    return bytes(JSONResponse(_body(exc)).body)


def _body(exc: APIError) -> dict[str, Any]:
    if exc.shape == "tei":
        return {"error": exc.message, "error_type": _TEI_TYPES.get(exc.status, "validation")}
    if exc.shape == "cohere":
        return {"id": random_uuid(), "message": exc.message}
    return openai_body(exc)


def openai_body(exc: APIError) -> dict[str, Any]:
    return {
        "error": {
            "message": exc.message,
            "type": _TYPES.get(exc.status, "invalid_request_error"),
            "param": exc.param,
            "code": exc.code if exc.code is not None else exc.status,
            **exc.extra,
        }
    }


def from_validation(errors: list[Any]) -> APIError:
    """The first problem pydantic found, worded for a person, with the field it names as param."""
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
    # Union members add their type name to the path; keep the field path only.
    loc = [p for p in loc if not any(ch in p for ch in "[]") and p not in _UNION_TAGS]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return bad_request(f"malformed JSON: {first.get('ctx', {}).get('error', first.get('msg'))}")
    if first.get("type") == "missing":
        return bad_request(f"missing required field '{param}'", param)
    message = str(first.get("msg", "")).removeprefix("Value error, ")
    if param is None:
        return bad_request(f"invalid request body: {message}")
    return bad_request(f"invalid value for '{param}': {message}", param)


_UNION_TAGS = {"str", "int", "list", "float", "bool", "dict", "function-after"}


def response_for(exc: Exception) -> Response:
    """The OpenAI-shaped answer to any exception a route raised: FastAPI's handlers and the direct
    routes (server.http.direct) both answer through this one function."""
    return error_response(api_error(exc))


def api_error(exc: Exception) -> APIError:
    """Any exception a request raised as the APIError it is answered with (HTTP's and gRPC's)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestValidationError | ValidationError):
        return from_validation(list(exc.errors()))
    if isinstance(exc, StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return APIError(exc.status_code, detail, headers=dict(exc.headers or {}))
    if isinstance(exc, ClientDisconnected | ClientDisconnect):
        # Waiting for the engine or still uploading: either way nobody reads this answer; 499
        # (nginx's "client closed request") marks it in logs and metrics, never as a server error.
        return APIError(499, "client closed the request", code="client_disconnected")
    log.exception("unhandled_error", error=str(exc), exc_info=exc)
    return APIError(500, "internal error", code="internal_error")


def install(app: FastAPI) -> None:
    async def handler(_: Request, exc: Exception) -> Response:
        return response_for(exc)

    # Exception is handled by Starlette's outermost middleware; the others by its inner one.
    kinds = (
        APIError,
        RequestValidationError,
        ValidationError,
        StarletteHTTPException,
        ClientDisconnected,
        ClientDisconnect,
        Exception,
    )
    for kind in kinds:
        app.add_exception_handler(kind, handler)
