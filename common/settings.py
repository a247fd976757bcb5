"""The one settings object: every field (common/setting_fields.py) is an env var `WARMPOOL_<NAME>` and a
CLI flag `--<name>`; flags win over environment variables, which win over the defaults. Here: what the
appliance derives from them (the model's path, per-model settings, engines, threads, the stall timeout,
the API key). compose.yaml's environment block is checked against the fields by the unit tests.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path

from pydantic import model_validator

from common.cpus import usable_cpus
from common.devices import resolve, visible_gpus
from common.setting_fields import BUDGET_PATTERN, SettingFields

_POWERS = {"k": 1, "K": 1, "M": 2, "G": 3, "T": 4}


class Settings(SettingFields):
    @model_validator(mode="after")
    def _routes_apart(self) -> Settings:
        if self.health_route is not None and self.health_route == self.predict_route:
            raise ValueError(f"health_route and predict_route are both {self.health_route}: give each its own path")
        return self

    @model_validator(mode="after")
    def _grpc_port_apart(self) -> Settings:
        if self.grpc_port is not None and self.grpc_port == self.port:
            raise ValueError(f"grpc_port and port are both {self.port}: gRPC needs a port of its own")
        return self

    @model_validator(mode="after")
    def _adapters_named(self) -> Settings:
        names = [name for name, _ in self.adapter_folders]  # NAME=FOLDER each, or ValueError
        if len(set(names)) != len(names) or self.model_name in names:
            raise ValueError(f"WARMPOOL_ADAPTERS names two adapters, or an adapter and its model, alike: {names}")
        return self

    @property
    def adapter_folders(self) -> tuple[tuple[str, Path], ...]:
        """WARMPOOL_ADAPTERS as (name, folder) pairs: what the engines load (common.wire.EngineSpec.adapters)."""
        pairs = []
        for entry in (self.adapters or "").split(","):
            name, _, folder = (part.strip() for part in entry.partition("="))
            if name or folder:
                if not name or not folder:
                    raise ValueError(f"WARMPOOL_ADAPTERS: {entry.strip()!r} is not NAME=FOLDER")
                pairs.append((name, Path(folder)))
        return tuple(pairs)

    @model_validator(mode="after")
    def _adapter_cap_in_bytes(self) -> Settings:
        if self.adapter_bytes is not None and self.adapter_bytes.strip().endswith("%"):
            raise ValueError(f"WARMPOOL_ADAPTER_BYTES {self.adapter_bytes!r}: bytes (with a suffix), not a share")
        return self

    @property
    def adapter_cap(self) -> int | None:
        """WARMPOOL_ADAPTER_BYTES in bytes; None: no bound."""
        return None if self.adapter_bytes is None else budget_bytes(self.adapter_bytes, None)

    @cached_property
    def model_path(self) -> Path:
        """Resolved once, at start, then frozen: a re-forked engine loads the snapshot the tokenizer
        came from even if a newer one lands in the cache meanwhile."""
        return resolve_model_path(self.model)

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model.rstrip("/")).name

    def per_model(self) -> list[Settings]:
        """One settings object per served model (just this one without WARMPOOL_MODELS). Engines
        and their threads are shared out, so all models together use the cores one would."""
        if not self.models:
            return [self]
        entries = [entry.strip() for entry in self.models.split(",") if entry.strip()]
        engines = self.engines or max(1, self.engine_count // len(entries))
        threads = max(1, self.engine_threads // len(entries))
        result = []
        for position, entry in enumerate(entries):
            model, *options = (part.strip() for part in entry.split(";"))
            name, folder = model.split("=", 1) if "=" in model else (None, model)
            update: dict[str, object] = {"model": folder, "served_model_name": name, "models": None}
            update |= {} if position == 0 else {"adapters": None}  # adapters are the default model's
            update |= {"engines": engines, "engine_threads": threads, **_model_options(options, entry)}
            result.append(self.model_validate({**self.model_dump(), **update}))
        if len(result) < 2 and any(s.resident == "auto" for s in result):
            raise ValueError("resident=auto needs two or more models in WARMPOOL_MODELS: the last one stays loaded")
        names = [s.model_name for s in result]
        if len(set(names)) != len(names):
            raise ValueError(f"WARMPOOL_MODELS serves two models under one name: {names}; name them NAME=FOLDER")
        clash = set(names) & {name for name, _ in self.adapter_folders}
        if clash:
            raise ValueError(f"WARMPOOL_ADAPTERS names an adapter as WARMPOOL_MODELS names a model: {sorted(clash)}")
        return result

    @cached_property
    def gpus(self) -> int:
        return visible_gpus()

    @cached_property
    def resolved_device(self) -> str:
        """cpu, cuda or cuda:N; DeviceError when the device asked for is not there."""
        return resolve(self.device, self.gpus)

    @property
    def engine_count(self) -> int:
        if self.engines is not None:
            return self.engines
        if self.resolved_device == "cuda":
            return self.gpus
        return 1 if self.resolved_device.startswith("cuda:") else min(2, usable_cpus())

    @property
    def solo_engine_threads(self) -> int:
        """engine_threads; on a GPU 1 unless set. There the engine's CPU work is launching kernels and
        small index arithmetic, and an OpenMP team only waits on cores the HTTP process needs: on an
        H200 machine 2 threads served 1.4x the inputs of 16 (vLLM's GPU workers take 1 as well)."""
        if self.resolved_device != "cpu" and "engine_threads" not in self.model_fields_set:
            return 1
        return self.engine_threads

    @property
    def shared_engine_threads(self) -> int:
        """Each engine's share of its threads while the others are busy too."""
        return max(1, self.solo_engine_threads // self.engine_count)

    def stall_timeout(self, ms_per_token: float, group_tokens: int | None = None) -> float:
        """engine_stall_timeout, or 8 x the time of the largest forward an engine answers in one go
        (`group_tokens`, as the engine says: packed engines stream a batch back group by group;
        default a full batch), as warm-up measured a token, at least 10 s. Sized by the group, not the
        batch: a warm-up measured 14x slower on a busy machine made a batch-sized timeout ~4 minutes.
        At most half the request timeout, whatever warm-up measured: inputs held by an engine that
        answers nothing for longer could not finish on another engine in time."""
        if self.engine_stall_timeout is not None:
            return self.engine_stall_timeout
        derived = max(10.0, 8 * (group_tokens or self.max_batch_tokens) * ms_per_token / 1000)
        return min(derived, self.request_timeout / 2)

    @property
    def admission_permits(self) -> int:
        return self.max_concurrent_inputs or max(64, 4 * self.max_batch_tokens // 64)

    def resolved_api_key(self) -> str | None:
        """The bearer token API routes require, or None when none is configured.

        A key that is configured but empty (an empty WARMPOOL_API_KEY or --api-key, a key file
        that is missing, unreadable or holds only whitespace) raises ApiKeyError: serving without
        authentication because a secret failed to mount must never happen silently.
        """
        if self.api_key is not None or os.environ.get("WARMPOOL_API_KEY") == "":
            key = self.api_key.get_secret_value().strip() if self.api_key is not None else ""
            if not key:
                raise ApiKeyError("WARMPOOL_API_KEY is set but empty: refusing to serve without authentication")
            return key
        if self.api_key_file is None and os.environ.get("WARMPOOL_API_KEY_FILE") == "":
            raise ApiKeyError("WARMPOOL_API_KEY_FILE is set but empty: refusing to serve without authentication")
        if self.api_key_file is not None:
            try:
                key = self.api_key_file.read_text().strip()
            except OSError as exc:
                raise ApiKeyError(f"cannot read WARMPOOL_API_KEY_FILE {self.api_key_file}: {exc}") from None
            if not key:
                raise ApiKeyError(f"WARMPOOL_API_KEY_FILE {self.api_key_file} is empty: refusing to serve without it")
            return key
        return None


# What one model of several may set for itself: `NAME=FOLDER;engines=1;dtype=bfloat16;resident=auto`.
PER_MODEL = ("engines", "dtype", "max_batch_tokens", "max_batch_size", "resident", "keep_alive")


def _model_options(options: list[str], entry: str) -> dict[str, str]:
    pairs = [option.split("=", 1) for option in options if option]
    unknown = [pair[0] for pair in pairs if len(pair) != 2 or pair[0] not in PER_MODEL]
    if unknown:
        raise ValueError(f"WARMPOOL_MODELS entry {entry!r}: {unknown} cannot be set per model (only {PER_MODEL})")
    return dict(pairs)  # type: ignore[arg-type]


def budget_bytes(text: str, limit: int | None) -> int:
    """WARMPOOL_MEMORY_BUDGET in bytes: `2G`, `1.5Gi`, `800M`, `123456`, or `80%` of `limit` (the
    memory limit: the cgroup's, else the host's); ValueError for a share with no limit known."""
    match = re.fullmatch(BUDGET_PATTERN, text)
    if match is None:
        raise ValueError(f"WARMPOOL_MEMORY_BUDGET {text!r}: bytes with a k/M/G/T or Ki/Mi/Gi/Ti suffix, or N%")
    number, unit, binary, share = match.groups()
    if share:
        if limit is None:
            raise ValueError(f"WARMPOOL_MEMORY_BUDGET {text!r}: a share, but no memory limit could be read")
        return int(limit * float(number) / 100)
    power = _POWERS[unit] if unit else 0
    return int(float(number) * (1024 if binary else 1000) ** power)


DEFAULT_CACHE_BYTES = 64 * 1024**2
DEFAULT_CACHE_SHARE = 0.05  # of the memory budget, where there is one


def cache_bound(text: str | None, budget: int | None) -> int:
    """WARMPOOL_CACHE_BYTES in bytes: a share (`5%`) is of the memory budget (ValueError without one);
    unset: DEFAULT_CACHE_SHARE of the budget, or DEFAULT_CACHE_BYTES without one."""
    if text is None:
        return int(budget * DEFAULT_CACHE_SHARE) if budget is not None else DEFAULT_CACHE_BYTES
    try:
        return budget_bytes(text, budget)
    except ValueError:
        raise ValueError(f"WARMPOOL_CACHE_BYTES {text!r}: a share, but WARMPOOL_MEMORY_BUDGET is not set") from None


class ApiKeyError(ValueError):
    """An API key is configured but unusable."""


def resolve_model_path(model: str) -> Path:
    """A folder as given, or a repo id looked up in the offline Hugging Face cache: the snapshot
    its refs/main names, else the newest one."""
    path = Path(model).expanduser()
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        return path.resolve()
    repo = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    repo = repo / f"models--{model.replace('/', '--')}"
    snapshots = repo / "snapshots"
    try:
        main = snapshots / (repo / "refs" / "main").read_text().strip()
    except OSError:
        main = None
    if main is not None and main.is_dir():
        return main
    found = sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else path.resolve()
