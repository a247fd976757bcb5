"""CLIP and SigLIP folders: a text tower and an image tower into one vector space, read from config
files alone (no torch, no PIL): the towers' shapes, the text side's pooling, and the image
preprocessing its preprocessor_config.json asks for (server/vision/images.py resizes and crops, engine/layers/pixels.py
rescales and normalises).

The preprocessing defaults are those of transformers' image processors (CLIPImageProcessor:
shortest edge 224 then a 224 x 224 centre crop, bicubic, OpenAI's mean and std; SiglipImageProcessor:
224 x 224 without a crop, bicubic, mean and std 0.5): a key the file leaves out takes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Family = Literal["clip", "siglip"]

# model_type -> the architecture served (both towers, their projections)
DUAL_ENCODERS: dict[str, str] = {"clip": "CLIPModel", "siglip": "SiglipModel"}

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESAMPLE_BICUBIC = 3  # PIL.Image.Resampling.BICUBIC


class VisionError(ValueError):
    """The folder's vision config cannot be served (modelfolder turns it into a ModelError)."""


@dataclass(frozen=True)
class ImageSteps:
    """What the image processor does to a decoded RGB image, in order: resize (to `size` (h, w), or
    the shortest edge to `shortest_edge` keeping the aspect), centre crop to `crop` (h, w), rescale
    by `rescale`, normalise by `mean` and `std`. None or False skips a step."""

    shortest_edge: int | None
    size: tuple[int, int] | None
    crop: tuple[int, int] | None
    resample: int
    rescale: float | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None


