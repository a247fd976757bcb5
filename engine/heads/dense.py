"""sentence-transformers' Dense modules, after pooling: activation(linear(x)), plus x with use_residual."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from common.folderjson import ModelError
from common.st_modules import DenseLayer
from engine.layers.encoder import no_init

# common.st_modules.DENSE_ACTIVATIONS names -> what the torch.nn class computes
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Identity": lambda x: x,
    "Tanh": torch.tanh,
    "ReLU": F.relu,
    "GELU": F.gelu,
    "Sigmoid": torch.sigmoid,
    "SiLU": F.silu,
}


class Dense(nn.Module):
    def __init__(self, layer: DenseLayer) -> None:
        super().__init__()
        self.linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        self.act = ACTIVATIONS[layer.activation]
        self.use_residual = layer.residual
        self.residual: nn.Linear | None = None
        if layer.residual and layer.in_features != layer.out_features:
            self.residual = nn.Linear(layer.in_features, layer.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.linear(x))
        if self.use_residual:
            out = out + (x if self.residual is None else self.residual(x))
        return out


def load(layers: tuple[DenseLayer, ...], device: torch.device, dtype: torch.dtype) -> nn.Module | None:
    """The folder's Dense modules, in order, as one module on `device` in `dtype`; None without any."""
    if not layers:
        return None
    modules = []
    for layer in layers:
        with no_init():
            module = Dense(layer)
        try:
            module.load_state_dict(_weights(layer.path, device), assign=True)
        except Exception as exc:  # a missing or truncated file, or weights of the wrong shape
            raise ModelError(f"cannot load the Dense module in {layer.path}: {type(exc).__name__}: {exc}") from exc
        modules.append(module)
    return nn.Sequential(*modules).to(dtype).eval()


def _weights(folder: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """model.safetensors, else pytorch_model.bin read with weights_only (tensors, never code); only
    the Dense module's own tensors (a Stanford ColBERT keeps its projection beside the encoder's)."""
    own = ("linear.", "residual.")
    if (folder / "model.safetensors").is_file():
        with safe_open(str(folder / "model.safetensors"), framework="pt", device=str(device)) as f:
            return {key: f.get_tensor(key) for key in f.keys() if key.startswith(own)}  # noqa: SIM118
    state = torch.load(folder / "pytorch_model.bin", map_location=device, weights_only=True)
    return {key: tensor for key, tensor in state.items() if key.startswith(own)}
