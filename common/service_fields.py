"""The settings of the services around the model (the Batch API, the result cache, keys and tenants,
tracing, logging): fields of SettingFields (common/setting_fields.py), kept apart to keep each file short.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

BUDGET_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kKMGT])(i?)[bB]?|[bB]|(%))?\s*$"


class ServiceFields(BaseSettings):
    batch_dir: Path = Field(
        default_factory=lambda: (
            Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "warmpool" / "batches"
        ),
        description=(
            "Folder of the Batch API's files and jobs (SQLite): mount a volume there so that jobs survive a "
            "restart and resume where they stopped ([Batches](../batches.md))."
        ),
        json_schema_extra={
            "default_text": "`~/.local/state/warmpool/batches` (`/var/lib/warmpool/batches` in the image, a volume)"
        },
    )
    batch_max_file_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest file `POST /v1/files` accepts, in bytes (413 past it)."
    )
    batch_max_bytes: int = Field(
        10 * 1024**3,
        ge=1024,
        description=(
            "Bound of the bytes the batch folder's files and job outputs hold together: an upload that would pass"
            " it is refused (413), a job whose output would pass it fails with the reason in `errors`."
        ),
    )
    batch_retention: float = Field(
        7 * 86400.0, gt=0, description="Seconds a Batch API file or finished job is kept, then deleted."
    )
    batch_concurrency: int = Field(
        128,
        ge=1,
        le=256,
        description=(
            "Lines of a batch job run at once, at bulk priority (interactive requests first; engines run bulk work "
            "in small groups while interactive inputs are about, in large ones while none are), within the "
            "admission permits bulk work may take."
        ),
    )

    cache_bytes: str | None = Field(
        None,
        pattern=BUDGET_PATTERN,
        description=(
            "Bound of the exact result cache in this process (bytes with a `k`/`M`/`G`/`T` or `Ki`/`Mi`/`Gi`/`Ti` "
            "suffix, or a share of `WARMPOOL_MEMORY_BUDGET` such as `5%`); counted in the memory budget; `0` turns "
            "the cache off (see [Result cache](../operations/cache.md))."
        ),
        json_schema_extra={"default_text": "5% of `WARMPOOL_MEMORY_BUDGET`, or 64Mi without one"},
    )
    cache_url: str | None = Field(
        None,
        pattern=r"^(rediss?|unix)://",
        description="Redis shared by a fleet behind the process's cache (`redis://host:6379/0`); unset: none.",
    )
    cache_ttl: float = Field(86400.0, gt=0, description="Seconds an entry lives in Redis.")
    cache_timeout: float = Field(
        0.05,
        gt=0,
        le=5,
        description="Seconds a request waits for Redis at most (then it computes: a miss, never a failure).",
    )

    api_key: SecretStr | None = Field(None, description="Bearer token required on API routes.")
    api_key_file: Path | None = Field(None, description="File holding the API key (a mounted secret).")
    api_keys_file: Path | None = Field(
        None,
        description=(
            "JSON or YAML file of named tenants: their keys, scopes, models and quotas (see "
            "[Tenants](../operations/tenants.md)); reloaded on change."
        ),
    )
    api_keys_reload_interval: float = Field(
        5.0, gt=0, le=3600, description="Seconds between checks of WARMPOOL_API_KEYS_FILE for a change."
    )

    otlp_endpoint: str | None = Field(
        None,
        pattern=r"^https?://",
        description=(
            "OpenTelemetry collector (none: no tracing) to export traces to (see "
            "[Tracing](../operations/tracing.md)): for `http/protobuf` the base URL (`/v1/traces` is added), "
            "for `grpc` the collector as `http://host:4317`."
        ),
    )
    otlp_protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf", description="OTLP transport: `http/protobuf` or `grpc`."
    )
    otlp_service_name: str | None = Field(
        None,
        description="`service.name` of the exported spans.",
        json_schema_extra={
            "default_text": "`OTEL_SERVICE_NAME` (or the `service.name` in `OTEL_RESOURCE_ATTRIBUTES`), else warmpool"
        },
    )

    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="`debug`, `info`, `warning`, `error`."
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="`auto` (console on a TTY, JSON otherwise), `json`, `console`."
    )
