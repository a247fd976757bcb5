"""An image group's pixels: the server's uint8 images (resized and cropped) to the image tower's
float32 input, rescaled and normalised as transformers' PIL image processor computes them.

The server sends pixels as bytes, a quarter of float32's size (3 x 224 x 224: 150 KB, not 600), so
the HTTP process pickles and the engine receives a quarter as much, and the engine looks each value
up in a 256-entry table as it fills the group's batch: one pass it made anyway to stack the images.
"""

from __future__ import annotations

import functools

import numpy as np

from common.vision import ImageSteps


@functools.lru_cache(maxsize=16)
def value_table(steps: ImageSteps) -> np.ndarray:
    """float32 [3, 256]: each channel's uint8 values rescaled and normalised as the PIL image processor
    computes them (uint8 to float64, rescaled, cast to float32, then float32 mean and std). Each value's
    arithmetic is its own, so a pixel looked up is the pixel computed, bit for bit: 0.19 ms instead of
    0.68 for a 224 x 224 image."""
    values = np.arange(256, dtype=np.uint8)
    scaled = (
        (values.astype(np.float64) * steps.rescale).astype(np.float32) if steps.rescale else values.astype(np.float32)
    )
    out = np.broadcast_to(scaled, (3, 256))
    if steps.mean is not None and steps.std is not None:
        mean, std = np.array(steps.mean, dtype=np.float32), np.array(steps.std, dtype=np.float32)
        out = (out - mean[:, None]) / std[:, None]
    return np.ascontiguousarray(out, dtype=np.float32)


def normalised(images: list[np.ndarray], steps: ImageSteps) -> np.ndarray:
    """uint8 [3, H, W] images (all one shape) -> float32 [B, 3, H, W], each value through the table."""
    table = value_table(steps)
    out = np.empty((len(images), *images[0].shape), dtype=np.float32)
    for image, rows in zip(images, out, strict=True):
        for channel, values in enumerate(image):
            # uint8 values are never out of range: "wrap" skips the bounds-checked copy "raise" makes
            np.take(table[channel], values, out=rows[channel], mode="wrap")
    return out
