"""One route's answer to one body without an HTTP request: a batch job's line goes through the very
prepare and render that serve the route over HTTP (pipeline.respond), at the priority it is given."""

from __future__ import annotations

import asyncio
from typing import Any

from server.core.outputs import RawBody
from server.core.pipeline import Prepare, Render, respond
from server.core.services import Services
from server.core.timings import Timings
from server.http.errors import ClientDisconnected, bad_request, response_for


async def answer_body(
    svc: Services, prepare: Prepare, render: Render, raw: bytes, priority: int, gone: asyncio.Future[Any]
) -> tuple[int, bytes]:
    """(status, JSON body) as the route would answer `raw`: 200 and its body, or an error's status
    and OpenAI's error body. ClientDisconnected once `gone` is done (the job was cancelled or stops)."""
    try:
        await svc.serving_model()
        _, outcome, _ = await respond(svc, prepare, render, raw, "openai", priority, {"timings": Timings()}, gone)
    except ClientDisconnected:
        raise
    except Exception as exc:  # answered as the HTTP route answers it
        response = response_for(exc)
        return response.status_code, bytes(response.body)
    if isinstance(outcome.rendered, RawBody):  # a JSONL line cannot hold it
        response = response_for(
            bad_request(
                "encoding_format bytes answers raw bytes, not JSON: a batch takes float or base64", "encoding_format"
            )
        )
        return response.status_code, bytes(response.body)
    return 200, outcome.rendered
