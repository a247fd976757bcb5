"""The API key: configured-but-empty keys refuse to start; any sane key length authenticates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from common.settings import ApiKeyError, Settings
from server.http.metrics import Metrics
from server.http.middleware import is_open
from server.tenants.guard import StaticKeys, TenantGuard
from server.tenants.keysfile import single_key_ring


def test_no_key_configured_means_no_authentication(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither WARMPOOL_API_KEY nor WARMPOOL_API_KEY_FILE: no key."""
    monkeypatch.delenv("WARMPOOL_API_KEY", raising=False)
    assert Settings().resolved_api_key() is None


def test_an_empty_key_variable_refuses_to_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An empty WARMPOOL_API_KEY is an error, even with a key file beside it: never fail open."""
    (tmp_path / "key").write_text("from-file")
    monkeypatch.setenv("WARMPOOL_API_KEY", "")
    with pytest.raises(ApiKeyError, match="WARMPOOL_API_KEY is set but empty"):
        Settings(api_key_file=tmp_path / "key").resolved_api_key()


def test_a_blank_key_flag_refuses_to_start() -> None:
    """--api-key with only whitespace is an error."""
    with pytest.raises(ApiKeyError):
        Settings(_cli_parse_args=["--api-key", "  "]).resolved_api_key()  # type: ignore[call-arg]


@pytest.mark.parametrize("content", ["", "  \n"])
def test_a_blank_key_file_refuses_to_start(tmp_path: Path, content: str) -> None:
    """A key file holding nothing but whitespace (a secret that did not mount right) is an error."""
    (tmp_path / "key").write_text(content)
    with pytest.raises(ApiKeyError, match="is empty"):
        Settings(api_key_file=tmp_path / "key").resolved_api_key()


def test_a_missing_key_file_refuses_to_start(tmp_path: Path) -> None:
    """A key file that cannot be read is an error naming it."""
    with pytest.raises(ApiKeyError, match="cannot read"):
        Settings(api_key_file=tmp_path / "absent").resolved_api_key()


def test_a_key_file_is_stripped(tmp_path: Path) -> None:
    """A mounted secret's trailing newline is not part of the key."""
    (tmp_path / "key").write_text("s3cret\n")
    assert Settings(api_key_file=tmp_path / "key").resolved_api_key() == "s3cret"


def guarded_status(key: str, given: str | None, path: str = "/v1/embeddings", method: str = "POST") -> int:
    """The status the key check answers a request carrying `Authorization: Bearer given` (None: no header)."""
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [] if given is None else [(b"authorization", f"Bearer {given}".encode())],
    }
    guard = TenantGuard(app, StaticKeys(single_key_ring(key)), Metrics(dict), is_open)
    asyncio.run(guard(scope, receive, send))
    return int(sent[0]["status"])


def test_a_long_key_authenticates() -> None:
    """A 2000-character key matches in full (header values are not cut before the comparison)."""
    key = "k" * 2000
    assert guarded_status(key, key) == 200


def test_a_key_differing_past_512_characters_is_refused() -> None:
    """The whole key is compared: a difference at the very end is a 401."""
    key = "k" * 2000
    assert guarded_status(key, key[:-1] + "x") == 401


def test_an_empty_key_file_variable_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """WARMPOOL_API_KEY_FILE="" (an unset template variable) is an error, not 'no key'."""
    monkeypatch.delenv("WARMPOOL_API_KEY", raising=False)
    monkeypatch.setenv("WARMPOOL_API_KEY_FILE", "")
    with pytest.raises(ApiKeyError, match="WARMPOOL_API_KEY_FILE is set but empty"):
        Settings().resolved_api_key()


@pytest.mark.parametrize(
    "path",
    ["/health/../admin/models/a/unload", "/health/./../admin/models/a/unload", "/metrics/..", "/status/x/../.."],
)
def test_an_open_prefix_with_dot_segments_needs_the_key(path: str) -> None:
    """A path under an open prefix that climbs out of it (as uvicorn passes it: %2e%2e decoded to ..,
    nothing resolved) is not open: 401 without the key."""
    assert guarded_status("s3cret", None, path) == 401


def test_the_open_paths_stay_open() -> None:
    assert guarded_status("s3cret", None, "/health/ready", "GET") == 200
    assert guarded_status("s3cret", None, "/", "GET") == 200


@pytest.mark.parametrize(
    ("path", "method"), [("/v1/files", "POST"), ("/v1/files/f/content", "GET"), ("/v1/batches", "GET")]
)
def test_the_batch_api_needs_the_key(path: str, method: str) -> None:
    assert guarded_status("s3cret", None, path, method) == 401
