"""BERT-family encoders in plain torch, so the engine serves them without importing transformers.

On these machines `import transformers` plus its model-loading path costs ~3 s of a ~5 s cold
start, more than torch itself; TEI likewise ships its own model implementations. The module
names mirror transformers' BertModel so checkpoints load by name; any model this does not cover
(see server.modelinfo.native_bert) is loaded with transformers instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from server.modelinfo import ModelError


class Embeddings(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, ids: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.token_type_embeddings(types) + self.position_embeddings(positions)
        return self.LayerNorm(x)  # type: ignore[no-any-return]


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, hidden // self.heads).transpose(1, 2)

        context = F.scaled_dot_product_attention(
            heads(self.query(x)), heads(self.key(x)), heads(self.value(x)), attn_mask=bias
        )
        return context.transpose(1, 2).reshape(batch, length, hidden)


class DenseNorm(nn.Module):
    """dense -> + residual -> LayerNorm, the output block of attention and feed-forward alike."""

    def __init__(self, fan_in: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(fan_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)  # type: ignore[no-any-return]


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        self.self = SelfAttention(hidden, heads)
        self.output = DenseNorm(hidden, hidden, eps)


class Intermediate(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, inner)


class Layer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = c["hidden_size"], c.get("layer_norm_eps", 1e-12)
        self.attention = Attention(hidden, c["num_attention_heads"], eps)
        self.intermediate = Intermediate(hidden, c["intermediate_size"])
        self.output = DenseNorm(c["intermediate_size"], hidden, eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attention.output(self.attention.self(x, bias), x)
        return self.output(F.gelu(self.intermediate.dense(x)), x)  # type: ignore[no-any-return]


class Encoder(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))


class Pooler(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)


class Bert(nn.Module):
    """Returns the last hidden states, or classifier logits when built with labels."""

    def __init__(self, c: dict[str, Any], num_labels: int | None) -> None:
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        if num_labels:
            self.pooler = Pooler(c["hidden_size"])
            self.classifier = nn.Linear(c["hidden_size"], num_labels)
        self.num_labels = num_labels

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(ids, types)
        # Additive mask: padded keys get the dtype's minimum, so softmax gives them zero weight.
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.encoder.layer:
            x = layer(x, bias)
        if not self.num_labels:
            return x
        return self.classifier(torch.tanh(self.pooler.dense(x[:, 0])))  # type: ignore[no-any-return]


def load(folder: Path, config: dict[str, Any], num_labels: int | None) -> Bert:
    """Build without random init (the checkpoint replaces every weight), then take the
    checkpoint's tensors as the parameters themselves."""
    with _no_init():
        model = Bert(config, num_labels)
    try:
        weights = load_file(str(folder / "model.safetensors"))
    except Exception as exc:  # safetensors raises its own error types for truncated files
        raise ModelError(f"cannot load model from {folder}: {type(exc).__name__}: {exc}") from exc
    state = {_rename(key): tensor for key, tensor in weights.items()}
    missing, _ = model.load_state_dict(state, strict=False, assign=True)
    if missing:
        raise ModelError(f"cannot load model from {folder}: weights missing for {missing[:5]}")
    return model.eval()


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Skip nn.init while modules are built, as transformers' no_init_weights does. (The meta
    device would too, but its first use imports sympy and torch._prims: ~1.6 s per engine.)"""
    names = ("kaiming_uniform_", "uniform_", "normal_", "zeros_", "ones_", "trunc_normal_")
    saved = {name: getattr(nn.init, name) for name in names}
    try:
        for name in names:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _rename(key: str) -> str:
    """Checkpoint names -> ours: drop the task model's `bert.` prefix; old gamma/beta LayerNorm names."""
    key = key.removeprefix("bert.")
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
