"""Image inputs given as http(s) URLs: fetched only where WARMPOOL_IMAGE_URLS=allowlist, only from the
hosts WARMPOOL_IMAGE_URL_ALLOWLIST names, within a size, time and redirect limit.

No server-side request forgery: the host is resolved once here and the connection goes to the very
address checked (a second lookup could answer otherwise); a loopback, link-local or private or other
non-global address is refused unless the allowlist names that exact host (not through a `*.domain`
entry); every redirect is a new URL checked the same way.

Fetched on the event loop (asyncio streams, a minimal HTTP/1.1 GET), never on the executor that
tokenizes: a host that hangs or trickles costs a socket, not a thread. The request's deadline bounds
every phase (lookup, connect, TLS, status line, headers, body) as one asyncio.timeout, whatever the
host's byte rate. A request's URLs are fetched WINDOW at a time ahead of their decoding (its time is
about its slowest fetch's, not their sum); FETCHERS connections at most are open at once, all requests
together. The lookup (getaddrinfo blocks) runs on RESOLVERS threads of its own, awaited within the deadline.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
import time
import weakref
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urljoin, urlsplit

from common.settings import Settings
from server.http.errors import APIError, bad_request, field_of

CHUNK = 64 * 1024
LINE = 64 * 1024  # the longest status or header line read (as http.client's)
HEADERS = 100  # headers an answer may carry (as http.client's)
REDIRECTS = (301, 302, 303, 307, 308)
FETCHERS = 8  # connections open at once, all requests together
WINDOW = 4  # a request's fetches under way or fetched and not yet decoded: its bodies held at once
RESOLVERS = 4
_resolvers = ThreadPoolExecutor(RESOLVERS, thread_name_prefix="warmpool-image-dns")
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
_UNSAFE = re.compile("[\x00-\x20\x7f]")  # what http.client refuses in a request target


async def fetch_each(urls: list[tuple[str, str]], settings: Settings, deadline: float) -> AsyncGenerator[bytes, None]:
    """Each (url, where)'s body in order (fetch(), once a connection is free), WINDOW begun at once,
    the next as each is taken. A failure raises where its URL comes; the fetches under way are
    cancelled when the generator is closed."""
    started: list[asyncio.Task[bytes] | None] = []
    try:
        for i in range(len(urls)):
            while len(started) < min(i + WINDOW, len(urls)):  # one more as one is taken: WINDOW held at most
                url, where = urls[len(started)]
                started.append(asyncio.ensure_future(_fetch_when_free(url, settings, where, deadline)))
            task, started[i] = started[i], None  # its body is the caller's now: not held here for the rest
            assert task is not None
            yield await task
    finally:
        for task in started:
            if task is not None:
                drop(task)


def drop(task: asyncio.Future[Any]) -> None:
    """Cancelled if under way; its failure, if it has one, taken (nobody awaits it now)."""
    if not task.cancel() and not task.cancelled():
        task.exception()


async def _fetch_when_free(url: str, settings: Settings, where: str, deadline: float) -> bytes:
    slots = _slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(FETCHERS))
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            await slots.acquire()
    except TimeoutError:
        raise APIError(
            503, f"{where}: no image URL fetcher was free in time; retry", code="busy", headers={"Retry-After": "1"}
        ) from None
    try:
        return await fetch(url, settings, where, deadline)
    finally:
        slots.release()


def allowlist(settings: Settings) -> tuple[frozenset[str], tuple[str, ...]]:
    """The exact hosts, and the domain suffixes (`*.example.com` -> `.example.com`) listed."""
    entries = [e.strip().lower() for e in (settings.image_url_allowlist or "").split(",") if e.strip()]
    return frozenset(e for e in entries if not e.startswith("*.")), tuple(e[1:] for e in entries if e.startswith("*."))


def allowed(url: str, settings: Settings, where: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL the settings let be fetched, before any lookup; else a 400."""
    field = field_of(where)
    if settings.image_urls != "allowlist":
        raise bad_request(
            f"{where}: image URLs are not fetched (WARMPOOL_IMAGE_URLS=off); send the image as a data: URL or base64",
            field,
        )
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host or parts.username or parts.password:
        raise bad_request(f"{where}: only http(s) URLs without credentials are fetched", field)
    exact, suffixes = allowlist(settings)
    if host not in exact and not host.endswith(suffixes or ("\0",)):
        raise bad_request(f"{where}: host {host!r} is not in WARMPOOL_IMAGE_URL_ALLOWLIST", field)
    try:
        return parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise bad_request(f"{where}: {exc}", field) from None


