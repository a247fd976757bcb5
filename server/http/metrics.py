"""Prometheus metrics, in a registry of the app's own; phase and gauge values are read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Pooling requests take milliseconds; probes sub-millisecond; big batches seconds.
SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


class _PhaseCollector(Collector):
    def __init__(
        self, snapshot: Callable[[], dict[str, Any]], default_model: Callable[[], str], ready: Callable[[], bool] | None
    ) -> None:
        self.snapshot = snapshot
        self.default_model = default_model  # the one model's name: its phases carry none
        self.ready = ready  # what /health/ready answers, where it is more than the phases say

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self.snapshot()
        # 1 exactly when /health/ready answers 200: what readiness alerts and panels follow.
        ready = GaugeMetricFamily("warmpool_ready", "1 while serving (/health/ready 200), else 0")
        ready.add_metric([], 1.0 if (self.ready() if self.ready else snapshot["status"] == "ready") else 0.0)
        yield ready
        phases = snapshot["phases"]
        duration = GaugeMetricFamily(
            "warmpool_startup_phase_duration_seconds",
            "Duration of each startup phase",
            labels=["phase", "state"],
        )
        prefetched = GaugeMetricFamily(
            "warmpool_prefetch_bytes", "Bytes read into the page cache by prefetch", labels=["model"]
        )
        engines_up = GaugeMetricFamily("warmpool_engines_up", "Engines warm and taking work", labels=["model"])
        stalled = GaugeMetricFamily(
            "warmpool_engines_stalled", "Engines with work answering nothing: routed around", labels=["model"]
        )
        compiled = GaugeMetricFamily(
            "warmpool_engines_compiled", "Engines serving on the compiled forward (the rest: eager)", labels=["model"]
        )
        for phase in phases:
            if phase["duration_s"] is not None:
                duration.add_metric([phase["name"], phase["state"]], phase["duration_s"])
            kind, model = phase["name"].split(":")[0], phase.get("model") or self.default_model()
            if kind == "prefetch":
                detail = phase["detail"]  # read: what was found in the page cache is not
                prefetched.add_metric([model], detail.get("bytes_done", 0) - detail.get("bytes_cached", 0))
            if kind == "engine":
                engines_up.add_metric([model], phase["detail"].get("up", 0))
                stalled.add_metric([model], len(phase["detail"].get("stalled", [])))
            if kind == "compile":
                engines = phase["detail"].get("engines", {}).values()
                compiled.add_metric([model], sum(1 for d in engines if d.get("mode") == "compiled"))
        yield duration
        yield prefetched
        yield engines_up
        yield stalled
        yield compiled


class Metrics:
    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        default_model: Callable[[], str] = str,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.registry = registry = CollectorRegistry()
        registry.register(_PhaseCollector(snapshot, default_model, ready))
        self.requests = Histogram(
            "warmpool_request_duration_seconds",
            "Request latency: HTTP (route: its path) and gRPC (route: the method, status: the gRPC code)",
            ["route", "status"],
            buckets=SECONDS,
            registry=registry,
        )
        self.queue_time = Histogram(
            "warmpool_queue_time_seconds",
            "Time inputs waited for the engine",
            ["model"],
            buckets=SECONDS,
            registry=registry,
        )
        self.tokenization_time = Histogram(
            "warmpool_tokenization_time_seconds",
            "Parse and tokenize time per request",
            buckets=SECONDS,
            registry=registry,
        )
        self.inference_time = Histogram(
            "warmpool_inference_time_seconds",
            "Engine forward time per request",
            ["model"],
            buckets=SECONDS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "warmpool_batch_size", "Inputs per engine forward pass", ["model"], buckets=BATCH_SIZES, registry=registry
        )
        self.batch_tokens = Histogram(
            "warmpool_batch_tokens",
            "Tokens per engine forward pass (with padding, where the backend pads)",
            ["model"],
            buckets=BATCH_TOKENS,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "warmpool_queue_depth", "Inputs sent to the engine, not yet answered", registry=registry
        )
        self.in_flight = Gauge(
            "warmpool_inputs_in_flight", "Admitted inputs (admission permits in use)", registry=registry
        )
        self.rejections = Counter(
            "warmpool_rejections_total", "Requests refused before any work", ["reason"], registry=registry
        )
        # per tenant of WARMPOOL_API_KEYS_FILE (its name, never its key): the file bounds the labels
        self.tenant_requests = Counter(
            "warmpool_tenant_requests_total", "Requests let through, by tenant", ["tenant"], registry=registry
        )
        self.tenant_tokens = Counter(
            "warmpool_tenant_tokens_total", "Tokens charged to tenants' quotas", ["tenant"], registry=registry
        )
        self.tenant_rejections = Counter(
            "warmpool_tenant_rejections_total",
            "Requests refused by tenant and reason: scope, requests, concurrent, tokens",
            ["tenant", "reason"],
            registry=registry,
        )
        self.tenant_demoted = Counter(
            "warmpool_tenant_demoted_total",
            "Requests run as bulk work: their tenant pressed past its quota (refused, or bursting) in the last 2 s",
            ["tenant"],
            registry=registry,
        )
        self.restarts = Counter(
            "warmpool_engine_restarts_total", "Engines re-forked after a crash", ["model"], registry=registry
        )
        self.stalls = Counter(
            "warmpool_engine_stalls_total",
            "Engines killed for answering nothing with work outstanding (then re-forked)",
            ["model"],
            registry=registry,
        )
        self.model_loads = Counter(
            "warmpool_model_loads_total",
            "Models loaded after the start (on demand or asked)",
            ["model"],
            registry=registry,
        )
        self.model_unloads = Counter(
            "warmpool_model_unloads_total",
            "Models unloaded, by why: evicted (room for another), idle (keep_alive), asked (the admin API)",
            ["model", "reason"],
            registry=registry,
        )
        self.model_evictions = Counter(
            "warmpool_model_evictions_total",
            "Models unloaded to make room for another within WARMPOOL_MEMORY_BUDGET",
            ["model"],
            registry=registry,
        )
        self.load_wait = Histogram(
            "warmpool_model_load_wait_seconds",
            "Time requests for a model not loaded waited for its load",
            ["model"],
            buckets=SECONDS,
            registry=registry,
        )
        self.resident_bytes = Gauge(
            "warmpool_model_resident_bytes",
            "Memory a model holds (its engines' PSS once measured, else its estimate); 0 when unloaded",
            ["model"],
            registry=registry,
        )
        self.adapter_requests = Counter(
            "warmpool_adapter_requests_total",
            "Requests answered with a LoRA adapter, by its base model and the adapter",
            ["model", "adapter"],
            registry=registry,
        )
        self.adapter_resident_bytes = Gauge(
            "warmpool_adapter_resident_bytes",
            "Memory one engine holds for a LoRA adapter (0 once dropped or unloaded)",
            ["model", "adapter"],
            registry=registry,
        )
        self.disconnects = Counter(
            "warmpool_client_disconnects_total",
            "Requests whose client left before the answer",
            registry=registry,
        )
        self.batch_lines = Counter(
            "warmpool_batch_lines_total",
            "Batch API lines answered: completed (an output line) or failed (an error line)",
            ["state"],
            registry=registry,
        )
        self.batch_running_lines = Gauge(
            "warmpool_batch_running_lines",
            "The running Batch API job's lines: its total, and those answered so far (0 when no job runs)",
            ["count"],
            registry=registry,
        )

        # the exact result cache (server/core/cached_run.py)
        self.cache_hits = Counter(
            "warmpool_cache_hits_total",
            "Inputs answered without a forward of their own: from the process's LRU (local), from Redis (shared),"
            " or by another request's forward of the same input, or by one earlier in the same request (flight)",
            ["tier"],
            registry=registry,
        )
        self.cache_misses = Counter(
            "warmpool_cache_misses_total", "Distinct inputs the engine ran, the cache on", registry=registry
        )
        self.cache_evictions = Counter(
            "warmpool_cache_evictions_total",
            "Entries the LRU dropped to stay within WARMPOOL_CACHE_BYTES",
            registry=registry,
        )
        self.cache_bytes = Gauge("warmpool_cache_bytes", "Bytes the process's result cache holds", registry=registry)
        self.cache_entries = Gauge(
            "warmpool_cache_entries", "Entries the process's result cache holds", registry=registry
        )
        self.cache_shared_errors = Counter(
            "warmpool_cache_shared_errors_total",
            "Redis calls that failed or timed out (each a miss or a dropped write, never a failed request)",
            ["op"],
            registry=registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
