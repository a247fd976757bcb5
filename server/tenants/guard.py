"""The key check for every route but probes, version and the status page: who the key is (its
tenant), whether its scopes allow the route, whether its quota allows one more request now. Errors
leave in the shape of the surface the path belongs to; the tenant (never its key) is put in the
request's state for the access log, the trace, the metrics and the pipeline's model and token checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from common.settings import Settings
from server.http.errors import APIError, Shape, error_response
from server.http.metrics import Metrics
from server.tenants.buckets import LimitsTable, TenantLimits
from server.tenants.keysfile import Keyring, single_key_ring
from server.tenants.watcher import KeysWatcher

# Head-level errors of these paths leave in their surface's shape (shared paths such as /rerank,
# whose shape follows the body, answer OpenAI's).
TEI_PATHS = frozenset(
    {"/", "/invocations", "/embed", "/embed_all", "/embed_sparse", "/predict", "/similarity", "/decode"}
)
COHERE_PATHS = frozenset({"/v1/embed", "/v2/embed", "/v2/rerank"})


class KeySource(Protocol):
    ring: Keyring
    limits: LimitsTable

    def poll(self) -> None: ...


class OpenCheck(Protocol):
    def __call__(self, path: str, method: str) -> bool: ...


class StaticKeys:
    """WARMPOOL_API_KEY alone: never reloaded."""

    def __init__(self, ring: Keyring) -> None:
        self.ring = ring
        self.limits = LimitsTable()
        self.limits.update(ring)

    def poll(self) -> None:
        pass


def key_source(settings: Settings) -> KeySource | None:
    """The keys file (reloaded on change; WARMPOOL_API_KEY, if set too, its tenant `default`), or
    WARMPOOL_API_KEY alone, or None: no key asked for."""
    key = settings.resolved_api_key()
    if settings.api_keys_file is not None:
        return KeysWatcher(settings.api_keys_file, settings.api_keys_reload_interval, key)
    return StaticKeys(single_key_ring(key)) if key else None


@dataclass(frozen=True)
class TenantPass:
    """What a request's tenant allows it, once its key is known."""

    name: str
    models: frozenset[str] | None  # None: every model
    limits: TenantLimits
    batch: bool = False  # a Batch API job's line: charged to batch_tokens_per_day where there is one

    def demoted(self, metrics: Metrics) -> bool:
        """Whether this request runs as bulk work (priority 1 at least, whatever it asks): while its tenant
        presses past its quota (TenantLimits.pressing), so a runaway client waits behind the other
        tenants' interactive inputs, not beside them. A Batch API job's lines are bulk work already."""
        if self.batch or not self.limits.pressing():
            return False
        metrics.tenant_demoted.labels(tenant=self.name).inc()
        return True

    def charge(self, tokens: int, metrics: Metrics) -> None:
        """The request's tokens against the tenant's tokens per minute (or per day), before the engine:
        429 past it (`tokens_exceed_limit` for more than the whole bucket: waiting will not help)."""
        refusal = self.limits.charge(tokens, self.batch)
        if refusal is not None:
            metrics.tenant_rejections.labels(tenant=self.name, reason=refusal.reason).inc()
            code = "tokens_exceed_limit" if refusal.never else "rate_limit_exceeded"
            raise APIError(429, refusal.message, code=code, headers=refusal.headers)
        metrics.tenant_tokens.labels(tenant=self.name).inc(tokens)


def pass_for(keys: KeySource | None, tenant: str | None) -> TenantPass | None:
    """A Batch API job's lines' pass: its creator's tenant as its key would give it now; None where no
    keys limit it. LookupError: the tenant is no longer there."""
    if keys is None or tenant is None:
        return None
    found = keys.ring.tenants.get(tenant)
    if found is None:
        raise LookupError(tenant)
    return TenantPass(found.name, found.models, keys.limits[found.name], batch=True)


def shape_of(path: str) -> Shape:
    return "tei" if path in TEI_PATHS else "cohere" if path in COHERE_PATHS else "openai"


def scope_of(path: str) -> str:
    if path == "/metrics":
        return "metrics"
    return "admin" if path.startswith("/admin/") else "inference"


def admit(keys: KeySource, token: bytes, needed: str, metrics: Metrics, state: dict[str, Any]) -> TenantPass:
    """Who the bearer `token` is, allowed the `needed` scope and one request more of its quota now
    (the caller releases it: `limits.release()`), or the APIError why not (401, 403, 429): HTTP's
    guard and gRPC's calls alike. The tenant goes into `state` refused or not (the access log's)."""
    keys.poll()
    tenant = keys.ring.tenant_for(token) if token else None
    if tenant is None:
        raise APIError(
            401, "missing or invalid API key", code="invalid_api_key", headers={"www-authenticate": "Bearer"}
        )
    limits = keys.limits[tenant.name]
    state["tenant"] = granted = TenantPass(tenant.name, tenant.models, limits)
    if needed not in tenant.scopes:
        metrics.tenant_rejections.labels(tenant=tenant.name, reason="scope").inc()
        raise APIError(403, f"this API key lacks the '{needed}' scope", code="insufficient_scope")
    refusal = limits.admit()
    if refusal is not None:
        metrics.tenant_rejections.labels(tenant=tenant.name, reason=refusal.reason).inc()
        raise APIError(429, refusal.message, code="rate_limit_exceeded", headers=refusal.headers)
    metrics.tenant_requests.labels(tenant=tenant.name).inc()
    return granted


class TenantGuard:
    def __init__(self, app: ASGIApp, keys: KeySource, metrics: Metrics, is_open: OpenCheck) -> None:
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.is_open = is_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or self.is_open(path, scope["method"]):
            await self.app(scope, receive, send)
            return
        self.keys.poll()
        needed = scope_of(path)
        if needed == "metrics" and self.keys.ring.metrics_open:
            await self.app(scope, receive, send)
            return
        try:
            tenant = admit(self.keys, _bearer(scope), needed, self.metrics, scope.setdefault("state", {}))
        except APIError as error:
            await self._refuse(error, path, scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            tenant.limits.release()

    async def _refuse(self, error: APIError, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        error.shape = shape_of(path)
        await error_response(error)(scope, receive, send)


def _bearer(scope: Scope) -> bytes:
    """The Authorization header's bearer token (b"" without one): any length the server accepts."""
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            return bearer(bytes(value))
    return b""


def bearer(authorization: bytes) -> bytes:
    """The token of an `authorization` value (HTTP's header, gRPC's metadata): b"" if not `Bearer`."""
    scheme, _, token = authorization.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""
