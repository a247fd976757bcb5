"""The API key over real HTTP: anonymous requests are refused, the probes stay open, and the key
never reaches the server's log (a real process's log file: hence this layer)."""

from __future__ import annotations

from tests.app.test_errors import assert_openai_error
from tests.app.test_pooling_api import DOCS, QUERY
from tests.conftest import API_KEY
from tests.server_process import ServerProcess


def test_api_key(cross_encoder_server: ServerProcess) -> None:
    import httpx

    body = {"text_1": QUERY, "text_2": DOCS[0]}
    with httpx.Client(base_url=cross_encoder_server.url) as anonymous:
        assert_openai_error(anonymous.post("/score", json=body), 401, "API key")
        wrong = anonymous.post("/score", json=body, headers={"authorization": "Bearer nope"})
        assert_openai_error(wrong, 401)
        right = anonymous.post("/score", json=body, headers={"authorization": f"Bearer {API_KEY}"})
        assert right.status_code == 200
        for open_route in ("/health/live", "/health/ready", "/health", "/health/startup", "/version"):
            assert anonymous.get(open_route).status_code == 200, open_route
    assert API_KEY not in cross_encoder_server.logs()
