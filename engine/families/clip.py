"""CLIP and SigLIP in plain torch: a text tower on the packed layout and an image tower batched by
image, each ending in the shared space (common.vision reads the folder).

Module names mirror transformers' CLIPModel and SiglipModel, so their checkpoints load by name. Both
towers are pre-LayerNorm transformers with the same layer (layer_norm1, self_attn, layer_norm2, mlp):
- CLIP's text tower is causal and pools the first end-of-text token (the highest id, for configs from
  before eos_token_id was set right), then text_projection; its image tower prepends a class token,
  runs pre_layrnorm, pools the class token through post_layernorm, then visual_projection.
- SigLIP's text tower is bidirectional and pools the last token (its texts come padded to the full
  length, server side) through its `head`; its image tower has no class token: post_layernorm, then
  an attention-pooling head (one learned probe attending to every patch, torch's MultiheadAttention).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.vision import ImageSteps, Vision
from common.wire import Tokens
from engine.layers.encoder import ACTIVATIONS, attend, load_checkpoint, stacked
from engine.layers.packed import Packed
from engine.layers.pixels import normalised


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """transformers' QuickGELUActivation, x * sigmoid(1.702 x), in place on x (fc1's output, used by
    nothing else). In float32 as silu(1.702 x) / 1.702: three passes over x and no new tensor (an
    image group's activations are megabytes: 1.0 ms instead of 2.6 on 5 images' fc1 output, values
    within 5e-7). In half precision as written: 1.702 x can overflow there, and silu(-inf) is NaN."""
    if x.dtype == torch.float32:
        return F.silu(x.mul_(1.702), inplace=True).div_(1.702)
    return x.mul_(torch.sigmoid(x * 1.702))


# CLIP's activation besides the shared ones
TOWER_ACTIVATIONS = {**ACTIVATIONS, "quick_gelu": quick_gelu}


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj = (
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
            nn.Linear(hidden, hidden),
        )
        self.out_proj = nn.Linear(hidden, hidden)

    def fuse(self) -> None:
        """One GEMM for q, k and v (engine/layers/encoder.py's stacked), built once in the forkserver."""
        self.qkv = stacked(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, p: Packed | None, causal: bool, queries: int | None = None) -> torch.Tensor:
        """Packed text [T, H] attends per input (layers.attend); images [B, N, H] all at once: every
        image has the same number of patches, so there is no padding to skip. `queries`: only the
        first positions of each image attend (to all of them), and only their rows come out."""
        size = x.shape[-1] // self.heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if p is not None:
            qh, kh, vh = (t.reshape(-1, self.heads, size) for t in (q, k, v))
            return self.out_proj(attend(qh, kh, vh, p, causal=causal))  # type: ignore[no-any-return]
        batch, _, hidden = x.shape
        q = q[:, :queries]
        q, k, v = (t.reshape(batch, -1, self.heads, size).transpose(1, 2) for t in (q, k, v))
        context = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(context.transpose(1, 2).reshape(batch, -1, hidden))  # type: ignore[no-any-return]


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int, act: str) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, inner), nn.Linear(inner, hidden)
        self.act = TOWER_ACTIVATIONS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))  # type: ignore[no-any-return]


class Layer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = c["hidden_size"], c.get("layer_norm_eps", 1e-5)
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(hidden, eps=eps), nn.LayerNorm(hidden, eps=eps)
        self.self_attn = Attention(hidden, c["num_attention_heads"])
        self.mlp = MLP(hidden, c["intermediate_size"], c["hidden_act"])

    def forward(
        self, x: torch.Tensor, p: Packed | None = None, causal: bool = False, queries: int | None = None
    ) -> torch.Tensor:
        """`queries`: only images' first positions come out (Attention.forward), through the MLP alone."""
        attended = self.self_attn(self.layer_norm1(x), p, causal, queries)
        x = (x if queries is None else x[:, :queries]) + attended
        return x + self.mlp(self.layer_norm2(x))  # type: ignore[no-any-return]


class Encoder(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))


class TextEmbeddings(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embedding = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])


