"""One route's answer to one body without an HTTP request: a batch job's line goes through the very
prepare and render that serve the route over HTTP (pipeline.respond), at the priority it is given."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from server.core.outputs import RawBody
from server.core.pipeline import Prepare, Render, respond
from server.core.services import Services
from server.core.timings import Timings
from server.http.errors import APIError, ClientDisconnected, bad_request, response_for
from server.tenants.guard import TenantPass

NEVER_FITS = "tokens_exceed_limit"  # a tenant's 429 that waiting cannot lift


class Answer(NamedTuple):
    status: int
    body: bytes
    transient: bool = False  # a full server, no engine, a quota for now: the same body may succeed later
    tokens: int = 0  # an answer's prompt tokens, as its `usage` counts them


async def answer_body(
    svc: Services,
    prepare: Prepare,
    render: Render,
    raw: bytes,
    priority: int,
    gone: asyncio.Future[Any],
    tenant: TenantPass | None = None,
    on_loop: bool = False,
) -> Answer:
    """The route's answer to `raw` (within `tenant`'s models and quota): 200 and its JSON body, or an
    error's status and OpenAI's error body. ClientDisconnected once `gone` is done (the job was
    cancelled or stops). `on_loop`: a short body's, prepared and rendered on the loop (pipeline.respond)."""
    try:
        await svc.serving_model()
        traced: dict[str, Any] = {"timings": Timings()}
        prepared, outcome, _ = await respond(
            svc, prepare, render, raw, "openai", priority, traced, gone, tenant, on_loop
        )
    except ClientDisconnected:
        raise
    except Exception as exc:  # answered as the HTTP route answers it
        response = response_for(exc)
        lasting = isinstance(exc, APIError) and exc.code == NEVER_FITS
        return Answer(response.status_code, bytes(response.body), response.status_code in (429, 503) and not lasting)
    if isinstance(outcome.rendered, RawBody):  # a JSONL line cannot hold it
        refusal = "encoding_format bytes answers raw bytes, not JSON: a batch takes float or base64"
        response = response_for(bad_request(refusal, "encoding_format"))
        return Answer(response.status_code, bytes(response.body))
    return Answer(200, outcome.rendered, tokens=prepared.n_tokens)
