"""CLIP and SigLIP on the native towers: text and image vectors equal transformers'
get_text_features / get_image_features on tiny random folders, through PoolingModel as an engine
runs it (texts and images mixed in one group)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"

import functools
import io
import json
from itertools import zip_longest
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from common.modelfolder import read_model_folder
from common.wire import Tokens
from engine.runtime.model import PoolingModel
from tests.tiny_vision import VISION, ClipShape, build_clip, build_siglip

TOLERANCE = 1e-5  # float32, projections included


def reference(folder: Path) -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder)).eval()


def texts(folder: Path, eos: int) -> list[list[int]]:
    """Ids of different lengths, one with a second end-of-text token after the first (padding-like)."""
    return [[eos - 1, 5, 9, eos], [eos - 1, 40, 41, 42, 43, 44, eos, eos], [eos - 1, eos]]


def pixels(n: int, size: int) -> np.ndarray:
    """Images as the server sends them: uint8 [3, size, size], resized and cropped, not normalised."""
    return np.random.default_rng(3).integers(0, 256, (n, 3, size, size), dtype=np.uint8)


@functools.cache
def image_processor(folder: Path) -> Any:
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(folder))


def pixel_values(folder: Path, image: np.ndarray) -> np.ndarray:
    """The folder's transformers image processor's input for the tower from a uint8 image already of
    the tower's size: rescaled and normalised, not resized or cropped."""
    out = image_processor(folder)(image.transpose(1, 2, 0), do_resize=False, do_center_crop=False, return_tensors="np")
    return out["pixel_values"][0]  # type: ignore[no-any-return]


def assert_both_towers(folder: Path, ids: list[list[int]], image_size: int) -> float:
    """The native model's rows for the texts then the images (sent interleaved) against transformers'."""
    info = read_model_folder(folder)
    model = PoolingModel(info, threads=1)
    ref = reference(folder)
    images = pixels(3, image_size)
    assert info.vision is not None
    normalised = torch.from_numpy(np.stack([pixel_values(folder, image) for image in images]))
    with torch.no_grad():
        want_text = torch.cat([ref.get_text_features(input_ids=torch.tensor([i])).pooler_output for i in ids])
        want_image = ref.get_image_features(pixel_values=normalised).pooler_output
    items = [Tokens(i) for i in ids] + [Tokens([0] * 5, pixels=image) for image in images]
    # texts and images interleaved: each row lands where its input was
    order = [k for pair in zip_longest(range(len(ids)), range(len(ids), len(items))) for k in pair if k is not None]
    got = model.forward([items[k] for k in order])
    want = torch.cat([want_text, want_image]).numpy()[order]
    error = float(np.abs(got - want).max())
    assert error <= TOLERANCE, error
    return error


def test_clip_text_and_image_vectors_equal_transformers(tmp_path: Path) -> None:
    """CLIP: the causal text tower pooled at the first end-of-text token and projected, the image tower's
    class token after post_layernorm and projected, each within 1e-5 of transformers."""
    folder = build_clip(tmp_path / "clip")
    eos = read_model_folder(folder).config["text_config"]["eos_token_id"]
    assert_both_towers(folder, texts(folder, eos), 32)


def test_clip_legacy_eos_pools_the_highest_id(tmp_path: Path) -> None:
    """A CLIP config from before transformers fixed eos_token_id (2) pools the highest id's position,
    as transformers does for such folders."""
    folder = build_clip(tmp_path / "clip-legacy", legacy_eos=True)
    vocab = read_model_folder(folder).config["text_config"]["vocab_size"]
    assert_both_towers(folder, [[7, vocab - 1, 3, 4], [vocab - 2, 9, 8]], 32)