async def check_url(url: str, settings: Settings, where: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, address to connect to) for a URL that may be fetched; else a 400."""
    field = field_of(where)
    scheme, host, port = allowed(url, settings, where)
    try:
        infos = await asyncio.wrap_future(_resolvers.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM))
    except (OSError, ValueError) as exc:
        raise bad_request(f"{where}: host {host!r} could not be resolved: {exc}", field) from None
    address = str(infos[0][4][0])
    if not ipaddress.ip_address(address.split("%")[0]).is_global and host not in allowlist(settings)[0]:
        raise bad_request(
            f"{where}: {host!r} resolves to {address}, a non-public address, fetched only from a host the "
            "allowlist names exactly",
            field,
        )
    return scheme, host, port, address


async def fetch(url: str, settings: Settings, where: str, deadline: float | None = None) -> bytes:
    """The URL's body (following at most WARMPOOL_IMAGE_URL_REDIRECTS redirects, each checked), within
    WARMPOOL_MAX_IMAGE_BYTES and by `deadline` (time.monotonic(); the request's, else
    WARMPOOL_IMAGE_URL_TIMEOUT from now), every phase of every fetch included; else a 400 naming `where`."""
    field = field_of(where)
    left = settings.image_url_timeout if deadline is None else deadline - time.monotonic()
    if left <= 0:  # a fetch that waited its whole time for a connection: no lookup, no connection
        raise bad_request(f"{where}: fetching {url} timed out", field)
    try:
        async with asyncio.timeout(left):
            return await _follow(url, settings, where)
    except TimeoutError:
        raise bad_request(f"{where}: fetching {url} timed out", field) from None


async def _follow(url: str, settings: Settings, where: str) -> bytes:
    field = field_of(where)
    for _ in range(settings.image_url_redirects + 1):
        scheme, host, port, address = await check_url(url, settings, where)
        try:
            status, location, body = await _get(url, scheme, host, port, address, settings.max_image_bytes, where)
        except (OSError, ValueError, EOFError) as exc:  # refused, reset, TLS, not HTTP, cut short
            raise bad_request(f"{where}: fetching {url} failed: {exc}", field) from None
        if status in REDIRECTS and location:
            url = urljoin(url, location)
            continue
        if status != 200:
            raise bad_request(f"{where}: {url} answered HTTP {status}", field)
        return body
    raise bad_request(f"{where}: more than {settings.image_url_redirects} redirects", field)


async def _get(
    url: str, scheme: str, host: str, port: int, address: str, limit: int, where: str
) -> tuple[int, str | None, bytes]:
    """One GET to `address`, in the name of `host` (Host header; SNI and the certificate for https)."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if _UNSAFE.search(target):
        raise ValueError("the URL's path holds spaces or control characters")
    name = f"[{host}]" if ":" in host else host
    authority = name if port == (443 if scheme == "https" else 80) else f"{name}:{port}"
    tls = _tls() if scheme == "https" else None
    reader, writer = await asyncio.open_connection(
        address, port, ssl=tls, server_hostname=host if tls else None, limit=LINE
    )
    try:
        head = f"GET {target} HTTP/1.1\r\nHost: {authority}\r\nAccept: image/*\r\nConnection: close\r\n\r\n"
        writer.write(head.encode("ascii"))
        status, headers = await _head(reader)
        if status != 200:
            return status, headers.get("location"), b""
        return 200, None, await _body(reader, headers, limit, where, url)
    finally:
        writer.transport.abort()  # Connection: close, and nothing more to read: no closing handshake awaited


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every https fetch: making one reads the CA bundle (milliseconds of CPU, on
    the event loop)."""
    return ssl.create_default_context()


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The final answer's status and headers (names lower-cased); 1xx interim answers skipped."""
    while True:
        line = await reader.readline()
        version, _, rest = line.decode("latin-1").partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise ValueError(f"not an HTTP/1 status line: {line[:40]!r}")
        headers: dict[str, str] = {}
        for _ in range(HEADERS + 1):
            line = await reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line.endswith(b"\n"):
                raise EOFError("the connection closed within the headers")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise ValueError(f"more than {HEADERS} headers")
        if int(rest[:3]) >= 200:
            return int(rest[:3]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str], limit: int, where: str, url: str) -> bytes:
    """The body, chunked, of a Content-Length or up to the close; past `limit` a 400 before it is all read."""
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = headers.get("content-length", "")
    if not chunked and length.isdigit():
        if int(length) > limit:
            raise _too_large(where, url, limit)
        return await reader.readexactly(int(length))
    chunks: list[bytes] = []
    size = 0
    while True:
        if chunked:
            n = int(((await reader.readline()).split(b";", 1)[0].strip() or b"-"), 16)
            chunk = await reader.readexactly(n) if n else b""
            if n:
                await reader.readexactly(2)  # the CRLF after a chunk
        else:
            chunk = await reader.read(CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise _too_large(where, url, limit)
        chunks.append(chunk)


def _too_large(where: str, url: str, limit: int) -> APIError:
    return bad_request(f"{where}: {url} is larger than WARMPOOL_MAX_IMAGE_BYTES ({limit} bytes)", field_of(where))
