"""Slow and stalled clients cannot take the server down: bounded header and body reads."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import ServerProcess, wait_for

READ_TIMEOUT_S = 1.5


@pytest.fixture(scope="module")
def guarded(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with 2 admission permits and a short read timeout."""
    log = tmp_path_factory.mktemp("logs") / "slow.log"
    server = ServerProcess(model_dir, log, max_concurrent_inputs=2, read_timeout=READ_TIMEOUT_S).wait_ready()
    yield server
    server.stop()


def connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def stalled_upload(server: ServerProcess) -> socket.socket:
    """Headers that promise a 1000-byte body, then only 10 bytes of it."""
    sock = connect(server)
    head = "POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
    sock.sendall(head.encode() + b'{"input": ')
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_stalled_uploads_do_not_starve_admitted_work(guarded: ServerProcess) -> None:
    """More stalled uploads than permits: a complete request is still served, since bodies are read
    before any permit is taken."""
    stalled = [stalled_upload(guarded) for _ in range(4)]
    try:
        r = guarded.post("/v1/embeddings", json={"input": "a complete request"})
        assert r.status_code == 200, r.text
    finally:
        for sock in stalled:
            sock.close()


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_the_connection_closes(guarded: ServerProcess) -> None:
    """Past the read timeout a stalled body gets 408 in the OpenAI shape, then the connection closes."""
    sock = stalled_upload(guarded)
    with sock:
        answer = read_all(sock)  # returns once the server closes: no hang
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"request_timeout"' in body


def test_headers_that_never_complete_are_cut_off(guarded: ServerProcess) -> None:
    """A connection that sends half a request line (a slowloris) is closed by the server."""
    sock = connect(guarded)
    with sock:
        sock.sendall(b"POST /v1/embeddings HT")
        assert read_all(sock) == b""  # closed without an answer, instead of held forever


def test_an_idle_connection_is_cut_off(guarded: ServerProcess) -> None:
    """A connection that sends nothing at all is closed too."""
    with connect(guarded) as sock:
        assert read_all(sock) == b""


def test_permits_are_all_free_afterwards(guarded: ServerProcess) -> None:
    """Timed-out and abandoned uploads give back every permit."""
    wait_for(lambda: "warmpool_inputs_in_flight 0.0" in guarded.get("/metrics").text, 10, "permits back to 0")


def test_a_client_answered_before_its_body_cannot_hold_the_connection(guarded: ServerProcess) -> None:
    """Answered before its body arrived (413 from Content-Length), a client that then sends a byte
    and falls silent is cut off instead of holding the connection forever."""
    sock = connect(guarded)
    with sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999\r\n\r\n{")
        answer = read_all(sock)  # returns once the server closes
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]


def send_until_answered(sock: socket.socket, head: bytes, rest: bytes, chunk: int = 16384) -> tuple[int, bytes]:
    """Sends head, then rest chunk by chunk until the server answers; (bytes sent, the answer)."""
    import select

    sock.sendall(head)
    sent = len(head)
    for start in range(0, len(rest), chunk):
        if select.select([sock], [], [], 0.05)[0]:
            break  # the server has answered: stop sending
        sock.sendall(rest[start : start + chunk])
        sent += chunk
    return sent, read_all(sock)


def test_a_header_larger_than_the_cap_is_refused_431_while_it_arrives(guarded: ServerProcess) -> None:
    """A 4 MiB header value is answered 431 in OpenAI's error shape, with connection: close, once
    about 64 KiB of it have arrived: the server never reads the rest."""
    with connect(guarded) as sock:
        head = b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\nx-big: "
        sent, answer = send_until_answered(sock, head, b"a" * (4 << 20))
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431 ") and b"connection: close" in status
    assert b"request headers longer than 65536 bytes" in body and b'"type": "invalid_request_error"' in body
    assert sent < 1 << 20
    assert guarded.get("/health/live").status_code == 200


def test_a_request_line_longer_than_the_cap_is_refused_414(guarded: ServerProcess) -> None:
    """A 1 MiB request target is answered 414."""
    with connect(guarded) as sock:
        _, answer = send_until_answered(sock, b"GET /v1/models?q=", b"b" * (1 << 20))
    assert answer.startswith(b"HTTP/1.1 414 ") and b"request line longer than 65536 bytes" in answer


def test_more_headers_than_the_cap_are_refused_431(guarded: ServerProcess) -> None:
    """129 headers, each small, are answered 431 naming the count."""
    headers = b"".join(b"x-h%d: v\r\n" % i for i in range(129))
    with connect(guarded) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"more than 128 request headers" in answer


def test_a_head_just_under_the_caps_is_served(guarded: ServerProcess) -> None:
    """60 KiB of headers in 120 of them, the body after them in the same writes, is served as usual."""
    headers = {f"x-h{i}": "v" * 500 for i in range(120)}
    response = guarded.post("/v1/embeddings", json={"input": "hello"}, headers=headers)
    assert response.status_code == 200 and len(response.json()["data"]) == 1
