"""Image inputs of a CLIP or SigLIP model: from the request (a data: URL or base64; an http(s) URL
only where WARMPOOL_IMAGE_URLS allows, server/vision/url_images.py), decoded by Pillow within limits,
then resized and cropped exactly as transformers' PIL image processor does it (common.vision.ImageSteps;
the engine rescales and normalises).

Runs on the executor, like tokenizing: decoding and resizing hold a core for milliseconds. Every
failure is a 400 naming the input (`where`): a client's bad image never reaches the engine.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import threading
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from common.cpus import usable_cpus
from common.settings import Settings
from common.vision import ImageSteps, Vision
from common.wire import Tokens
from server.http.errors import APIError, bad_request, field_of

FORMATS = ("PNG", "JPEG", "WEBP")  # the decoders Pillow may use: nothing else is tried on a request's bytes
# WARMPOOL_MAX_IMAGE_PIXELS is checked from the header before anything is decoded (decode()): Pillow's
# own process-wide bomb check (a warning past 89 Mpx, an error past twice that) would override the setting
Image.MAX_IMAGE_PIXELS = None
# Decoding and resizing hold a core for milliseconds an image (Pillow lets go of the GIL meanwhile), so
# every executor thread at it took both cores of a 2-core machine, and a probe waited for the event
# loop to get one: at 32 clients of images, probe p99 9.3 ms with the four at it, 7.5 with one at a
# time, the same images/s (bench.paired --images: 1.01x). One core is left to the rest.
DECODING = threading.BoundedSemaphore(max(1, usable_cpus() - 1))


@dataclass(frozen=True)
class Picture:
    """What Cohere's embed answer reports of each image: as sent, before any conversion."""

    width: int
    height: int
    format: str  # png, jpeg or webp
    bit_depth: int  # bits per pixel, all channels (24 for RGB, 32 for RGBA, 8 for grey or a palette)


def image_input(data: bytes, vision: Vision, settings: Settings, where: str) -> tuple[Tokens, Picture]:
    """An image's bytes as an engine input (its pixels, and one placeholder id per position the image
    tower computes on: batching and usage count an image by that work), and what it was."""
    with DECODING:
        image, picture = opened(data, settings, where, vision.steps)
        pixels = preprocess(image, vision.steps)
    return Tokens([0] * vision.positions, pixels=pixels), picture


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def read_source(source: str, settings: Settings, where: str) -> bytes:
    """The encoded image a data: URL or bare base64 holds, its size checked before it is decoded from
    base64 (an http(s) URL is fetched on the event loop: server/vision/url_images.py)."""
    payload = source
    if source.startswith("data:"):
        header, comma, payload = source.partition(",")
        if not comma or not header.endswith(";base64"):
            raise bad_request(f"{where}: a data: URL must be base64 (data:image/png;base64,...)", field_of(where))
    payload = payload.strip()
    if len(payload) // 4 * 3 > settings.max_image_bytes:  # the decoded size, without decoding
        raise too_large(where, settings)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(
            f"{where} is neither a data: URL, an http(s) URL nor base64 of an image", field_of(where)
        ) from None


def too_large(where: str, settings: Settings) -> APIError:
    return bad_request(
        f"{where} is larger than WARMPOOL_MAX_IMAGE_BYTES ({settings.max_image_bytes} bytes)", field_of(where)
    )


def decode(data: bytes, settings: Settings, where: str, steps: ImageSteps | None = None) -> Image.Image:
    """A PNG, JPEG or WebP as RGB, transparency composited onto white (transformers' convert_to_rgb).
    Its size is read from the header first: past the limits (check_size()) nothing is decoded."""
    return opened(data, settings, where, steps)[0]


def opened(data: bytes, settings: Settings, where: str, steps: ImageSteps | None = None) -> tuple[Image.Image, Picture]:
    """decode()'s RGB image, and the image as it was sent."""
    field = field_of(where)
    if len(data) > settings.max_image_bytes:
        raise too_large(where, settings)
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)  # the header only: nothing decoded yet
        width, height = image.size
        check_size(width, height, settings, where, steps)
        image.load()
        bits = _MODE_BITS.get(image.mode, 8 * len(image.getbands()))
        return _rgb(image), Picture(width, height, str(image.format).lower(), bits)
    except APIError:
        raise
    except UnidentifiedImageError:
        raise bad_request(f"{where} is not a PNG, JPEG or WebP image", field) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # what Pillow raises for a corrupt file
        raise bad_request(f"{where} could not be decoded: {exc}", field) from None


