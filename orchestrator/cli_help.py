"""`warmpool --help`: every setting as its flag and its environment variable, grouped by concern (the
groups also make docs/reference/settings.md: tools/reference_docs.py)."""

from __future__ import annotations

import re
import textwrap

from pydantic.fields import FieldInfo

from common.settings import Settings

LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")

GROUPS: dict[str, tuple[str, ...]] = {
    "model": (
        "model",
        "served_model_name",
        "models",
        "on_model_failure",
        "memory_budget",
        "resident",
        "keep_alive",
        "adapters",
        "adapter_root",
        "adapter_bytes",
        "device",
        "dtype",
        "allow_bin_weights",
    ),
    "network": ("host", "port", "port_file", "health_route", "predict_route", "grpc_port", "grpc_stream_window"),
    "limits": (
        "max_batch_tokens",
        "max_batch_size",
        "max_inputs_per_request",
        "max_concurrent_inputs",
        "priority_reserve",
        "max_body_bytes",
        "max_header_bytes",
        "max_headers",
        "max_response_bytes",
        "long_inputs",
        "max_windows",
        "request_timeout",
        "read_timeout",
        "hold_during_start",
        "load_wait",
    ),
    "engines": (
        "engines",
        "engine_threads",
        "engine_nice",
        "engine_keep_warm",
        "engine_stall_timeout",
        "compile",
        "compile_cache",
        "compile_timeout",
        "compile_nice",
        "executor_threads",
        "max_restarts",
        "restart_window",
    ),
    "start-up and shutdown": (
        "start_method",
        "prefetch",
        "prefetch_environment",
        "prefetch_threads",
        "drain_timeout",
        "fail_linger",
    ),
    "images": (
        "max_image_bytes",
        "max_image_pixels",
        "max_image_aspect_ratio",
        "image_urls",
        "image_url_allowlist",
        "image_url_timeout",
        "image_url_redirects",
    ),
    "batches": ("batch_dir", "batch_max_file_bytes", "batch_max_bytes", "batch_retention", "batch_concurrency"),
    "security": ("api_key", "api_key_file", "api_keys_file", "api_keys_reload_interval"),
    "result cache": ("cache_bytes", "cache_url", "cache_ttl", "cache_timeout"),
    "logging and tracing": ("log_level", "log_format", "otlp_endpoint", "otlp_protocol", "otlp_service_name"),
}


def default_text(field: FieldInfo) -> str | None:
    """A default worked out at start (the folder's name, the usable CPUs), in words; None for a fixed one."""
    extra = field.json_schema_extra
    words = extra.get("default_text") if isinstance(extra, dict) else None
    return str(words) if words is not None else None


def plain(markdown: str) -> str:
    """A description as a terminal shows it: links reduced to their text."""
    return LINK.sub(r"\1", markdown)


def render() -> str:
    """The help text: usage, then each group's flags with env var, default and meaning."""
    fields = Settings.model_fields
    lines = [
        "usage: warmpool [--<setting> VALUE ...]",
        "       warmpool embed IN -o OUT [...]   (a corpus embedded through a server: warmpool embed --help)",
        "",
        "A pooling-model server that is ready soon after a (re)start. Every setting is a flag and an",
        "environment variable; flags win over variables, which win over the defaults.",
    ]
    for group, names in GROUPS.items():
        lines += ["", f"{group}:"]
        for name in names:
            field = fields[name]
            words = default_text(field)
            if words is not None:
                default = f", default: {plain(words)}"
            else:
                default = ", unset" if field.default is None else f", default {field.default}"
            lines.append(f"  --{name.replace('_', '-')}  (WARMPOOL_{name.upper()}{default})")
            lines += textwrap.wrap(
                plain(field.description or ""), width=96, initial_indent="      ", subsequent_indent="      "
            )
    return "\n".join(lines) + "\n"