class TextTower(nn.Module):
    def __init__(self, c: dict[str, Any], family: str, eos: int, projection: int | None) -> None:
        super().__init__()
        self.embeddings, self.encoder = TextEmbeddings(c), Encoder(c)
        self.final_layer_norm = nn.LayerNorm(c["hidden_size"], eps=c.get("layer_norm_eps", 1e-5))
        self.family, self.eos = family, eos
        if projection is not None:  # SigLIP's head; CLIP's projection sits beside the tower
            self.head = nn.Linear(c["hidden_size"], projection)

    def forward(self, p: Packed) -> torch.Tensor:
        """The pooled text [B, H] (SigLIP: through its head)."""
        x = self.embeddings.token_embedding(p.ids) + self.embeddings.position_embedding(p.positions)
        for layer in self.encoder.layers:
            x = layer(x, p, causal=self.family == "clip")
        x = self.final_layer_norm(x)
        if self.family == "siglip":
            return self.head(x[p.starts + p.lengths - 1])  # type: ignore[no-any-return]
        return x[self._eos_rows(p)]

    def _eos_rows(self, p: Packed) -> torch.Tensor:
        """Each input's end-of-text token, as transformers' CLIPTextTransformer finds it: the first
        occurrence of eos_token_id (its first token where there is none), or, where the config says
        2 (older folders), the first occurrence of the highest id."""
        rows = []
        for start, length in p.spans:
            ids = p.ids[start : start + length]
            rows.append(start + int((ids if self.eos == 2 else (ids == self.eos).int()).argmax()))
        return torch.tensor(rows, dtype=torch.long, device=p.ids.device)


