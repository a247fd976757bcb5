"""PEFT LoRA adapters served per input from one base model: a packed group may mix the base's inputs
with several adapters' and every projection runs once over all of its rows; each adapter present then
adds its update x·Aᵀ·Bᵀ·scale to its own inputs' rows only (one pair of small matmuls per adapter and
projection), through a forward hook on the projection. A group with no adapter rows costs nothing.

An adapter is a PEFT folder (adapter_config.json + adapter_model.safetensors) trained on the base as
transformers' AutoModel names its modules (what sentence-transformers' PEFT integration saves): the
names are the native family's own (engine/layers/encoder.py mirrors BertModel's). A projection the
family fuses (attention's q, k and v: `SelfAttention.PARTS`) takes each part's update in its slice.
An adapter trained on a task model (a classifier or reranker: `bert.`, `roberta.` before the encoder's
names) is read through the family's checkpoint renames; the head it trained (PEFT's modules_to_save)
answers its own inputs (engine/layers/lora_heads.py). A model that wraps the family's encoder with a head
(SPLADE's masked LM, ColBERT's projection: engine/heads) names the checkpoint's modules under its own
(checkpoint.renamed_around); a head that runs per token takes LoRA as the encoder's projections do.
What the arithmetic here cannot reproduce is refused when it is loaded, the reason naming it:
DoRA, biases, per-module alphas, modules the family does not have (another architecture), projections
of other sizes (another base), saved modules outside the head.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from common.folderjson import ModelError
from engine.layers import lora_heads
from engine.layers.checkpoint import model_name
from engine.layers.packed import Packed

# adapter_model.safetensors' keys: [base_model.model.]MODULE.lora_A|B[.adapter name].weight (an embedding's:
# lora_embedding_A|B, refused as a module the family has no projection for); any other key is a module
# PEFT saved whole (modules_to_save), under the name the base checkpoint gives it
_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?:embedding_)?(?P<side>[AB])(?:\.[^.]+)?(?:\.weight)?$")
# (option, the value PEFT's LoRA arithmetic has without it): anything else is refused, named
_UNSUPPORTED = (("use_dora", False), ("bias", "none"), ("fan_in_fan_out", False), ("lora_bias", False))
# options that change the arithmetic or add weights beside A and B whenever set: refused, named
_REFUSED_WHEN_SET = (
    "alpha_pattern",
    "target_parameters",
    "trainable_token_indices",
    "layer_replication",
    "alora_invocation_tokens",
    "use_qalora",
    "use_bdlora",
)


@dataclass(frozen=True)
class Update:
    """One adapter's update of one projection: x @ a.T, then each part's columns @ its b.T into its slice
    of the outputs, the scale folded into b. A fused projection's parts (q, k, v) share one product with
    a (their ranks side by side) and keep their own b: one stacked b would hold zeros everywhere outside
    the diagonal blocks (1.75x an adapter's file for q/k/v/o)."""

    a: torch.Tensor  # [rank, in]
    parts: tuple[tuple[slice, slice, torch.Tensor], ...]  # (outputs, a's rows, b [outputs, rank])

    def to(self, device: torch.device, dtype: torch.dtype) -> Update:
        return Update(self.a.to(device, dtype), tuple((out, cols, b.to(device, dtype)) for out, cols, b in self.parts))

    def tensors(self) -> list[torch.Tensor]:
        return [self.a, *(b for _, _, b in self.parts)]


class Adapters:
    """The adapters one engine serves, by name, and the rows of the group being run (set by applied()).
    Adapters come and go between groups (sync(): the HTTP process's set over the pipe); a projection's
    hook, registered the first time an adapter targets it, reads the updates held at each call."""

    def __init__(self, model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.folders: dict[str, Path] = {}  # name -> its folder
        self.bytes: dict[str, int] = {}  # name -> the bytes its updates hold on the device
        self.updates: dict[str, dict[str, Update]] = {}  # module path -> adapter name -> its update there
        self.heads: dict[str, dict[str, nn.Module]] = {}  # head module path -> adapter name -> its own copy
        # during a forward: adapter name -> its token rows, and its input rows (the head's): a slice where
        # they lie together (no gather)
        self._rows: lora_heads.Rows = []
        self._inputs: lora_heads.Rows = []

    @property
    def names(self) -> list[str]:
        return list(self.folders)

    def add(self, name: str, folder: Path) -> None:
        """Read, check and place one adapter; ModelError (nothing added) for one the model cannot serve."""
        read, heads = _read(name, folder, self.model)
        found = {path: update.to(self.device, self.dtype) for path, update in read.items()}
        for path, update in found.items():
            if path not in self.updates:
                self.updates[path] = {}
                self.model.get_submodule(path).register_forward_hook(self._hook(path))
            self.updates[path][name] = update
        for path, head in heads.items():
            if path not in self.heads:
                self.heads[path] = {}
                self.model.get_submodule(path).register_forward_hook(
                    lora_heads.hook(self.heads[path], self._inputs_now)
                )
            self.heads[path][name] = head.to(self.device, self.dtype)
        self.folders[name] = folder
        self.bytes[name] = sum(t.numel() * t.element_size() for u in found.values() for t in u.tensors()) + sum(
            t.numel() * t.element_size() for head in heads.values() for t in head.parameters()
        )

    def remove(self, name: str) -> None:
        for updates in self.updates.values():
            updates.pop(name, None)
        for heads in self.heads.values():
            heads.pop(name, None)
        self.folders.pop(name, None)
        self.bytes.pop(name, None)

    def sync(self, wanted: Sequence[tuple[str, Path]]) -> dict[str, Any]:
        """Make the set `wanted` (a folder changed: read again); what it holds then, by name, and why
        each adapter it could not load was refused."""
        wanted_folders = {name: Path(folder) for name, folder in wanted}
        for name in [n for n, folder in self.folders.items() if wanted_folders.get(n) != folder]:
            self.remove(name)
        refused = {}
        for name, folder in wanted_folders.items():
            if name not in self.folders:
                try:
                    self.add(name, folder)
                except ModelError as exc:
                    refused[name] = str(exc)
                except Exception as exc:  # an unreadable file: this adapter refused, the engine serves on
                    refused[name] = f"adapter '{name}' ({folder}) cannot be read: {type(exc).__name__}: {exc}"
        return {"loaded": dict(self.bytes), "refused": refused}

    def _inputs_now(self) -> lora_heads.Rows:
        return self._inputs

    def _hook(self, path: str) -> Any:
        updates = self.updates[path]

        def add(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor | None:
            if not self._rows:
                return None  # a base-only group: the projection's output as it is
            x = inputs[0]
            for name, rows in self._rows:
                update = updates.get(name)
                if update is None:
                    continue
                if isinstance(rows, slice):
                    low = x[rows] @ update.a.T
                    for where, cols, b in update.parts:
                        out[rows, where].addmm_(low[:, cols], b.T)
                else:
                    low = x.index_select(0, rows) @ update.a.T
                    for where, cols, b in update.parts:
                        out[:, where].index_add_(0, rows, low[:, cols] @ b.T)
            return out

        return add

    @contextlib.contextmanager
    def applied(self, packed: Packed) -> Iterator[None]:
        """Within it, the hooked projections add each adapter's update to its inputs' rows."""
        assert packed.adapters is not None
        unknown = set(packed.adapters) - self.folders.keys() - {""}
        if unknown:
            there = ", ".join(self.names) or "none"
            raise ValueError(f"no adapter named {', '.join(sorted(unknown))} (there are: {there})")
        device = packed.ids.device
        for name in dict.fromkeys(packed.adapters):
            if name:
                mine = [i for i, adapter in enumerate(packed.adapters) if adapter == name]
                self._rows.append((name, _rows([packed.spans[i] for i in mine], device)))
                self._inputs.append((name, _rows([(i, 1) for i in mine], device)))
        try:
            yield
        finally:
            self._rows.clear()
            self._inputs.clear()


def load(adapters: Sequence[tuple[str, Path]], model: nn.Module, device: torch.device, dtype: torch.dtype) -> Adapters:
    """The adapters, checked against the model and hooked onto its projections.
    ModelError (the engine's start fails) for one the model cannot serve exactly."""
    loaded = Adapters(model, device, dtype)
    for name, folder in adapters:
        loaded.add(name, Path(folder))
    return loaded


def _rows(spans: list[tuple[int, int]], device: torch.device) -> slice | torch.Tensor:
    """The rows of these (start, length) spans: a slice where they lie together, else an index."""
    first, end = spans[0][0], spans[-1][0] + spans[-1][1]
    if end - first == sum(n for _, n in spans):  # one run: a view, no gather or scatter
        return slice(first, end)
    return torch.cat([torch.arange(start, start + n) for start, n in spans]).to(device)


def _read(name: str, folder: Path, model: nn.Module) -> tuple[dict[str, Update], dict[str, nn.Module]]:
    """One PEFT folder as updates by our module path, and its own head's modules (lora_heads.read)."""
    config_file, weights_file = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise ModelError(f"adapter '{name}': {folder} needs adapter_config.json and adapter_model.safetensors")
    config = json.loads(config_file.read_text())
    refused = [f"{key}={config[key]!r}" for key, plain in _UNSUPPORTED if config.get(key, plain) != plain]
    if config.get("peft_type", "LORA") != "LORA":
        refused.append(f"peft_type={config['peft_type']!r}")
    refused += [f"{key}={config[key]!r}" for key in _REFUSED_WHEN_SET if config.get(key)]
    if refused:
        raise ModelError(f"adapter '{name}' ({folder}) cannot be served: {', '.join(refused)} (plain LoRA only)")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    saved = {}
    for key, tensor in load_file(weights_file).items():
        match = _KEY.match(key.removeprefix(_PREFIX))
        if match is None:
            saved[key.removeprefix(_PREFIX)] = tensor.float()
        else:
            pairs.setdefault(match["module"], {})[match["side"]] = tensor.float()
    on_head = sorted(module for module in pairs if lora_heads.in_head(model, _ours(model, module)))
    if on_head:
        raise ModelError(
            f"adapter '{name}' ({folder}) cannot be served: LoRA on the head ({', '.join(on_head)}), which runs per "
            "input: train the head whole instead (modules_to_save)"
        )
    targets = {module: _target(model, module) for module in pairs}
    missing = sorted({module.rsplit(".", 1)[-1] for module, target in targets.items() if target is None})
    if missing:
        raise ModelError(
            f"adapter '{name}' ({folder}) cannot be served: target modules the model does not have: "
            f"{', '.join(missing)}"
        )
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    parts: dict[str, list[tuple[slice, torch.Tensor, torch.Tensor]]] = {}
    for module, pair in pairs.items():
        target = targets[module]
        assert target is not None
        path, where, size = target
        a, b = pair["A"], pair["B"]
        rank = a.shape[0]
        if a.shape[1] != size[0] or b.shape != (where.stop - where.start, rank):
            raise ModelError(  # another hidden size or width: trained on another base
                f"adapter '{name}' ({folder}) was trained on another base: its {module} maps {a.shape[1]} features"
                f" to {b.shape[0]}, this model's {size[0]} to {where.stop - where.start}"
            )
        scale = alpha / math.sqrt(rank) if rslora else alpha / rank  # PEFT's scaling, per module's rank
        parts.setdefault(path, []).append((where, a, b * scale))
    updates = {path: _stacked(found) for path, found in parts.items()}
    return updates, lora_heads.read(name, folder, model, saved)


def _stacked(parts: list[tuple[slice, torch.Tensor, torch.Tensor]]) -> Update:
    """Parts of one projection (a fused one's q, k, v) as one update: their a's ranks side by side."""
    placed, column = [], 0
    for where, part_a, part_b in parts:
        placed.append((where, slice(column, column + part_a.shape[0]), part_b.contiguous()))
        column += part_a.shape[0]
    return Update(torch.cat([part_a for _, part_a, _ in parts]), tuple(placed))


def _target(model: nn.Module, module: str) -> tuple[str, slice, tuple[int, int]] | None:
    """PEFT's module name -> (our projection's path, the slice of its outputs, its (in, out) features);
    None where the model has no such projection."""
    module = _ours(model, module)
    parent_path, _, leaf = module.rpartition(".")
    try:
        parent = model.get_submodule(parent_path) if parent_path else model
    except AttributeError:
        return None
    part = _part(parent, leaf)
    if part is not None:  # a part of a fused projection: its slice of the outputs
        name, where = part
        return f"{parent_path}.{name}", where, _dims(parent.get_submodule(name))
    child = getattr(parent, leaf, None)
    if not isinstance(child, nn.Module) or _dims(child) is None:
        return None
    size = _dims(child)
    assert size is not None
    return module, slice(0, size[1]), size


def _ours(model: nn.Module, module: str) -> str:
    """PEFT's module name (the base checkpoint's: a task model's `bert.encoder…`) as the model's."""
    return model_name(model, f"{module}.weight").removesuffix(".weight")


def _part(parent: nn.Module, leaf: str) -> tuple[str, slice] | None:
    """Where the projection `leaf` of `parent` went when its family fused it: (the fused projection, its
    slice of the outputs). A module's `part_slices()` says so where parts differ in width (grouped
    queries' k and v); else its class's PARTS, (fused projection, index, parts) of equal widths."""
    slices = getattr(parent, "part_slices", None)
    if slices is not None:
        found: tuple[str, slice] | None = slices().get(leaf)
        return found
    fused: dict[str, tuple[str, int, int]] = getattr(parent, "PARTS", {})
    if leaf not in fused:
        return None
    name, index, count = fused[leaf]
    width = _dims(parent.get_submodule(name))[1] // count
    return name, slice(index * width, (index + 1) * width)


def _dims(module: nn.Module) -> Any:
    """A projection's (in, out) features, through the wrappers precision adds (engine/precision); None
    for a module that is no projection."""
    while not hasattr(module, "in_features") and isinstance(getattr(module, "inner", None), nn.Module):
        module = module.inner  # type: ignore[assignment]
    if not hasattr(module, "in_features"):
        return None
    return int(module.in_features), int(module.out_features)  # type: ignore[arg-type]
