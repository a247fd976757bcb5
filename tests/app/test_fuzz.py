"""schemathesis against the server's own /openapi.json: no 5xx, every error in the shape of its
route's surface (TEI's and Cohere's routes in theirs, every other in OpenAI's).

Cases come from each operation's hypothesis strategies, valid and invalid (bounded, derandomised),
so the run is the same every time and fits in CI. Requests reach the in-process app through a
requests adapter over its TestClient (schemathesis's own ASGI client runs the app on an event loop
of its own, which the engine client's futures do not belong to).
"""

from __future__ import annotations

import io

import requests
import schemathesis
import urllib3
from hypothesis import HealthCheck, given, settings
from requests.adapters import BaseAdapter

from tests.server_process import Served

EXAMPLES_PER_OPERATION = 20


TEI_ROUTES = {
    "/",
    "/invocations",
    "/info",
    "/embed",
    "/embed_all",
    "/embed_sparse",
    "/predict",
    "/similarity",
    "/decode",
}
COHERE_ROUTES = {"/v1/embed", "/v2/embed", "/v2/rerank"}
# Routes shared by two surfaces answer in the shape the body speaks: TEI's (`texts`, `inputs`) or the other.
SHARED = {"/rerank": "texts", "/v1/rerank": "texts", "/tokenize": "inputs"}


def tei_shaped(case: schemathesis.Case) -> bool:
    if case.path in TEI_ROUTES:
        return True
    body = case.body if isinstance(case.body, dict) else {}
    return case.path in SHARED and SHARED[case.path] in body and not ({"documents", "prompt"} & set(body))


def surface_shaped(case: schemathesis.Case, body: dict) -> bool:  # type: ignore[type-arg]
    if tei_shaped(case):
        return isinstance(body.get("error"), str) and bool(body["error"]) and bool(body.get("error_type"))
    if case.path in COHERE_ROUTES:
        return isinstance(body.get("message"), str) and bool(body["message"]) and bool(body.get("id"))
    return False


class AppAdapter(BaseAdapter):
    """A requests transport that sends each request through the app's httpx client."""

    def __init__(self, app: Served) -> None:
        super().__init__()
        self.app = app

    def send(self, request: requests.PreparedRequest, **kwargs: object) -> requests.Response:  # type: ignore[override]
        assert request.method is not None and request.url is not None
        got = self.app.client.request(request.method, request.url, headers=dict(request.headers), content=request.body)
        response = requests.Response()
        response.status_code, response.reason, response.url = got.status_code, got.reason_phrase, request.url
        response.headers.update(got.headers)
        response.encoding, response.request = got.encoding, request
        response.raw = urllib3.HTTPResponse(
            io.BytesIO(got.content), headers=list(got.headers.multi_items()), status=got.status_code, version=11
        )
        response._content = got.content
        return response

    def close(self) -> None:
        pass


def check(case: schemathesis.Case, session: requests.Session) -> None:
    response = case.call(session=session, timeout=60)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text}"
    if response.status_code < 400:
        return
    body = response.json()
    # the middleware's refusals (key, method, size) come before any route, in OpenAI's shape
    before_routes = response.status_code in (401, 405, 413) and not surface_shaped(case, body)
    if (tei_shaped(case) or case.path in COHERE_ROUTES) and not before_routes:
        assert surface_shaped(case, body), response.text
        return
    assert {"message", "type", "param", "code"} <= set(body["error"]), response.text
    assert body["error"]["message"], response.text


def test_api_never_fails_and_errors_are_openai_shaped(server: Served) -> None:
    session = requests.Session()
    session.mount(server.url, AppAdapter(server))
    schema = schemathesis.openapi.from_dict(server.get("/openapi.json").json())
    schema.config.update(base_url=server.url)

    def checked(case: schemathesis.Case) -> None:
        check(case, session)

    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    # Invalid cases only where there is a body to break: a GET without parameters has none, nor
    # the admin API's POSTs (a model's name in the path, any string).
    runs = [(op, mode) for op in operations for mode in modes if len(op.body) or mode == modes[0]]
    for operation, mode in runs:
        fuzz = settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(given(case=operation.as_strategy(generation_mode=mode))(checked))
        try:
            fuzz()
        except Exception as exc:
            raise AssertionError(f"{operation.method.upper()} {operation.path} ({mode.value})") from exc
