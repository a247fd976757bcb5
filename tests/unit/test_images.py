"""Image inputs: decoded within limits and preprocessed exactly as transformers' PIL image processors
do it (server/vision/images.py), and image URLs fetched only where allowed (server/vision/image_fetch.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from common.modelfolder import read_model_folder
from common.settings import Settings
from engine.layers.pixels import normalised
from server.http.errors import APIError, bad_request
from server.vision import image_fetch, images
from tests.tiny_vision import build_clip, build_siglip, image_bytes

SETTINGS = Settings(max_image_bytes=200_000, max_image_pixels=1_000_000)
# every format, alpha and palette transparency, greyscale, wide and tall, smaller than the crop
CASES = [
    ("PNG", (48, 40), "RGB"),
    ("JPEG", (40, 61), "RGB"),
    ("WEBP", (70, 33), "RGB"),
    ("PNG", (50, 45), "RGBA"),
    ("WEBP", (45, 50), "RGBA"),
    ("PNG", (41, 39), "L"),
    ("PNG", (20, 12), "RGB"),
]


def processor(folder: Path) -> Any:
    from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

    kind = CLIPImageProcessorPil if "clip" in folder.name else SiglipImageProcessorPil
    return kind.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision")
    return {"clip": build_clip(root / "clip"), "siglip": build_siglip(root / "siglip")}


@pytest.mark.parametrize("family", ["clip", "siglip"])
@pytest.mark.parametrize(("fmt", "size", "mode"), CASES)
def test_preprocessing_equals_transformers(
    folders: dict[str, Path], family: str, fmt: str, size: tuple[int, int], mode: str
) -> None:
    """Decode, convert to RGB (alpha over white), resize and crop (the server: uint8, what it sends),
    rescale and normalise (the engine) give the very pixel values the folder's transformers image
    processor gives for the same file."""
    data = image_bytes(fmt, size, mode)
    vision = read_model_folder(folders[family]).vision
    assert vision is not None
    sent = images.preprocess(images.decode(data, SETTINGS, "input"), vision.steps)
    got = normalised([sent], vision.steps)[0]  # in the engine
    want = processor(folders[family])(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
    assert sent.dtype == np.uint8 and got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_data_url_and_bare_base64_read_alike() -> None:
    """A data: URL's payload and the same base64 alone are the same bytes."""
    data = image_bytes("PNG")
    encoded = base64.b64encode(data).decode()
    assert images.read_source(f"data:image/png;base64,{encoded}", SETTINGS, "input") == data
    assert images.read_source(encoded, SETTINGS, "input") == data


def refused(call: Any) -> str:
    with pytest.raises(APIError) as caught:
        call()
    assert caught.value.status == 400
    return caught.value.message


def test_corrupt_image_is_a_400_naming_its_index() -> None:
    """A PNG cut short fails to decode: 400 naming the input."""
    data = image_bytes("PNG", (64, 64))[:300]
    assert "input[2]" in refused(lambda: images.decode(data, SETTINGS, "input[2]"))


def test_other_formats_are_refused() -> None:
    """A GIF (or anything not PNG, JPEG, WebP) is not handed to any decoder."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="GIF")
    assert "not a PNG, JPEG or WebP" in refused(lambda: images.decode(out.getvalue(), SETTINGS, "input"))


def test_oversized_encoded_image_is_refused_before_decoding() -> None:
    """Base64 longer than WARMPOOL_MAX_IMAGE_BYTES allows is refused from its length alone."""
    payload = "A" * (SETTINGS.max_image_bytes // 3 * 4 + 8)
    assert "MAX_IMAGE_BYTES" in refused(lambda: images.read_source(payload, SETTINGS, "input"))


def bomb(width: int, height: int) -> bytes:
    """A valid PNG whose header claims width x height, with a tiny (unreadable) body."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def test_decompression_bomb_is_refused_from_its_header() -> None:
    """An image whose header claims more pixels than WARMPOOL_MAX_IMAGE_PIXELS is refused before a
    byte of it is decoded (no allocation of its size)."""
    assert "MAX_IMAGE_PIXELS" in refused(lambda: images.decode(bomb(50_000, 50_000), SETTINGS, "input"))