@dataclass(frozen=True)
class Vision:
    """A dual encoder: the tower shapes the engine and the server agree on."""

    family: Family
    image_size: int  # the square the image tower takes (pixels)
    patch_size: int
    text_pad_to: int | None  # SigLIP's texts are padded to this many tokens (as its processor pads them)
    text_pad_id: int
    steps: ImageSteps

    @property
    def positions(self) -> int:
        """The tokens the image tower computes on: one per patch (and CLIP's class token)."""
        return (self.image_size // self.patch_size) ** 2 + (1 if self.family == "clip" else 0)


# dual encoders recognised but not served: refused by name rather than served wrong as a text model
UNSERVED = {
    "siglip2": "SigLIP 2's NaFlex (variable resolution) towers are not served; its fixed-resolution checkpoints "
    "(SiglipModel folders) are",
}


def is_dual_encoder(config: dict[str, Any]) -> bool:
    return str(config.get("model_type")) in {*DUAL_ENCODERS, *UNSERVED}


def clip_module(path: Path, modules: list[dict[str, Any]]) -> Path | None:
    """The CLIP folder inside a sentence-transformers folder whose one module is its (legacy)
    CLIPModel module in a subfolder (clip-ViT-B-32's 0_CLIPModel); None for any other folder (a
    CLIPModel module at the root leaves the CLIP config.json at the root, read as it is)."""
    if len(modules) != 1 or not str(modules[0].get("type", "")).endswith(".CLIPModel"):
        return None
    inner = path / str(modules[0].get("path", ""))
    return inner if inner.resolve() != path.resolve() and inner.is_dir() else None


def read_vision(path: Path, config: dict[str, Any]) -> Vision:
    """The folder's towers and preprocessing; VisionError for what the native towers do not compute."""
    if str(config.get("model_type")) in UNSERVED:
        raise VisionError(f"{path}: {UNSERVED[str(config.get('model_type'))]}")
    family: Family = "clip" if config.get("model_type") == "clip" else "siglip"
    architecture = (config.get("architectures") or [DUAL_ENCODERS[family]])[0]
    if architecture != DUAL_ENCODERS[family]:
        raise VisionError(f"{path}: a {architecture} is not served; {DUAL_ENCODERS[family]} (both towers) is")
    vision, text = config.get("vision_config") or {}, config.get("text_config") or {}
    if family == "siglip" and vision.get("vision_use_head", True) is not True:
        raise VisionError(f"{path}: a SigLIP image tower without its attention-pooling head has no image vector")
    image_size, patch = (
        int(vision.get("image_size", 224)),
        int(vision.get("patch_size", 32 if family == "clip" else 16)),
    )
    if image_size < patch or patch < 1:
        raise VisionError(f"{path}: image_size {image_size} and patch_size {patch} do not make patches")
    processor = _preprocessor(path)
    steps = image_steps(family, processor)
    out = steps.crop or steps.size
    if out != (image_size, image_size):  # the tower's positions are for this square only
        raise VisionError(f"{path}: preprocessor_config.json makes {out} images, the image tower takes {image_size}")
    pad_to = int(text.get("max_position_embeddings", 64)) if family == "siglip" else None
    return Vision(family, image_size, patch, pad_to, int(text.get("pad_token_id", 1)), steps)


def text_length(config: dict[str, Any]) -> int:
    """The text tower's positions: its longest input (CLIP's 77, SigLIP's 64)."""
    return int((config.get("text_config") or {}).get("max_position_embeddings", 77))


def dimensions(config: dict[str, Any]) -> int:
    """The shared space's width: CLIP's projection_dim; SigLIP's text head's output (projection_size,
    by default the text tower's width), which its image head matches."""
    if config.get("model_type") == "clip":
        return int(config.get("projection_dim", 512))
    text = config.get("text_config") or {}
    return int(text.get("projection_size") or text.get("hidden_size", 768))


def _preprocessor(path: Path) -> dict[str, Any]:
    where = path / "preprocessor_config.json"
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise VisionError(f"cannot read {where}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, dict):
        raise VisionError(f"{where} is not a JSON object")
    return data


def _pair(value: Any, where: str) -> tuple[int, int]:
    """{height, width}, or one int for a square (older processor configs)."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, dict) and "height" in value and "width" in value:
        return int(value["height"]), int(value["width"])
    raise VisionError(f"preprocessor_config.json: {where} {value!r} is not a height and width")


def _triple(value: Any, where: str) -> tuple[float, float, float]:
    if isinstance(value, int | float):
        return float(value), float(value), float(value)
    if isinstance(value, list) and len(value) == 3:
        return float(value[0]), float(value[1]), float(value[2])
    raise VisionError(f"preprocessor_config.json: {where} {value!r} is not one value per channel")


def image_steps(family: Family, p: dict[str, Any]) -> ImageSteps:
    """transformers' processor attributes for the family, overridden by the file's keys."""
    clip = family == "clip"
    shortest = size = crop = None
    if p.get("do_resize", True):
        raw = p.get("size", {"shortest_edge": 224} if clip else {"height": 224, "width": 224})
        if isinstance(raw, dict) and "shortest_edge" in raw and "longest_edge" not in raw:
            shortest = int(raw["shortest_edge"])
        elif isinstance(raw, int) and clip:  # an int is the shortest edge where the processor keeps the aspect
            shortest = raw
        else:
            size = _pair(raw, "size")
    if p.get("do_center_crop", clip):
        crop = _pair(p.get("crop_size", {"height": 224, "width": 224}), "crop_size")
    if not (size or crop):
        raise VisionError("preprocessor_config.json neither resizes to a fixed size nor crops: images vary in size")
    mean, std = (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD) if clip else ((0.5,) * 3, (0.5,) * 3)
    return ImageSteps(
        shortest_edge=shortest,
        size=size,
        crop=crop,
        resample=int(p.get("resample", RESAMPLE_BICUBIC)),
        rescale=float(p.get("rescale_factor", 1 / 255)) if p.get("do_rescale", True) else None,
        mean=_triple(p.get("image_mean", list(mean)), "image_mean") if p.get("do_normalize", True) else None,
        std=_triple(p.get("image_std", list(std)), "image_std") if p.get("do_normalize", True) else None,
    )
