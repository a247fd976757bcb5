"""An adapter's own head: the modules PEFT saves whole beside LoRA's A and B (`modules_to_save`: the
classifier a SEQ_CLS fine-tune trains, RoBERTa's whole classification head, a BERT pooler added to
the list). Each such module of the head becomes the adapter's copy, and a forward hook on the base's
module puts the copy's output in its adapter's inputs' rows; the base's inputs keep the base's head.

The head runs after pooling, one row per input, so a copy costs one small matmul on its own rows. Only
modules of the head have a row per input: a saved module of the encoder (the word embeddings, a norm)
is refused, as is a head of other shapes (another label count: the labels are the base's, which the
HTTP side answers with).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.folderjson import ModelError
from engine.layers.checkpoint import model_name
from engine.precision.rows import RowBucketed

# What the native families run after pooling (engine/layers/encoder.py's TanhHead; ModernBERT's head
# and classifier): their modules see one row per input. A model whose head runs per token (SPLADE's
# masked-LM head, ColBERT's projection) says so with its own PER_INPUT: none
HEAD_MODULES = ("head.", "classifier.")

# during a forward: (adapter name, its inputs' rows)
Rows = list[tuple[str, slice | torch.Tensor]]


def read(name: str, folder: Path, model: nn.Module, saved: dict[str, torch.Tensor]) -> dict[str, nn.Module]:
    """PEFT's saved modules (keys as the checkpoint names them, without `base_model.model.`) as copies of
    the model's head modules with the adapter's weights, by module path; ModelError for what cannot be
    served: a module outside the head, one the model lacks, other shapes."""
    where = f"adapter '{name}' ({folder})"
    if saved and not getattr(model, "num_labels", None):
        per_token = getattr(model, "PER_INPUT", None) == ()  # SPLADE's masked-LM head, ColBERT's projection
        raise ModelError(
            f"{where} cannot be served: it saves modules whole ({_modules(saved)}: modules_to_save) and this "
            "model has no classifier head for them: "
            + (
                "its head runs per token and stays the base's (LoRA on a masked-LM head's projections is served)"
                if per_token
                else "serve it on the classifier or reranker it was trained from"
            )
        )
    params: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}  # our module -> param -> (its key, tensor)
    outside = []
    for key, tensor in saved.items():
        path, _, param = model_name(model, key).rpartition(".")
        if not in_head(model, path) or not isinstance(_module(model, path), nn.Module):
            outside.append(key)
        else:
            params.setdefault(path, {})[param] = (key, tensor)
    if outside:
        raise ModelError(
            f"{where} cannot be served: saved modules outside the model's head ({_modules(outside)}): only a "
            "trained classifier head runs per input"
        )
    copies = {}
    for path, tensors in params.items():
        own = copy.deepcopy(model.get_submodule(path)).requires_grad_(False)
        for module in own.modules():
            module._forward_hooks.clear()  # the base's (another adapter's copy in place): not the copy's
        weights = own.inner if isinstance(own, RowBucketed) else own  # a float32 head runs on padded rows
        mine = dict(weights.named_parameters())
        for param, (key, tensor) in sorted(tensors.items(), key=lambda item: item[0] != "weight"):
            if param not in mine:
                raise ModelError(f"{where} cannot be served: this model's head has no place for its {key}")
            if tensor.shape != mine[param].shape:
                raise ModelError(
                    f"{where} cannot be served: its {key} is {list(tensor.shape)}, this model's "
                    f"{list(mine[param].shape)} (another label count: an adapter answers with its base's labels)"
                )
        weights.load_state_dict({param: tensor for param, (_, tensor) in tensors.items()}, strict=False)
        copies[path] = own  # what the adapter did not save stays the base's
    return copies


def in_head(model: nn.Module, path: str) -> bool:
    """Whether the module at `path` of `model` is of the head (one row per input)."""
    return f"{path}.".startswith(getattr(model, "PER_INPUT", HEAD_MODULES))


def hook(copies: dict[str, nn.Module], rows: Callable[[], Rows]) -> Any:
    """A forward hook for a head module: each adapter with its own copy there answers its inputs' rows."""

    def replace(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor | None:
        running = rows()
        if not running:
            return None  # a base-only group: the base's head
        x = inputs[0]
        for name, where in running:
            own = copies.get(name)
            if own is None:
                continue
            if isinstance(where, slice):
                out[where] = own(x[where])
            else:
                out.index_copy_(0, where, own(x.index_select(0, where)))
        return out

    return replace


def _module(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _modules(keys: Any) -> str:
    return ", ".join(sorted({key.rsplit(".", 1)[0] for key in keys}))