@pytest.fixture
def resizes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The sizes Pillow is asked to resize to (each an allocation of that many pixels)."""
    asked: list[tuple[int, int]] = []
    resize = Image.Image.resize

    def spy(image: Image.Image, size: tuple[int, int], *args: Any, **kwargs: Any) -> Image.Image:
        asked.append(size)
        return resize(image, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", spy)
    return asked


def test_an_extreme_aspect_ratio_is_refused_before_anything_is_resized(
    folders: dict[str, Path], resizes: list[tuple[int, int]]
) -> None:
    """A 1 x 2000 image (a few bytes; resized to the shortest edge it would be thousands of times its
    size) is a 400 naming WARMPOOL_MAX_IMAGE_ASPECT_RATIO, and nothing is resized."""
    vision = read_model_folder(folders["clip"]).vision
    assert vision is not None
    data = image_bytes("PNG", (1, 2000))
    message = refused(lambda: images.image_input(data, vision, Settings(), "input[1]"))
    assert "WARMPOOL_MAX_IMAGE_ASPECT_RATIO (200)" in message and "input[1]" in message
    assert resizes == []


def test_an_image_whose_resize_passes_the_pixel_limit_is_refused_before_it(
    folders: dict[str, Path], resizes: list[tuple[int, int]]
) -> None:
    """WARMPOOL_MAX_IMAGE_PIXELS bounds the image the resize would make, not only the one sent: 10 x 1500
    (15,000 pixels) resized to a 40-pixel shortest edge is 40 x 6000 (240,000): refused at 100,000."""
    vision = read_model_folder(folders["clip"]).vision
    assert vision is not None and vision.steps.shortest_edge == 40
    data = image_bytes("PNG", (10, 1500))
    message = refused(lambda: images.image_input(data, vision, Settings(max_image_pixels=100_000), "input"))
    assert "40 x 6000 resized" in message and "WARMPOOL_MAX_IMAGE_PIXELS (100000)" in message
    assert resizes == []
    images.image_input(data, vision, Settings(max_image_pixels=240_000), "input")  # at the limit: served
    assert resizes == [(40, 6000)]


def test_urls_are_refused_by_default() -> None:
    """WARMPOOL_IMAGE_URLS=off: an http(s) URL is a 400 that says how to send the image instead."""
    fetching = image_fetch.fetch("https://example.com/cat.png", Settings(), "input", time.monotonic() + 10)
    assert "WARMPOOL_IMAGE_URLS=off" in refused(lambda: asyncio.run(fetching))


def allowing(hosts: str) -> Settings:
    return Settings(image_urls="allowlist", image_url_allowlist=hosts)


def checked(url: str, settings: Settings, where: str) -> tuple[str, str, int, str]:
    return asyncio.run(image_fetch.check_url(url, settings, where))


def test_unlisted_host_is_refused() -> None:
    """With the allowlist on, a host it does not name is refused before any lookup."""
    assert "ALLOWLIST" in refused(lambda: checked("http://other.test/a.png", allowing("a.test"), "i"))


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "10.1.2.3", "::1"])
def test_non_public_address_is_refused_through_a_domain_entry(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    """`*.example.test` does not open loopback, link-local (cloud metadata) or private addresses: a name
    under it resolving there is refused; such an address needs its exact host listed."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    answer = [(family, socket.SOCK_STREAM, 6, "", (address, 80))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: answer)
    settings = allowing("*.example.test")
    assert "non-public" in refused(lambda: checked("http://img.example.test/a.png", settings, "i"))


def test_exactly_listed_loopback_host_is_allowed() -> None:
    """The allowlist naming 127.0.0.1 exactly lets it be fetched (a test server, a sidecar)."""
    assert checked("http://127.0.0.1:8080/a.png", allowing("127.0.0.1"), "i")[3] == "127.0.0.1"


