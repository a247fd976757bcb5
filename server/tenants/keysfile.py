"""The keys file (WARMPOOL_API_KEYS_FILE, JSON or YAML): named tenants, each with its keys, scopes,
models and quota. Keys are kept as SHA-256 digests only: a plain key is hashed as it is read, and no
error message quotes the file's text (a parser's excerpt could hold a key)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCOPES = frozenset({"inference", "admin", "metrics"})
QUOTA_FIELDS = ("requests_per_second", "tokens_per_minute", "concurrent", "batch_tokens_per_day")
TENANT_FIELDS = frozenset({"keys", "scopes", "models", "quota"})
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a metrics label and a log field as it is
HASHED = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
SINGLE_KEY_TENANT = "default"  # WARMPOOL_API_KEY's tenant


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the place, never a key."""


@dataclass(frozen=True)
class Quota:
    """A tenant's limits; None: unlimited."""

    requests_per_second: float | None = None
    tokens_per_minute: int | None = None
    concurrent: int | None = None
    batch_tokens_per_day: int | None = None  # the Batch API's lines' (else they count in tokens_per_minute)


@dataclass(frozen=True)
class Tenant:
    name: str
    scopes: frozenset[str]
    models: frozenset[str] | None  # None: every model and adapter
    quota: Quota = field(default_factory=Quota)


@dataclass(frozen=True)
class Keyring:
    """Who a key is: digests to tenants. `metrics_open`: /metrics answers without a key (the single
    WARMPOOL_API_KEY alone keeps it open, as it always was)."""

    tenants: dict[str, Tenant]
    by_digest: dict[bytes, Tenant]
    metrics_open: bool = False

    def tenant_for(self, token: bytes) -> Tenant | None:
        return self.by_digest.get(hashlib.sha256(token).digest())


def digest_of(key: str) -> bytes:
    """A key's digest: `sha256:<64 hex>` as given, anything else hashed."""
    hashed = HASHED.match(key)
    return bytes.fromhex(hashed.group(1)) if hashed else hashlib.sha256(key.encode()).digest()


def single_key_ring(key: str) -> Keyring:
    """WARMPOOL_API_KEY alone: one tenant with every scope, /metrics open as it always was."""
    tenant = Tenant(SINGLE_KEY_TENANT, SCOPES, None)
    return Keyring({tenant.name: tenant}, {digest_of(key): tenant}, metrics_open=True)


def keyring(data: Any, single_key: str | None = None) -> Keyring:
    """The keys file's parsed document as a Keyring; WARMPOOL_API_KEY, if set too, joins it as the
    tenant `default` with every scope and no quota."""
    if not isinstance(data, dict) or set(data) != {"tenants"} or not isinstance(data["tenants"], dict):
        raise KeysFileError('the keys file must be one object {"tenants": {NAME: {...}}}')
    tenants: dict[str, Tenant] = {}
    by_digest: dict[bytes, Tenant] = {}
    entries: list[tuple[Any, Any, str | None]] = [(name, entry, None) for name, entry in data["tenants"].items()]
    if single_key is not None:
        if SINGLE_KEY_TENANT in data["tenants"]:
            raise KeysFileError(f"tenant '{SINGLE_KEY_TENANT}' is WARMPOOL_API_KEY's: name the file's tenant otherwise")
        entries.append((SINGLE_KEY_TENANT, None, single_key))
    for name, entry, plain in entries:
        tenant = Tenant(name, SCOPES, None) if plain is not None else _tenant(name, entry)
        keys = [plain] if plain is not None else _keys(name, entry)
        for key in keys:
            digest = digest_of(key)
            if digest in by_digest:
                raise KeysFileError(f"tenants '{by_digest[digest].name}' and '{name}' share a key")
            by_digest[digest] = tenant
        tenants[name] = tenant
    return Keyring(tenants, by_digest)


def _tenant(name: Any, entry: Any) -> Tenant:
    if not isinstance(name, str) or not NAME.match(name):
        raise KeysFileError(f"tenant name {str(name)[:64]!r}: letters, digits, '_', '.', '-', at most 64")
    if not isinstance(entry, dict):
        raise KeysFileError(f"tenant '{name}': an object with keys, scopes, models and quota")
    unknown = sorted(set(entry) - TENANT_FIELDS)
    if unknown:
        raise KeysFileError(f"tenant '{name}': unknown field(s) {unknown}; known: {sorted(TENANT_FIELDS)}")
    scopes = _strings(name, entry, "scopes")
    if not scopes or not set(scopes) <= SCOPES:
        raise KeysFileError(f"tenant '{name}': scopes must be some of {sorted(SCOPES)}")
    models = _strings(name, entry, "models") if "models" in entry else ["*"]
    if not models:
        raise KeysFileError(f"tenant '{name}': models must name at least one model, or be [\"*\"]")
    return Tenant(name, frozenset(scopes), None if "*" in models else frozenset(models), _quota(name, entry))


def _keys(name: str, entry: dict[str, Any]) -> list[str]:
    keys = _strings(name, entry, "keys")
    if not keys:
        raise KeysFileError(f"tenant '{name}': keys must list at least one key")
    for i, key in enumerate(keys):
        if not key.strip() or key != key.strip():  # a stray newline would make a key nobody can send
            raise KeysFileError(f"tenant '{name}': keys[{i}] is empty or has surrounding whitespace")
        if key.startswith("sha256:") and not HASHED.match(key):
            raise KeysFileError(f"tenant '{name}': keys[{i}] starts with sha256: but is not 64 hex digits")
    return keys


def _strings(name: str, entry: dict[str, Any], key: str) -> list[str]:
    values = entry.get(key)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise KeysFileError(f"tenant '{name}': {key} must be a list of strings")
    return values


def _quota(name: str, entry: dict[str, Any]) -> Quota:
    quota = entry.get("quota") or {}
    if not isinstance(quota, dict):
        raise KeysFileError(f"tenant '{name}': quota must be an object")
    unknown = sorted(set(quota) - set(QUOTA_FIELDS))
    if unknown:  # a limit written but not enforced would be worse than none
        raise KeysFileError(f"tenant '{name}': quota field(s) {unknown} are not enforced; known: {list(QUOTA_FIELDS)}")
    values: dict[str, Any] = {}
    for key in QUOTA_FIELDS:
        value = quota.get(key)
        if value is None:
            continue
        whole = key != "requests_per_second"
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or (whole and value % 1):
            kind = "a positive integer" if whole else "a positive number"
            raise KeysFileError(f"tenant '{name}': quota.{key} must be {kind}")
        values[key] = int(value) if whole else float(value)
    return Quota(**values)


def parse(text: bytes, path: Path, single_key: str | None = None) -> Keyring:
    """The file's bytes as a Keyring: JSON for a .json file, YAML (JSON included) otherwise."""
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            raise KeysFileError(f"{path} is not valid JSON{where}") from None
    else:
        import yaml  # only where a YAML file is configured

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            raise KeysFileError(f"{path} is not valid YAML{where}") from None
    return keyring(data, single_key)
