"""Image URLs on the request path (server/vision/url_images.py, server/vision/image_fetch.py): fetched on the event
loop, never by the executor threads that tokenize every request, each fetch bounded by its request's
deadline in every phase, whatever its host's byte rate."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from common.modelfolder import read_model_folder
from common.settings import Settings
from common.startup import StartupState
from server.core.inputs import RequestContext
from server.core.pipeline import Prepared, prepare_in_time
from server.core.services import ServedModel, Services
from server.http.errors import APIError
from server.tokenizing.tokenizer import TokenizerPool
from server.vision import image_fetch, multimodal
from tests.image_host import png_host
from tests.tiny_vision import build_clip


def allowing(timeout: float) -> Settings:
    return Settings(image_urls="allowlist", image_url_allowlist="127.0.0.1", image_url_timeout=timeout)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_clip(tmp_path_factory.mktemp("vision") / "clip")


def services(clip: Path, threads: int) -> Services:
    svc = Services(settings=Settings(), startup=StartupState(), executor=ThreadPoolExecutor(threads))
    svc.models["clip"] = ServedModel("clip", read_model_folder(clip), TokenizerPool(clip), engine=None)  # type: ignore[arg-type]
    return svc


class Host:
    """A loopback host that takes connections and answers each with `answer(connection)` on a thread
    of its own, counting them; stopped, it closes them all."""

    def __init__(self, answer: Any) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stop = threading.Event()
        self.connections: list[socket.socket] = []
        self.answer = answer
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(connection)
            threading.Thread(target=self.answer, args=(connection, self.stop), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for connection in self.connections:
            connection.close()


def hang(connection: socket.socket, stop: threading.Event) -> None:
    """A host that never answers (a dead backend behind a live address)."""
    stop.wait()


def trickle(connection: socket.socket, stop: threading.Event) -> None:
    """A host that sends one byte every 0.2 s and never finishes its status line."""
    while not stop.wait(0.2):
        try:
            connection.sendall(b"H")
        except OSError:
            return


@pytest.fixture
def hanging() -> Iterator[Host]:
    host = Host(hang)
    yield host
    host.close()


@pytest.fixture
def trickling() -> Iterator[Host]:
    host = Host(trickle)
    yield host
    host.close()


@pytest.fixture
def good() -> Iterator[str]:
    with png_host() as url:
        yield f"{url}/cat.png"


def prepared(svc: Services, body: dict[str, Any], settings: Settings) -> asyncio.Task[Prepared[Any]]:
    """One request's preparation (/v1/embeddings' multimodal shape), as the pipeline runs it."""
    loop = asyncio.get_running_loop()
    ctx = RequestContext(svc.models["clip"], svc.models, settings, svc.admission)
    raw = orjson.dumps(body)
    return loop.create_task(prepare_in_time(svc, multimodal.prepare, raw, ctx, loop.create_future(), loop.time() + 60))


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_a_text_is_prepared_while_image_hosts_hang(clip: Path, hanging: Host) -> None:
    """Requests whose image URLs hang on a dead host, as many as the executor has threads, do not
    hold those threads: a text request is prepared while their fetches still wait (their deadline,
    WARMPOOL_IMAGE_URL_TIMEOUT, 30 s away)."""
    svc = services(clip, threads=2)

    async def scenario() -> None:
        settings = allowing(timeout=30)
        images = [prepared(svc, {"input": [f"{hanging.url}/{k}.png"], "modality": "image"}, settings) for k in range(2)]
        await until(lambda: len(hanging.connections) == 2, "both fetches connected")
        text = prepared(svc, {"input": ["a photo of a cat"]}, settings)
        done, _ = await asyncio.wait([text, *images], return_when=asyncio.FIRST_COMPLETED)
        assert done == {text} and len(text.result().tokens) == 1
        for task in images:
            task.cancel()
        await asyncio.wait(images)

    try:
        asyncio.run(scenario())
    finally:
        svc.executor.shutdown(wait=False, cancel_futures=True)


def test_a_trickling_host_holds_no_connection_past_its_requests_deadline(
    clip: Path, trickling: Host, good: str
) -> None:
    """A host that sends a byte every 0.2 s and never finishes its status line, named by as many
    requests as there are connections: each of those ends at its request's deadline, a 400 'timed
    out', and lets go of its connection, so another request's good URL is fetched (not a 503)."""
    svc = services(clip, threads=image_fetch.FETCHERS + 2)  # the executor is not what is tested here

    async def scenario() -> None:
        slow = [
            prepared(svc, {"input": [f"{trickling.url}/{k}.png"], "modality": "image"}, allowing(timeout=1.0))
            for k in range(image_fetch.FETCHERS)
        ]
        await until(lambda: len(trickling.connections) == image_fetch.FETCHERS, "every connection trickling")
        fine = await prepared(svc, {"input": [good], "modality": "image"}, allowing(timeout=20))
        assert isinstance(fine.tokens[0].pixels, np.ndarray)
        for task in slow:
            with pytest.raises(APIError) as caught:
                await task
            assert caught.value.status == 400 and "timed out" in caught.value.message

    try:
        asyncio.run(scenario())
    finally:
        svc.executor.shutdown(wait=False, cancel_futures=True)


def test_chunked_and_interim_answers_are_read_as_http_client_read_them() -> None:
    """The fetch's own HTTP/1.1 reading: a 100 Continue skipped, a chunked body (with an extension)
    joined, and a body without a length read up to the close."""
    answers = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\nuntil-close",
    ]

    def answer(connection: socket.socket, stop: threading.Event) -> None:
        connection.recv(4096)
        connection.sendall(answers.pop(0))
        connection.close()

    host = Host(answer)
    try:
        got = [asyncio.run(image_fetch.fetch(f"{host.url}/a.png", allowing(timeout=10), "input")) for _ in range(2)]
    finally:
        host.close()
    assert got == [b"abcde", b"until-close"]