def test_credentials_and_other_schemes_are_refused() -> None:
    """user:password@host and non-http schemes are never fetched."""
    settings = allowing("a.test")
    assert "credentials" in refused(lambda: checked("http://u:p@a.test/x.png", settings, "i"))
    assert "credentials" in refused(lambda: checked("ftp://a.test/x.png", settings, "i"))


class Fetches:
    """Stands in for image_fetch.fetch: answers each URL at once (a 404 for /bad), counting them."""

    def __init__(self) -> None:
        self.started = 0

    async def __call__(self, url: str, settings: Settings, where: str, deadline: float) -> bytes:
        self.started += 1
        if url.endswith("/bad"):
            raise bad_request(f"{where}: {url} answered HTTP 404", where)
        return url.encode()


def bodies_of(urls: list[tuple[str, str]], deadline: float, upto: int | None = None) -> tuple[list[bytes], Any]:
    """fetch_each's bodies, the first `upto` (all if None), and the error that ended it, if one did."""

    async def scenario() -> tuple[list[bytes], Any]:
        got: list[bytes] = []
        each = image_fetch.fetch_each(urls, allowing("a.test"), deadline)
        try:
            while upto is None or len(got) < upto:
                got.append(await anext(each))
        except (StopAsyncIteration, APIError) as exc:
            return got, exc
        finally:
            await each.aclose()
        return got, None

    return asyncio.run(scenario())


def test_a_requests_urls_are_fetched_a_window_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's URLs are fetched at most WINDOW ahead of the one it is decoding (the bodies it holds
    at once), in order."""
    fetches = Fetches()
    monkeypatch.setattr(image_fetch, "fetch", fetches)
    urls = [(f"http://a.test/{k}", f"input[{k}]") for k in range(10)]
    first, _ = bodies_of(urls, time.monotonic() + 10, upto=1)
    assert first == [b"http://a.test/0"] and fetches.started == image_fetch.WINDOW  # only the window
    got, _ = bodies_of(urls, time.monotonic() + 10)
    assert got == [url.encode() for url, _ in urls]


def test_a_failed_fetch_is_the_answer_where_its_url_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bodies before a failed URL come out; the failure is a 400 naming that URL's input."""
    monkeypatch.setattr(image_fetch, "fetch", Fetches())
    urls = [("http://a.test/0", "input[0]"), ("http://a.test/bad", "input[1]"), ("http://a.test/2", "input[2]")]
    got, failure = bodies_of(urls, time.monotonic() + 10)
    assert got == [b"http://a.test/0"]
    assert isinstance(failure, APIError) and failure.status == 400 and "input[1]" in failure.message


def test_a_fetch_that_never_began_is_a_503_and_the_rest_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """When no connection frees up by the deadline (other requests hold every one), the URL's answer is
    a 503 to retry (not the client's fault), and none of the request's fetches begins."""
    fetches = Fetches()
    monkeypatch.setattr(image_fetch, "fetch", fetches)

    async def scenario() -> APIError:
        slots = image_fetch._slots.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(image_fetch.FETCHERS))
        for _ in range(image_fetch.FETCHERS):
            await slots.acquire()
        each = image_fetch.fetch_each(
            [(f"http://a.test/{k}", f"input[{k}]") for k in range(6)], Settings(), time.monotonic() + 0.05
        )
        with pytest.raises(APIError) as caught:
            await anext(each)
        await each.aclose()
        return caught.value

    failure = asyncio.run(scenario())
    assert failure.status == 503 and "input[0]" in failure.message and failure.headers == {"Retry-After": "1"}
    assert fetches.started == 0


def test_a_fetch_begun_past_the_deadline_times_out_without_connecting() -> None:
    """A fetch whose request's deadline has passed (it waited for a connection) is a 400 'timed out'
    before any lookup or connection (port 1 would refuse one)."""
    late = time.monotonic() - 1
    fetching = image_fetch.fetch("http://127.0.0.1:1/a.png", allowing("127.0.0.1"), "input", late)
    assert "timed out" in refused(lambda: asyncio.run(fetching))