def check_size(width: int, height: int, settings: Settings, where: str, steps: ImageSteps | None) -> None:
    """The limits on what an image of this header makes us allocate, checked before any of it is: its
    aspect ratio (WARMPOOL_MAX_IMAGE_ASPECT_RATIO), and its pixels as decoded and as `steps` resize
    them (WARMPOOL_MAX_IMAGE_PIXELS: a 1 x 2000 image resized to a 224-pixel shortest edge would be
    224 x 448000, before the crop)."""
    field = field_of(where)
    ratio = max(width, height) / max(1, min(width, height))
    if ratio > settings.max_image_aspect_ratio:
        raise bad_request(
            f"{where} is {width} x {height} pixels, an aspect ratio past WARMPOOL_MAX_IMAGE_ASPECT_RATIO "
            f"({settings.max_image_aspect_ratio:g})",
            field,
        )
    resized = resized_size(width, height, steps) if steps is not None else (height, width)
    for what, (h, w) in (("", (height, width)), (" resized", resized)):
        if h * w > settings.max_image_pixels:
            raise bad_request(
                f"{where} is {width} x {height} pixels, {w} x {h}{what}: more than WARMPOOL_MAX_IMAGE_PIXELS "
                f"({settings.max_image_pixels}) allows",
                field,
            )


_MODE_BITS = {"1": 1, "I;16": 16, "I": 32, "F": 32}  # Pillow's modes whose bands are not 8 bits each


def _rgb(image: Image.Image) -> Image.Image:
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")  # convert() would copy an RGB one


def resized_shape(width: int, height: int, shortest: int) -> tuple[int, int]:
    """(height, width) with the shortest edge at `shortest`, the other scaled and floored
    (transformers' get_resize_output_image_size, default_to_square=False)."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shortest * long / short)
    return (new_long, shortest) if width <= height else (shortest, new_long)


def resized_size(width: int, height: int, steps: ImageSteps) -> tuple[int, int]:
    """(height, width) of the image `steps` resize, before any crop."""
    if steps.shortest_edge is not None:
        return resized_shape(width, height, steps.shortest_edge)
    return steps.size if steps.size is not None else (height, width)


def preprocess(image: Image.Image, steps: ImageSteps) -> np.ndarray:
    """RGB image -> uint8 [3, H, W]: resized and centre-cropped as the PIL image processor does it;
    the engine rescales and normalises (engine/layers/pixels.py: a quarter of the bytes on the pipe)."""
    if steps.shortest_edge is not None or steps.size is not None:
        height, width = resized_size(image.width, image.height, steps)
        image = image.resize((width, height), resample=Image.Resampling(steps.resample))
    pixels: np.ndarray = np.asarray(image).transpose(2, 0, 1)  # [3, H, W] uint8
    if steps.crop is not None:
        pixels = center_crop(pixels, steps.crop)
    return np.ascontiguousarray(pixels)  # one compact array to pickle, not a view of the whole image


def center_crop(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[C, H, W] cropped to size (h, w) about its centre; zero-padded first where it is smaller
    (transformers' center_crop)."""
    _, height, width = pixels.shape
    crop_h, crop_w = size
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top : top + crop_h, left : left + crop_w]
    new_h, new_w = max(crop_h, height), max(crop_w, width)
    canvas = np.zeros((pixels.shape[0], new_h, new_w), dtype=pixels.dtype)
    top_pad, left_pad = math.ceil((new_h - height) / 2), math.ceil((new_w - width) / 2)
    canvas[:, top_pad : top_pad + height, left_pad : left_pad + width] = pixels
    top, left = top + top_pad, left + left_pad
    return canvas[:, max(0, top) : min(new_h, top + crop_h), max(0, left) : min(new_w, left + crop_w)]
