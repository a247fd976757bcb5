"""Every error leaves in the OpenAI shape {"error": {message, type, param, code}}, worded for a person."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from structlog.testing import capture_logs

from server.http.errors import APIError, ClientDisconnected, from_validation, response_for
from server.protocols.openai import DetokenizeRequest, EmbeddingRequest, ScoreRequest
from server.protocols.tei import TEIPredictRequest


def validation_error(model: type[BaseModel], body: str) -> ValidationError:
    """The ValidationError pydantic raises for `body` as `model`'s JSON."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(body)
    return caught.value


def error_of(response: JSONResponse) -> dict[str, Any]:
    """The "error" object of a response body, checked to have exactly the OpenAI keys."""
    body = json.loads(bytes(response.body))
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


# Request validation (pydantic) -> 400


def test_a_wrong_input_type_is_a_400_invalid_request_error() -> None:
    """A body pydantic rejects is a 400 of type invalid_request_error, never FastAPI's 422."""
    response = response_for(validation_error(EmbeddingRequest, '{"input": 5}'))
    assert response.status_code == 400
    assert error_of(response)["type"] == "invalid_request_error"


def test_a_wrong_input_type_names_the_field_and_the_shapes_allowed() -> None:
    """`param` is the field; the message says what the field may be."""
    error = error_of(response_for(validation_error(EmbeddingRequest, '{"input": 5}')))
    assert error["param"] == "input"
    assert "'input'" in error["message"] and "must be a string" in error["message"]


def test_pydantics_value_error_prefix_is_dropped() -> None:
    """A validator's message reaches the client without pydantic's "Value error, " in front."""
    error = error_of(response_for(validation_error(EmbeddingRequest, '{"input": 5}')))
    assert "Value error" not in error["message"]


def test_a_missing_field_is_named_as_missing() -> None:
    """An absent required field: param is the field and the message says it is missing."""
    error = error_of(response_for(validation_error(EmbeddingRequest, "{}")))
    assert error["param"] == "input"
    assert error["message"] == "missing required field 'input'"


def test_malformed_json_is_a_400_saying_so_without_a_param() -> None:
    """A body that is not JSON is reported as malformed JSON, with pydantic's parser detail and no field."""
    response = response_for(validation_error(EmbeddingRequest, '{"input": '))
    error = error_of(response)
    assert response.status_code == 400
    assert error["message"].startswith("malformed JSON: ")
    assert error["param"] is None


def test_a_value_outside_a_literal_names_the_allowed_values() -> None:
    """encoding_format "int4" is refused naming the field and the values it takes."""
    error = error_of(response_for(validation_error(EmbeddingRequest, '{"input": "x", "encoding_format": "int4"}')))
    assert error["param"] == "encoding_format"
    assert "'float', 'base64', 'int8', 'uint8', 'binary', 'ubinary', 'bytes' or 'bytes_only'" in error["message"]


def test_a_number_below_its_minimum_names_the_field_and_the_bound() -> None:
    """dimensions=0 is refused as below 1, naming the field."""
    error = error_of(response_for(validation_error(EmbeddingRequest, '{"input": "x", "dimensions": 0}')))
    assert error["param"] == "dimensions"
    assert "invalid value for 'dimensions'" in error["message"] and "1" in error["message"]


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        (TEIPredictRequest, '{"inputs": [[1]]}', "inputs"),
        (ScoreRequest, '{"text_1": 1, "text_2": "a"}', "text_1"),
    ],
    ids=["nested-list-union", "str-or-list-union"],
)
def test_union_member_tags_are_kept_out_of_param(model: type[BaseModel], body: str, param: str) -> None:
    """pydantic adds the union member's type ("str", "list[...]") to the path; param is the field alone."""
    error = error_of(response_for(validation_error(model, body)))
    assert error["param"] == param
    assert f"'{param}'" in error["message"]


def test_a_list_index_stays_in_param() -> None:
    """A bad element of a list is named with its index: tokens.0."""
    error = error_of(response_for(validation_error(DetokenizeRequest, '{"tokens": ["a"]}')))
    assert error["param"] == "tokens.0"


