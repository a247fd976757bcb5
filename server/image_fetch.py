"""Image inputs given as http(s) URLs: fetched only where WARMPOOL_IMAGE_URLS=allowlist, only from the
hosts WARMPOOL_IMAGE_URL_ALLOWLIST names, within a size, time and redirect limit.

No server-side request forgery: the host is resolved once here and the connection goes to the very
address checked (a second lookup could answer otherwise); a loopback, link-local, private or other
non-global address is refused unless the allowlist names that exact host (not through a `*.domain`
entry); every redirect is a new URL checked the same way. Blocking sockets, on threads of their own:
a request's URLs are fetched WINDOW at a time (its time is about its slowest fetch's, not their
sum), by FETCHERS threads shared by every request (no number of requests opens more connections).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeout
from urllib.parse import urljoin, urlsplit

from common.settings import Settings
from server.errors import APIError, bad_request, field_of

CHUNK = 64 * 1024
REDIRECTS = (301, 302, 303, 307, 308)
FETCHERS = 8  # connections open at once, all requests together
WINDOW = 4  # a request's fetches under way or fetched and not yet decoded: its bodies held at once
GRACE_S = 1.0  # past the deadline, for a fetch that had to wait for a thread to see it and say so
_pool = ThreadPoolExecutor(FETCHERS, thread_name_prefix="warmpool-image-url")


def fetch_each(urls: list[tuple[str, str]], settings: Settings, deadline: float) -> Generator[bytes, None, None]:
    """Each (url, where)'s body in order (fetch()), the first WINDOW begun now, before anything else
    of the request is decoded, the next as each is taken. A failure raises where its URL comes; the
    fetches not yet begun are dropped when the generator is closed."""
    started: list[Future[bytes]] = []

    def begin(upto: int) -> None:
        while len(started) < min(upto, len(urls)):
            url, where = urls[len(started)]
            started.append(_pool.submit(fetch, url, settings, where, deadline))

    begin(WINDOW)
    return _bodies(urls, started, begin, deadline)


def _bodies(
    urls: list[tuple[str, str]], started: list[Future[bytes]], begin: Callable[[int], None], deadline: float
) -> Generator[bytes, None, None]:
    try:
        for i, (url, where) in enumerate(urls):
            begin(i + WINDOW)  # one more as one is taken: WINDOW held at most
            try:
                yield started[i].result(timeout=max(0.0, deadline - time.monotonic()) + GRACE_S)
            except WaitTimeout:
                if started[i].cancel():  # never began: every fetcher was busy with other requests' URLs
                    raise APIError(
                        503, f"{where}: no image URL fetcher was free in time; retry", code="busy",
                        headers={"Retry-After": "1"},
                    ) from None  # fmt: skip
                raise bad_request(f"{where}: fetching {url} timed out", field_of(where)) from None
            started[i] = Future()  # its body is the caller's now: not held here for the rest
    finally:
        for future in started:
            future.cancel()


def allowlist(settings: Settings) -> tuple[frozenset[str], tuple[str, ...]]:
    """The exact hosts, and the domain suffixes (`*.example.com` -> `.example.com`) listed."""
    entries = [e.strip().lower() for e in (settings.image_url_allowlist or "").split(",") if e.strip()]
    return frozenset(e for e in entries if not e.startswith("*.")), tuple(e[1:] for e in entries if e.startswith("*."))


def check_url(url: str, settings: Settings, where: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, address to connect to) for a URL that may be fetched; else a 400."""
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
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:
        raise bad_request(f"{where}: host {host!r} could not be resolved: {exc}", field) from None
    address = str(infos[0][4][0])
    if not ipaddress.ip_address(address.split("%")[0]).is_global and host not in exact:
        raise bad_request(
            f"{where}: {host!r} resolves to {address}, a non-public address, fetched only from a host the "
            "allowlist names exactly",
            field,
        )
    return parts.scheme, host, port, address


def fetch(url: str, settings: Settings, where: str, deadline: float | None = None) -> bytes:
    """The URL's body (following at most WARMPOOL_IMAGE_URL_REDIRECTS redirects, each checked), within
    WARMPOOL_MAX_IMAGE_BYTES and by `deadline` (time.monotonic(); the request's, else
    WARMPOOL_IMAGE_URL_TIMEOUT from now); else a 400 naming `where`."""
    field = field_of(where)
    deadline = time.monotonic() + settings.image_url_timeout if deadline is None else deadline
    for _ in range(settings.image_url_redirects + 1):
        try:
            _left(deadline)  # a fetch that began late (every fetcher busy) or after a slow redirect
            scheme, host, port, address = check_url(url, settings, where)
            status, location, body = _get(url, scheme, host, port, address, deadline, settings.max_image_bytes, where)
        except APIError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else f"failed: {exc}"
            raise bad_request(f"{where}: fetching {url} {reason}", field) from None
        if status in REDIRECTS and location:
            url = urljoin(url, location)
            continue
        if status != 200:
            raise bad_request(f"{where}: {url} answered HTTP {status}", field)
        return body
    raise bad_request(f"{where}: more than {settings.image_url_redirects} redirects", field)


def _get(
    url: str, scheme: str, host: str, port: int, address: str, deadline: float, limit: int, where: str
) -> tuple[int, str | None, bytes]:
    """One GET to `address`, in the name of `host` (Host header; SNI and the certificate for https)."""
    sock = socket.create_connection((address, port), timeout=_left(deadline))
    try:
        if scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        conn = http.client.HTTPConnection(host, port, timeout=_left(deadline))
        conn.sock = sock
        parts = urlsplit(url)
        conn.request(
            "GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers={"Accept": "image/*"}
        )
        response = conn.getresponse()
        if response.status != 200:
            return response.status, response.getheader("Location"), b""
        length = response.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _too_large(where, url, limit)
        chunks, size = [], 0
        # read1: what one receive brings, each bounded by the time left (read() would wait for a whole
        # chunk, a byte at a time from a host that trickles, past the deadline)
        while True:
            sock.settimeout(_left(deadline))
            chunk = response.read1(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise _too_large(where, url, limit)
            chunks.append(chunk)
        return 200, None, b"".join(chunks)
    finally:
        sock.close()


def _too_large(where: str, url: str, limit: int) -> APIError:
    return bad_request(f"{where}: {url} is larger than WARMPOOL_MAX_IMAGE_BYTES ({limit} bytes)", field_of(where))


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left
