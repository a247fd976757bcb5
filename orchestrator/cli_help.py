"""`warmpool --help`: every setting as its flag and its environment variable, grouped by concern."""

from __future__ import annotations

import textwrap

from common.settings import Settings

GROUPS: dict[str, tuple[str, ...]] = {
    "model": (
        "model",
        "served_model_name",
        "models",
        "on_model_failure",
        "memory_budget",
        "resident",
        "keep_alive",
        "device",
        "dtype",
        "allow_bin_weights",
    ),
    "network": ("host", "port", "port_file", "health_route", "predict_route"),
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
        "engine_stall_timeout",
        "compile",
        "compile_cache",
        "compile_timeout",
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
    "security": ("api_key", "api_key_file"),
    "logging and tracing": ("log_level", "log_format", "otlp_endpoint", "otlp_protocol", "otlp_service_name"),
}


def render() -> str:
    """The help text: usage, then each group's flags with env var, default and meaning."""
    fields = Settings.model_fields
    lines = [
        "usage: warmpool [--<setting> VALUE ...]",
        "",
        "A pooling-model server that is ready soon after a (re)start. Every setting is a flag and an",
        "environment variable; flags win over variables, which win over the defaults.",
    ]
    for group, names in GROUPS.items():
        lines += ["", f"{group}:"]
        for name in names:
            field = fields[name]
            described = "default" in (field.description or "")  # a derived default, said in words
            if field.default_factory is not None or (field.default is None and described):
                default = ""
            else:
                default = ", unset" if field.default is None else f", default {field.default}"
            lines.append(f"  --{name.replace('_', '-')}  (WARMPOOL_{name.upper()}{default})")
            lines += textwrap.wrap(
                field.description or "", width=96, initial_indent="      ", subsequent_indent="      "
            )
    return "\n".join(lines) + "\n"
