"""Every setting: its type, default, bounds, and the one text of it (its description; and, where the default
is worked out at start, its `default_text`); the engines' own are in common/engine_fields.py, the services'
in common/service_fields.py. `warmpool --help` and docs/reference/settings.md are generated from these;
common/settings.py adds what the appliance derives from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from common.engine_fields import EngineFields
from common.service_fields import BUDGET_PATTERN


class SettingFields(EngineFields):
    model_config = SettingsConfigDict(
        env_prefix="WARMPOOL_",
        cli_kebab_case=True,
        cli_prog_name="warmpool",
        cli_implicit_flags=False,
        extra="ignore",
        # compose passes `${WARMPOOL_X:-}` for settings whose default is derived: empty means unset.
        env_ignore_empty=True,
    )

    model: str = Field(
        "./models/all-MiniLM-L6-v2",
        description="Model folder, or a Hugging Face repo id resolved offline from `HF_HOME`.",
    )
    served_model_name: str | None = Field(
        None, description="Name clients use.", json_schema_extra={"default_text": "the folder's name"}
    )
    models: str | None = Field(
        None,
        description=(
            "Several models behind one port: `FOLDER` or `NAME=FOLDER`, comma-separated, the first the "
            "default, each optionally followed by `;engines=N`, `;dtype=…`, `;max_batch_tokens=N`, "
            '`;max_batch_size=N`, `;resident=auto`, `;keep_alive=SECONDS` for that model alone (see "Several '
            'models" and "Models on demand").'
        ),
        json_schema_extra={"default_text": "unset (one model: `WARMPOOL_MODEL`)"},
    )
    on_model_failure: Literal["exit", "serve-others"] = Field(
        "exit",
        description=(
            "With several models, a model that fails to start (or runs out of restarts) fails the appliance "
            "(`exit`), or the others serve on (`serve-others`)."
        ),
    )
    memory_budget: str | None = Field(
        None,
        pattern=BUDGET_PATTERN,
        description=(
            "With several models, what the loaded models may hold together (their engines' PSS; before a model"
            " loads, an estimate from its weight files, its engines and their LoRA adapters): bytes with a"
            " `k`/`M`/`G`/`T` (powers of 1000) or `Ki`/`Mi`/`Gi`/`Ti` suffix, or a share of the memory limit "
            "(the cgroup's, else the host's) such as `80%`; unset: no bound (see \"Models on demand\")."
        ),
    )
    resident: Literal["always", "auto"] = Field(
        "always",
        description=(
            "With several models (per model: `;resident=auto`): `always` loads the model at start and never "
            "unloads it; `auto` loads it at start while it fits the budget, else on its first request, and "
            "unloads it to make room (least recently used first) or after `keep_alive` idle seconds."
        ),
    )
    keep_alive: float | None = Field(
        None,
        gt=0,
        description=(
            "Seconds an idle `resident=auto` model stays loaded (per model: `;keep_alive=300`); unset: until "
            "its memory is needed."
        ),
    )
    adapters: str | None = Field(
        None,
        description=(
            "PEFT LoRA adapters of the served (default) model: `NAME=FOLDER`, comma-separated, each folder "
            "holding adapter_config.json and adapter_model.safetensors; a request names an adapter in its "
            "`model` field as it would a model, and every engine runs them on the one base, each engine holding "
            "its own copy: counted once per engine in the model's `WARMPOOL_MEMORY_BUDGET` estimate (see "
            '"LoRA adapters").'
        ),
        json_schema_extra={"default_text": "unset (none)"},
    )
    adapter_root: Path | None = Field(
        None,
        description=(
            "The folder under which `POST /admin/adapters/{name}/load` may load PEFT LoRA adapters at run time "
            "(a path in its body: relative to it, or absolute within it; symlinks resolved); unset: run-time "
            'loading is refused (see "LoRA adapters").'
        ),
        json_schema_extra={"default_text": "unset (refused)"},
    )
    adapter_bytes: str | None = Field(
        None,
        pattern=BUDGET_PATTERN,
        description=(
            "What the LoRA adapters loaded at run time may hold in each engine: bytes with a `k`/`M`/`G`/`T` or "
            "`Ki`/`Mi`/`Gi`/`Ti` suffix; the least recently used are dropped to make room (and loaded again by "
            "the next request naming one); counted once per engine in the model's `WARMPOOL_MEMORY_BUDGET` "
            "estimate (with `WARMPOOL_ADAPTER_ROOT`); unset: no bound, and only the engines' measured memory "
            "counts them."
        ),
        json_schema_extra={"default_text": "unset (no bound)"},
    )
    host: str = Field("127.0.0.1", description="Listen address (`0.0.0.0` in the image).")
    port: int = Field(
        8000,
        ge=0,
        le=65535,
        description=(
            "Listen port; `AIP_HTTP_PORT` wins when set, and under `serve` it is 8080 "
            "(`SAGEMAKER_BIND_TO_PORT`); see [Managed platforms](../operations/platforms.md)."
        ),
    )
    port_file: Path | None = Field(
        None,
        description=(
            "A file the port listened on is written to once bound (`/tmp/warmpool.port` in the image, whose "
            "`HEALTHCHECK` reads it: `serve` and `AIP_HTTP_PORT` move the port)."
        ),
    )
    health_route: str | None = Field(
        None,
        pattern=r"^/",
        description=(
            "Another path answering as `/health/ready`, open without the API key (`AIP_HEALTH_ROUTE` sets it)."
        ),
    )
    predict_route: str | None = Field(
        None,
        pattern=r"^/",
        description=(
            'A path answering Vertex AI\'s predict body, `{"instances", "parameters"}` to `{"predictions"}` '
            "(`AIP_PREDICT_ROUTE` sets it)."
        ),
    )
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=(
            "Port of TEI's gRPC API (its `tei.proto`, with gRPC health and reflection) on `host`; unset: no "
            "gRPC (grpcio is not imported). Needs the `grpc` extra (in the image). See [API](../api.md#grpc)."
        ),
        json_schema_extra={"default_text": "unset (off)"},
    )
    grpc_stream_window: int = Field(
        32,
        ge=1,
        le=1024,
        description=(
            "Messages of one gRPC stream in flight at once (answered in order); the stream reads no "
            "further until the oldest is answered."
        ),
    )

    max_batch_tokens: int = Field(16384, ge=1, description="Padded tokens per engine batch.")
    max_batch_size: int = Field(256, ge=1, description="Inputs per engine batch.")
    max_inputs_per_request: int = Field(2048, ge=1, description="Inputs one request may carry.")
    max_concurrent_inputs: int | None = Field(
        None,
        ge=1,
        description="Admission permits, one per input (429 past them).",
        json_schema_extra={"default_text": "4 x `max_batch_tokens` / 64, at least 64"},
    )
    priority_reserve: float = Field(
        0.25,
        ge=0,
        lt=1,
        description=(
            "Share of the admission permits kept for requests at priority 0 or more urgent: bulk work (a "
            "higher priority number) cannot take them (see Priority in [limits](../limits.md))."
        ),
    )
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="Request body limit (413 past it).")
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="Request line and headers limit, in bytes (414 or 431 past it)."
    )
    max_headers: int = Field(128, ge=8, description="Request headers one request may carry (431 past it).")
    long_inputs: Literal["refuse", "truncate", "chunk"] = Field(
        "refuse",
        description=(
            "A text longer than the model takes, unless the request says: `refuse` (400), `truncate`, or "
            "`chunk` (embedded as overlapping windows, their token-weighted mean; a reranked or scored "
            "document as passages, its best passage's score; see [limits](../limits.md))."
        ),
    )
    max_windows: int = Field(64, ge=1, description="Windows one text may be chunked into (400 past it).")
    max_response_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1024,
        description=(
            "What one answer of per-token or sparse output (`/embed_all` vectors, a ColBERT's or bge-m3's "
            "token vectors and weights, TEI `/tokenize` spans, SPLADE weights) may take, in bytes, estimated "
            "before the work (400 past it)."
        ),
    )
    max_image_bytes: int = Field(
        20_000_000,
        ge=1024,
        description=(
            "An image input's encoded size, in bytes (CLIP/SigLIP models; 400 past it), whatever the body "
            "limit (see [Images](../images.md))."
        ),
    )
    max_image_pixels: int = Field(
        40_000_000,
        ge=1,
        description=(
            "An image's width x height, and the size its resize to the model's input would give, both read "
            "from its header before it is decoded (400 past either: a decompression bomb is refused, never "
            "decoded)."
        ),
    )
    max_image_aspect_ratio: float = Field(
        200.0,
        ge=1,
        description=(
            "An image's longer side over its shorter, read from its header (400 past it: a 1 x 2000 image "
            "resized to a 224-pixel shorter side would be 224 x 448000)."
        ),
    )
    image_urls: Literal["off", "allowlist"] = Field(
        "off",
        description=(
            "Image inputs given as `http(s)` URLs: `off` (400; `data:` URLs and base64 only), or `allowlist`:"
            " fetched from the hosts `WARMPOOL_IMAGE_URL_ALLOWLIST` names."
        ),
    )
    image_url_allowlist: str | None = Field(
        None,
        description=(
            "Hosts image URLs may name (comma-separated, exact names); a loopback, link-local or private "
            "address is fetched only from a host named here."
        ),
    )
    image_url_timeout: float = Field(
        10.0,
        gt=0,
        description=(
            "Seconds a request's image URL fetches may take together, redirects included (one slow host "
            "cannot hold a request for that many times this)."
        ),
    )
    image_url_redirects: int = Field(3, ge=0, le=10, description="Redirects an image URL may take, each checked again.")

    prefetch: Literal["on", "off"] = Field(
        "on",
        description=(
            "Warm the page cache with the model files and the environment's native libraries (`off` to skip both)."
        ),
    )
    prefetch_environment: Literal["on", "off"] = Field(
        "off",
        description=(
            "Also read torch's (numpy's, ...) native libraries ahead of the forkserver's import: `on` pays on"
            " volumes slow per read ([Startup phases](../startup.md))."
        ),
    )
    prefetch_threads: int = Field(8, ge=1, le=64, description="Prefetch readers (1 for a spinning disk).")

    drain_timeout: float = Field(30.0, ge=0, description="Seconds to finish in-flight requests on SIGTERM.")
    fail_linger: float = Field(
        10.0, ge=0, description="Seconds a failed start keeps `/health/startup` up before exiting."
    )
    request_timeout: float = Field(
        120.0,
        gt=0,
        description=(
            "Seconds a request may take once its body has arrived, tokenizing and the engine together (then "
            "503; 499 if the client left)."
        ),
    )
    read_timeout: float = Field(
        30.0,
        gt=0,
        description=(
            "Seconds a client may take to send a request's headers (then the connection is closed), and again"
            " its body (then 408)."
        ),
    )
    hold_during_start: Literal["on", "off"] = Field(
        "off",
        description=(
            "`on`: a request that arrives while the appliance starts is held until every model has started, "
            "then served, instead of a 503 at once (probes unchanged)."
        ),
    )
    load_wait: float = Field(30.0, gt=0, description="Seconds a held request waits (then 503 with `Retry-After`).")