def test_siglip_text_and_image_vectors_equal_transformers(tmp_path: Path) -> None:
    """SigLIP: the bidirectional text tower's last position through its head, the image tower pooled by
    its attention head, each within 1e-5 of transformers."""
    folder = build_siglip(tmp_path / "siglip")
    padded = [[5, 9, 2] + [1] * 13, [40, 41, 42, 43, 44, 2] + [1] * 10, [7] * 16]
    assert_both_towers(folder, padded, 32)


def test_patches_past_the_last_whole_one_are_left_out(tmp_path: Path) -> None:
    """An image size that is no multiple of the patch size (as SigLIP's 384 px in 14 px patches): the
    remainder rows and columns are left out, as the patch convolution leaves them."""
    shape = ClipShape(vision={**VISION, "image_size": 30}, shortest_edge=30)
    folder = build_clip(tmp_path / "clip-30", shape=shape)
    eos = read_model_folder(folder).config["text_config"]["eos_token_id"]
    assert_both_towers(folder, texts(folder, eos), 30)


def test_folder_reads_as_a_native_dual_encoder(tmp_path: Path) -> None:
    """A CLIPModel folder is a native embedding model answering normalised vectors of projection_dim,
    its texts at most the text tower's positions, its image an image-size square of patches."""
    info = read_model_folder(build_clip(tmp_path / "clip"))
    assert (info.kind, info.native, info.normalize, info.dimensions, info.max_model_len) == (
        "embedding",
        True,
        True,
        24,
        16,
    )
    assert info.vision is not None and info.vision.positions == (32 // 8) ** 2 + 1


def test_siglip2_naflex_folder_is_refused_by_name(tmp_path: Path) -> None:
    """A SigLIP 2 NaFlex folder (model_type siglip2) fails with a reason, not served as a text model."""
    from common.folderjson import ModelError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "siglip2", "architectures": ["Siglip2Model"]}))
    with pytest.raises(ModelError, match="NaFlex"):
        read_model_folder(tmp_path)


@pytest.mark.parametrize("build", [build_clip, build_siglip])
def test_engine_reports_both_towers_and_warms_with_an_image(tmp_path: Path, build: Any) -> None:
    """The engine phase's detail names both towers; warm-up runs one image through the image tower."""
    model = PoolingModel(read_model_folder(build(tmp_path / "m")), threads=1)
    assert set(model.weights["towers"]) == {"text", "vision"}
    assert "image_forward_ms" in model.warm_up().detail


def test_sentence_transformers_clip_module_folder_equals_its_encode(tmp_path: Path) -> None:
    """A sentence-transformers folder whose one module is its (legacy) CLIPModel in 0_CLIPModel, as
    clip-ViT-B-32 ships, is served as the CLIP folder inside: texts (tokenized as the server does)
    and images (decoded and preprocessed as the server does) equal SentenceTransformer.encode's."""
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    from common.settings import Settings
    from server.tokenizing.tokenizer import TokenizerPool
    from server.vision import images
    from tests.tiny_vision import image_bytes

    root = tmp_path / "st-clip"
    inner = build_clip(root / "0_CLIPModel")
    module = {"idx": 0, "name": "0", "path": "0_CLIPModel", "type": "sentence_transformers.models.CLIPModel"}
    (root / "modules.json").write_text(json.dumps([module]))
    info = read_model_folder(root)
    assert info.path == inner and info.vision is not None
    texts, files = ["the warm pool", "hello world engine"], [image_bytes("PNG", seed=1), image_bytes("JPEG", seed=2)]
    tokens = TokenizerPool(info.path).encode_batch(list(texts))
    decoded = [images.decode(f, Settings(), "input") for f in files]
    pixels = [Tokens([0], pixels=images.preprocess(d, info.vision.steps)) for d in decoded]
    got = PoolingModel(info, threads=1).forward(tokens + pixels)
    st = SentenceTransformer(str(root), device="cpu")
    want = np.concatenate([st.encode(texts), st.encode([Image.open(io.BytesIO(f)) for f in files])])
    assert float(np.abs(got - want).max()) <= TOLERANCE
