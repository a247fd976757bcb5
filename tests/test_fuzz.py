"""schemathesis against the server's own /openapi.json: no 5xx, every error in the OpenAI shape.

Cases come from each operation's hypothesis strategies, valid and invalid (bounded, derandomised),
so the run is the same every time and fits in CI.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.server_process import ServerProcess

EXAMPLES_PER_OPERATION = 20


def check(case: schemathesis.Case) -> None:
    response = case.call(timeout=60)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert {"message", "type", "param", "code"} <= set(error), response.text
        assert error["message"], response.text


def test_api_never_fails_and_errors_are_openai_shaped(server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    # Invalid cases only where there is a body to break: a GET without parameters has none.
    runs = [(op, mode) for op in operations for mode in modes if op.method.upper() == "POST" or mode == modes[0]]
    for operation, mode in runs:
        fuzz = settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(given(case=operation.as_strategy(generation_mode=mode))(check))
        fuzz()