def test_a_body_that_is_not_an_object_is_refused_without_a_param() -> None:
    """A JSON list as the body names no field; the message says what the body should be."""
    error = error_of(response_for(validation_error(EmbeddingRequest, "[1]")))
    assert error["param"] is None
    assert error["message"] == "invalid request body: Input should be an object"


def test_fastapis_body_prefix_is_dropped_from_param() -> None:
    """FastAPI locates body fields as ("body", field); the client sees the field alone."""
    exc = RequestValidationError([{"type": "missing", "loc": ("body", "input"), "msg": "Field required"}])
    response = response_for(exc)
    assert response.status_code == 400
    assert error_of(response)["param"] == "input"


def test_from_validation_without_errors_is_a_generic_400() -> None:
    """An empty error list still answers a 400 with a readable message."""
    exc = from_validation([])
    assert (exc.status, exc.message, exc.param) == (400, "invalid request body", None)


# APIError -> its status and OpenAI type


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (503, "service_unavailable"),
    ],
)
def test_an_api_error_answers_its_status_with_the_openai_type(status: int, kind: str) -> None:
    """The HTTP status is kept and mapped to the `type` OpenAI clients switch on."""
    response = response_for(APIError(status, "nope"))
    assert response.status_code == status
    assert error_of(response)["type"] == kind


def test_an_api_error_keeps_its_message_param_and_code() -> None:
    """What the route said about the problem reaches the client unchanged."""
    error = error_of(response_for(APIError(404, "model 'gpt-4' does not exist", param="model", code="model_not_found")))
    assert error == {
        "message": "model 'gpt-4' does not exist",
        "type": "not_found_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_an_api_error_keeps_its_headers() -> None:
    """A 429's Retry-After header goes out with the answer."""
    response = response_for(APIError(429, "overloaded", code="overloaded", headers={"Retry-After": "1"}))
    assert response.headers["retry-after"] == "1"


def test_a_starlette_http_exception_keeps_its_status_and_headers() -> None:
    """Starlette's own errors (405 with Allow) answer in the OpenAI shape, headers kept."""
    response = response_for(StarletteHTTPException(405, headers={"Allow": "POST"}))
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert error_of(response)["message"] == "Method Not Allowed"


# Disconnects and the unexpected


def test_a_client_disconnect_is_a_499() -> None:
    """A client that left is marked 499 (nginx's "client closed request"), with its own code."""
    response = response_for(ClientDisconnected())
    assert response.status_code == 499
    assert error_of(response)["code"] == "client_disconnected"


def test_an_upload_aborted_by_the_client_is_a_499() -> None:
    """Starlette's ClientDisconnect (the body stopped arriving) is a client leaving too, not a server error."""
    with capture_logs() as logs:
        response = response_for(ClientDisconnect())
    assert response.status_code == 499
    assert logs == []


def test_an_unexpected_exception_is_a_500_internal_error() -> None:
    """A bug answers 500 "internal error", never the exception's text (which may hold internals)."""
    with capture_logs():
        response = response_for(RuntimeError("secret path /srv/x"))
    error = error_of(response)
    assert response.status_code == 500
    assert (error["message"], error["type"]) == ("internal error", "internal_server_error")
    assert b"secret" not in bytes(response.body)


def test_an_unexpected_exception_is_logged_as_unhandled_error() -> None:
    """The 500 is logged once at error level, with the exception, so the bug can be found."""
    exc = RuntimeError("boom")
    with capture_logs() as logs:
        response_for(exc)
    assert len(logs) == 1
    entry = logs[0]
    assert (entry["event"], entry["log_level"]) == ("unhandled_error", "error")
    assert entry["error"] == "boom"
    assert entry["exc_info"] is exc


def test_expected_errors_are_not_logged_as_unhandled() -> None:
    """APIError, validation errors and disconnects are answers, not bugs: nothing is logged."""
    with capture_logs() as logs:
        response_for(APIError(404, "nope"))
        response_for(validation_error(EmbeddingRequest, "{}"))
        response_for(ClientDisconnected())
    assert logs == []