class VisionEmbeddings(nn.Module):
    def __init__(self, c: dict[str, Any], family: str) -> None:
        super().__init__()
        hidden, patch = c["hidden_size"], c["patch_size"]
        clip = family == "clip"
        self.patch_embedding = nn.Conv2d(c.get("num_channels", 3), hidden, patch, stride=patch, bias=not clip)
        positions = (c["image_size"] // patch) ** 2 + (1 if clip else 0)
        self.position_embedding = nn.Embedding(positions, hidden)
        if clip:
            self.class_embedding = nn.Parameter(torch.empty(hidden))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Each patch through the patch embedding as one GEMM over every patch of the group: the
        convolution's arithmetic (its kernel is its stride) at 1.6x its speed on the CPU (mkldnn's
        convolution ran ViT-B/32's at 39 GFLOP/s, the GEMM at the encoder's 70)."""
        conv = self.patch_embedding
        batch, channels, size = pixels.shape[0], pixels.shape[1], pixels.shape[-1]
        patch = conv.kernel_size[0]
        side = size // patch  # the convolution leaves out a remainder narrower than a patch
        pixels = pixels[..., : side * patch, : side * patch].to(conv.weight.dtype)
        patches = pixels.reshape(batch, channels, side, patch, side, patch).permute(0, 2, 4, 1, 3, 5)
        weight = conv.weight.reshape(conv.out_channels, -1)
        x = F.linear(patches.reshape(batch, side * side, -1), weight, conv.bias)
        if hasattr(self, "class_embedding"):
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        return x + self.position_embedding.weight  # type: ignore[no-any-return]


class PoolingHead(nn.Module):
    """SigLIP's attention pooling: a learned probe attends to every patch, then a residual MLP."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden = c["hidden_size"]
        self.probe = nn.Parameter(torch.empty(1, 1, hidden))
        self.attention = nn.MultiheadAttention(hidden, c["num_attention_heads"], batch_first=True)
        self.layernorm = nn.LayerNorm(hidden, eps=c.get("layer_norm_eps", 1e-6))
        self.mlp = MLP(hidden, c["intermediate_size"], c["hidden_act"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention(self.probe.expand(x.shape[0], -1, -1), x, x, need_weights=False)[0]
        return (h + self.mlp(self.layernorm(h)))[:, 0]  # type: ignore[no-any-return]


class VisionTower(nn.Module):
    def __init__(self, c: dict[str, Any], family: str) -> None:
        super().__init__()
        eps = c.get("layer_norm_eps", 1e-5)
        self.embeddings, self.encoder = VisionEmbeddings(c, family), Encoder(c)
        if family == "clip":
            self.pre_layrnorm = nn.LayerNorm(c["hidden_size"], eps=eps)  # sic: transformers' name
        self.post_layernorm = nn.LayerNorm(c["hidden_size"], eps=eps)
        if family == "siglip":
            self.head = PoolingHead(c)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, S, S] -> pooled [B, H] (SigLIP: through its head)."""
        x = self.embeddings(pixels)
        if hasattr(self, "head"):  # SigLIP's head attends to every position the last layer computes
            for layer in self.encoder.layers:
                x = layer(x)
            return self.head(self.post_layernorm(x))  # type: ignore[no-any-return]
        x = self.pre_layrnorm(x)
        *layers, last = self.encoder.layers
        for layer in layers:
            x = layer(x)
        # CLIP pools the class token alone: the last layer's attention, output projection and MLP run
        # for its row only (keys and values still for every position)
        return self.post_layernorm(last(x, queries=1)[:, 0])  # type: ignore[no-any-return]


def _tower_config(config: dict[str, Any], side: str, family: str) -> dict[str, Any]:
    """A tower's config with transformers' defaults for the keys its saved config leaves out."""
    defaults: dict[str, Any] = {"hidden_act": "quick_gelu" if family == "clip" else "gelu_pytorch_tanh"}
    if side == "vision":
        defaults.update(image_size=224, patch_size=32 if family == "clip" else 16)
    else:
        defaults.update(max_position_embeddings=77 if family == "clip" else 64)
    return {**defaults, **(config.get(f"{side}_config") or {})}


class DualEncoder(nn.Module):
    """Both towers and CLIP's projections: text() on a packed batch, images() on pixels."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        family = self.family = str(config["model_type"])
        text, vision = _tower_config(config, "text", family), _tower_config(config, "vision", family)
        projection = None if family == "clip" else int(text.get("projection_size") or text["hidden_size"])
        self.text_model = TextTower(text, family, int(text.get("eos_token_id", 2)), projection)
        self.vision_model = VisionTower(vision, family)
        if family == "clip":
            dims = int(config.get("projection_dim", 512))
            self.text_projection = nn.Linear(text["hidden_size"], dims, bias=False)
            self.visual_projection = nn.Linear(vision["hidden_size"], dims, bias=False)
        self.image_size = int(vision["image_size"])
        self.towers = {
            "text": f"{text['num_hidden_layers']} layers x {text['hidden_size']}",
            "vision": f"{vision['num_hidden_layers']} layers x {vision['hidden_size']}, "
            f"{self.image_size}px in {vision['patch_size']}px patches",
        }

    def text(self, p: Packed) -> torch.Tensor:
        pooled = self.text_model(p)
        return self.text_projection(pooled) if self.family == "clip" else pooled  # type: ignore[no-any-return]

    def images(self, pixels: torch.Tensor) -> torch.Tensor:
        pooled = self.vision_model(pixels)
        return self.visual_projection(pooled) if self.family == "clip" else pooled  # type: ignore[no-any-return]

    def forward(self, p: Packed) -> torch.Tensor:
        return self.text(p)


def load(
    folder: Path,
    config: dict[str, Any],
    num_labels: int | None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    return load_checkpoint(lambda: DualEncoder(config), folder, lambda key: key, device, dtype)


@torch.inference_mode()
def embed(model: DualEncoder, items: list[Tokens], device: torch.device, steps: ImageSteps) -> np.ndarray:
    """Each input's vector in the shared space (not normalised: the server normalises), rows in the
    order of items: the texts as one packed batch, the images (uint8, normalised here by `steps`) as
    one batch."""
    texts = [i for i, item in enumerate(items) if item.pixels is None]
    images = [i for i, item in enumerate(items) if item.pixels is not None]
    parts: list[tuple[list[int], torch.Tensor]] = []  # a group is never empty: one part at least
    if texts:
        parts.append((texts, model.text(Packed.of([items[i] for i in texts]).to(device))))
    if images:
        pixels = normalised([items[i].pixels for i in images], steps)
        parts.append((images, model.images(torch.from_numpy(pixels).to(device))))
    out = parts[0][1].new_empty((len(items), parts[0][1].shape[1]))
    for rows, vectors in parts:
        out[rows] = vectors
    return out.float().cpu().numpy()  # type: ignore[no-any-return]


def warm_image(model: Any, vision: Vision) -> float:
    """One image through the image tower (its kernels' first-call costs paid before ready); its ms."""
    size = model.image_size
    blank = Tokens([0] * vision.positions, pixels=np.zeros((3, size, size), dtype=np.uint8))
    started = time.perf_counter()
    embed(model, [blank], _device(model), vision.steps)
    return round((time.perf_counter() - started) * 1000, 1)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
