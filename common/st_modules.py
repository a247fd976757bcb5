"""A sentence-transformers folder's modules after the encoder (modules.json): the Pooling mode, the
Dense layers, Normalize, or a SparseEncoder's SpladePooling (config files alone, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from common.folderjson import ModelError, read_json
from common.splade import Splade, read_splade

PoolingMode = Literal["mean", "cls", "lasttoken", "max", "weightedmean", "mean_sqrt_len_tokens"]

_POOLING_KEYS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
}

# A Dense module's activation_function (its torch.nn class) -> the name engine.heads.dense knows it by.
DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "Identity",
    **{f"torch.nn.modules.activation.{name}": name for name in ("Tanh", "ReLU", "GELU", "Sigmoid", "SiLU")},
}


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers Dense module after pooling: activation(linear(x)) (+ x, or + a
    projection of x, with use_residual)."""

    path: Path  # the module's folder: its weights are model.safetensors or pytorch_model.bin there
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Tanh"  # a value of DENSE_ACTIVATIONS
    residual: bool = False


def read_modules(
    path: Path, modules: list[dict[str, Any]], hidden: int, tokens: bool = False
) -> tuple[PoolingMode, bool, tuple[DenseLayer, ...], Splade | None]:
    """Sentence-transformers modules decide pooling, Dense layers and normalisation (or SPLADE
    pooling, for a SparseEncoder); a plain encoder gets mean pooling, as ST would give it. With
    `tokens` (a ColBERT), Dense modules project every token and no pooling may come before them."""
    pooling: PoolingMode = "mean"
    normalize = pooled = False
    dense: list[DenseLayer] = []
    splade = None
    for module in modules:
        kind = str(module.get("type", ""))
        folder = path / module.get("path", "")
        if kind.endswith("SpladePooling"):
            splade = read_splade(read_json(folder / "config.json"), folder)
        elif kind.endswith("Pooling"):
            pooling, pooled = _pooling_mode(read_json(folder / "config.json")), True
        elif kind.endswith("Dense"):
            if pooled is tokens or normalize:  # dense on tokens only for a ColBERT; never after Normalize
                raise ModelError(f"sentence-transformers module {kind} is only supported between Pooling and Normalize")
            dense.append(_dense(folder, dense[-1].out_features if dense else hidden, tokens))
        elif kind.endswith("Normalize"):
            normalize = True
        elif tokens and kind.endswith("MultiVectorMask"):
            continue  # its skiplist is read with the folder's other switches (common.late_interaction)
        elif kind and not kind.endswith("Transformer"):
            raise ModelError(f"sentence-transformers module {kind} is not supported")
    if splade is not None and (pooled or dense or normalize):
        raise ModelError(f"{path}: SPLADE pooling with Pooling, Dense or Normalize modules is not supported")
    return pooling, normalize, tuple(dense), splade


def _pooling_mode(conf: dict[str, Any]) -> PoolingMode:
    """One mode, from the boolean flags or the newer `pooling_mode` (a name, or a list of them)."""
    modes = [mode for key, mode in _POOLING_KEYS.items() if conf.get(key)]
    named = conf.get("pooling_mode")
    if named is not None:
        modes = named if isinstance(named, list) else [named]
    if len(modes) > 1:
        raise ModelError(f"combined pooling modes {modes} are not supported")
    if modes and modes[0] not in _POOLING_KEYS.values():
        raise ModelError(f"pooling mode {modes[0]!r} is not supported")
    return modes[0] if modes else "mean"


def _dense(folder: Path, fan_in: int, tokens: bool = False) -> DenseLayer:
    """A Dense module's config.json, checked: it must take the vectors before it, and its
    activation must be a torch.nn class the engine computes."""
    where = folder / "config.json"
    conf = read_json(where)
    name = conf.get("activation_function", "torch.nn.modules.activation.Tanh")  # Dense's default
    if name not in DENSE_ACTIVATIONS:
        raise ModelError(f"Dense activation_function {name!r} in {where} is not supported")
    for key in ("module_input_name", "module_output_name"):
        if key in conf and conf[key] != ("token_embeddings" if tokens else "sentence_embedding"):
            raise ModelError(f"Dense {key} {conf[key]!r} in {where} is not supported")
    layer = DenseLayer(
        path=folder,
        in_features=int(conf["in_features"]),
        out_features=int(conf["out_features"]),
        bias=bool(conf.get("bias", True)),
        activation=DENSE_ACTIVATIONS[name],
        residual=bool(conf.get("use_residual", False)),
    )
    if (fan_in and layer.in_features != fan_in) or layer.out_features < 1:
        raise ModelError(f"Dense in {where} maps {layer.in_features} to {layer.out_features} features, after {fan_in}")
    return layer
