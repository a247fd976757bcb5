"""GET / for browsers: a status page served by the server itself; GET /status: the numbers it polls.

The page (server/static/status.html: inline CSS and vanilla JS, no CDN, no build step) draws the
start-up phases as a timeline and the live figures, refreshing itself from `GET /status` once a
second. `/status` holds cumulative counters only (requests, latency histogram, restarts) plus the
gauges of this instant; the page turns counter deltas between two polls into rates, so any number
of viewers share one stateless endpoint. It exposes nothing /health/startup and /metrics do not, so
it is open without the API key like them (server/http/middleware.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata, resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client.metrics import MetricWrapperBase

from server.core.cached_run import cache_stats
from server.core.services import Services, services

router = APIRouter(tags=["status"])

_PAGE = resources.files("server").joinpath("static/status.html").read_bytes()
# Requests the figures leave out: the page, its polls, probes and scrapes, and unknown paths
# ("other": a browser's /favicon.ico, scanners); what remains is the API's own traffic.
_MONITORING = ("/", "/status", "/metrics", "other")


@router.get(
    "/",
    response_class=HTMLResponse,
    responses={200: {"content": {"application/json": {}}, "description": "the page, or a JSON pointer to it"}},
)
async def status_page(request: Request) -> Response:
    """The status page for a browser (Accept: text/html); for anything else a JSON pointer to it."""
    headers = {"vary": "accept", "cache-control": "no-cache"}
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(_PAGE, headers=headers)
    pointer = {
        "name": "warmpool",
        "version": metadata.version("warmpool"),
        "status_page": "GET / with Accept: text/html",
        "status": "/status",
        "startup": "/health/startup",
        "metrics": "/metrics",
        "docs": "/docs",
    }
    return JSONResponse(pointer, headers=headers)


@router.get("/status")
async def status(request: Request) -> JSONResponse:
    """The phase table, engines, request counters, latency histogram and queue depth, in one poll."""
    svc = services(request)
    # Collecting the request histogram takes ~3 ms with every route's labels in use: off the loop.
    body = await svc.off_loop(live_status, svc)
    body["http_in_flight"] = svc.in_flight - 1  # less this poll
    return JSONResponse(body, headers={"cache-control": "no-store"})


def live_status(svc: Services) -> dict[str, Any]:
    """What /status answers but the HTTP requests in flight (read on the loop)."""
    snapshot = svc.startup.snapshot()
    # with several models each has its own engine and compile phases (engine:NAME): summed here
    engines = [p["detail"] for p in snapshot["phases"] if p["name"].split(":")[0] == "engine"]
    compiles = [p for p in snapshot["phases"] if p["name"].split(":")[0] == "compile"]
    modes = [d.get("mode") for p in compiles for d in p["detail"].get("engines", {}).values()]
    metrics = svc.metrics
    return {
        **snapshot,
        "engines": {
            "configured": sum(e.get("engines") or 0 for e in engines) or None,
            "up": sum(e.get("up", 0) for e in engines),
            "restarts_total": _value(metrics.restarts, "_total"),
            "restarts_in_window": sum(e.get("restarts", 0) for e in engines),
            "stalls_total": _value(metrics.stalls, "_total"),
            "compiled": modes.count("compiled"),  # the rest serve eager: the compile phase says why
            "compile": "/".join(sorted({p["state"] for p in compiles})),
        },
        "requests": _requests(metrics.requests),
        "queue_depth": _value(metrics.queue_depth),
        "inputs_in_flight": _value(metrics.in_flight),
        "keys": svc.keys.detail() if svc.keys is not None else None,  # the keys file: tenants, its last error
        "cache": cache_stats(svc.cache),
        # each model's LoRA adapters: state, memory_bytes, loaded_at, last_used
        "adapters": {name: m.adapters.describe() for name, m in list(svc.models.items()) if m.adapters},
        "batch": svc.batches.progress() if svc.batches is not None else None,  # the running Batch API job
    }


def _requests(histogram: MetricWrapperBase) -> dict[str, Any]:
    """API requests since start: count, by status class, latency sum and cumulative buckets."""
    by_class: dict[str, int] = {}
    buckets: dict[float, float] = {}
    seconds = 0.0
    for sample in _samples(histogram):
        labels = sample.labels
        if labels["route"] in _MONITORING or labels["route"].startswith("/health"):
            continue
        if sample.name.endswith("_bucket"):
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + sample.value
        elif sample.name.endswith("_count"):
            status_class = labels["status"][0] + "xx"
            by_class[status_class] = by_class.get(status_class, 0) + int(sample.value)
        elif sample.name.endswith("_sum"):
            seconds += sample.value
    return {
        "count": sum(by_class.values()),
        "by_class": dict(sorted(by_class.items())),
        "seconds_sum": round(seconds, 6),
        # [upper bound, requests at or under it]; the last bound is +Inf, sent as null (JSON has no Infinity).
        "buckets": [[None if le == float("inf") else le, int(n)] for le, n in sorted(buckets.items())],
    }


def _value(metric: MetricWrapperBase, suffix: str = "") -> int:
    """A counter's or gauge's value summed over its labels (all of them count things), read as a
    scrape reads it."""
    return int(sum(s.value for s in _samples(metric) if s.name.endswith(suffix)))


def _samples(metric: MetricWrapperBase) -> Iterable[Any]:
    return (sample for family in metric.collect() for sample in family.samples)
