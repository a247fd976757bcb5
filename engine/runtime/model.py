"""The model in the engine process: load, pad, forward under inference_mode, pool."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.folderjson import ModelError
from common.modelfolder import ModelFolder
from common.wire import Tokens
from engine.families import clip
from engine.heads import answer, default_head, dense, m3, multivector, sparse
from engine.heads.pooling import pool, pool_packed
from engine.layers import lora
from engine.layers.packed import Packed
from engine.precision import gemm, int8, rows
from engine.runtime import preloaded
from engine.runtime.device import Placement
from engine.runtime.warmup import Warmup, warm_up


class PoolingModel:
    """Models of a native family run on its engine module (engine.families); anything else on
    transformers. sentence-transformers' Dense modules follow the pooling on either."""

    def __init__(
        self,
        info: ModelFolder,
        threads: int,
        placement: Placement | None = None,
        adapters: Sequence[tuple[str, Path]] = (),
        gemm_records: Path | None = None,
    ) -> None:
        torch.set_num_threads(threads)
        self.info = info
        self.placement = placement or Placement(torch.device("cpu"), torch.float32)
        device, dtype = self.placement.device, self.placement.dtype
        config = info.config
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.uses_types = bool(config.get("type_vocab_size"))
        if info.native:  # built in the forkserver where it could be (engine/runtime/preloaded.py)
            # with `gemm_records`, its float32 or bfloat16 layers' products on this CPU's faster backend
            self.model, self.weights = preloaded.native_model(info, self.placement, gemm_records)
        else:
            self.model, self.weights = _transformers_model(info, device, dtype), {"weights": "engine"}
            if self.placement.int8:
                int8.quantize(self.model)
            rows.bucket(self.model, device, dtype)
        self.weights.update(int8.describe(self.model) | gemm.describe(self.model))
        if isinstance(self.model, clip.DualEncoder):  # the engine phase reports both towers
            self.weights["towers"] = self.model.towers
        # after the pooling; a ColBERT's project every token (in the native model itself, engine/heads/multivector.py)
        projects = info.kind == "embedding" or (info.kind == "multi-vector" and not info.native)
        self.dense = dense.load(info.dense, device, dtype) if projects else None
        if self.dense is not None:  # one row per input: float32's rows kept to a multiple (engine/precision/rows.py)
            rows.bucket(self.dense, device, dtype)
        self.compiled: Callable[[Packed], torch.Tensor] | None = None  # set by engine.compiling.compilation
        # bge-m3's heads: small (hidden x (1 + hidden)), loaded here rather than in the forkserver;
        # refused ones (not tensors only) leave the dense vector, the reason in the load report
        self.m3: m3.M3Heads | None = None
        self.m3_refused: str | None = None
        if info.m3 is not None:
            try:
                self.m3 = m3.load(info.m3, info.hidden_size, device, dtype)
                rows.bucket(self.m3, device, dtype)
            except m3.Refused as exc:
                self.m3_refused = str(exc)
        self.default_head = default_head(info)  # what an input naming no head gets (engine/heads)
        # None where no adapter can be served: through transformers, and CLIP/SigLIP's two towers (a SPLADE or
        # ColBERT model names its encoder's modules as the checkpoint does: engine/layers/checkpoint.py)
        served = info.native and not isinstance(self.model, clip.DualEncoder)
        self.adapters = lora.load(adapters, self.model, device, dtype) if served else None
        if adapters and self.adapters is None:
            raise ModelError(self.no_adapters)

    @property
    def no_adapters(self) -> str:
        return f"LoRA adapters are served on the native text encoders only, not on {self.info.path}"

    def holds_adapter(self, name: str) -> bool:
        """Its inputs can run here: the engine loaded the LoRA adapter `name` (and still holds it)."""
        return self.adapters is not None and name in self.adapters.folders

    def sync_adapters(self, wanted: Sequence[tuple[str, Path]]) -> dict[str, Any]:
        """The adapters the HTTP process wants now (engine/layers/lora.py Adapters.sync's report)."""
        if self.adapters is None:
            return {"loaded": {}, "refused": {name: self.no_adapters for name, _ in wanted}}
        return self.adapters.sync(wanted)

    def _run(self, packed: Packed) -> torch.Tensor:
        if packed.adapters is not None:  # eager: the compiled graph has no adapter updates in it
            if self.adapters is None:
                raise ValueError(self.no_adapters)
            with self.adapters.applied(packed):
                return self.model(packed)  # type: ignore[no-any-return]
        if self.compiled is None or packed.keys is not None:  # the compiled graph attends to every token
            return self.model(packed)  # type: ignore[no-any-return]
        return self.compiled(packed)

    @property
    def packed(self) -> bool:
        """Native models run without padding (batch_tokens counts real tokens for them)."""
        return self.info.native

    @torch.inference_mode()
    def forward(self, items: list[Tokens]) -> np.ndarray:
        """One forward pass; rows in the order of items, float32."""
        if isinstance(self.model, clip.DualEncoder):  # texts and images: each through its tower
            assert self.info.vision is not None  # a dual encoder's folder has its vision config
            return clip.embed(self.model, items, self.placement.device, self.info.vision.steps)
        if self.info.native:
            packed = Packed.of(items).to(self.placement.device)
            out = self._run(packed)
            if self.info.kind != "embedding":
                return out.float().cpu().numpy()  # type: ignore[no-any-return]
            return self._project(pool_packed(out, packed, self.info.pooling))
        return self._forward_padded(items)

    @torch.inference_mode()
    def forward_outputs(self, items: list[Tokens]) -> list[dict[str, np.ndarray]]:
        """bge-m3: each input's asked outputs (engine/heads/m3.py) from one forward of the group."""
        if self.m3 is None:
            raise ModelError(f"{self.info.path} has no bge-m3 heads loaded: it answers its dense vector only")
        packed = Packed.of(items).to(self.placement.device)
        hidden = self._run(packed)
        wanted = [item.outputs for item in items]
        dense = (
            self._project(pool_packed(hidden, packed, self.info.pooling)) if any("dense" in w for w in wanted) else None
        )
        return m3.outputs(self.m3, hidden, dense, packed, wanted)

    @torch.inference_mode()
    def forward_tokens(self, items: list[Tokens]) -> list[np.ndarray]:
        """Each input's last hidden state, one row per token (embedding models), or its normalised
        token vectors (multi-vector models), as float32."""
        if self.info.native:
            packed = Packed.of(items).to(self.placement.device)
            hidden = self._run(packed).float().cpu().numpy()
            return [hidden[start : start + n] for start, n in packed.spans]
        rows = []
        for item in items:  # one at a time: no padding to strip, and rare enough not to batch
            ids = torch.tensor([item.input_ids], dtype=torch.long, device=self.placement.device)
            types = {} if not self.uses_types else {"token_type_ids": torch.zeros_like(ids)}
            mask = torch.zeros_like(ids)
            mask[0, : item.keys or ids.shape[1]] = 1
            states = self.model(input_ids=ids, attention_mask=mask, **types).last_hidden_state[0]
            if self.info.kind == "multi-vector":
                states = multivector.project(states, self.dense)
            rows.append(states.float().cpu().numpy())
        return rows

    def _project(self, pooled: torch.Tensor) -> np.ndarray:
        """The pooled vectors through the Dense modules, if any, as float32 on the host."""
        if self.dense is not None:
            pooled = self.dense(pooled)
        return pooled.float().cpu().numpy()  # type: ignore[no-any-return]

    def _forward_padded(self, items: list[Tokens]) -> np.ndarray:
        longest = max(len(item.input_ids) for item in items)
        ids = torch.full((len(items), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), longest), dtype=torch.long)
        types = torch.zeros((len(items), longest), dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item.input_ids)
            ids[row, :n] = torch.tensor(item.input_ids, dtype=torch.long)
            mask[row, :n] = 1
            if item.token_type_ids is not None:
                types[row, :n] = torch.tensor(item.token_type_ids, dtype=torch.long)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if self.uses_types:
            inputs["token_type_ids"] = types
        inputs = {name: tensor.to(self.placement.device) for name, tensor in inputs.items()}
        out = self.model(**inputs)
        if self.info.splade is not None:
            return sparse.pool_padded(out.logits, inputs["attention_mask"], self.info.splade).float().cpu().numpy()  # type: ignore[no-any-return]
        if self.info.kind != "embedding":
            return out.logits.float().cpu().numpy()  # type: ignore[no-any-return]
        return self._project(pool(out.last_hidden_state, inputs["attention_mask"], self.info.pooling))

    def warm_up(self) -> Warmup:
        """Pay first-call costs before readiness flips, with small shapes; price a call and a token
        (engine/runtime/warmup.py): the batcher weighs the per-call overhead against padding when it splits
        a padded batch, and the cost per token sizes the stall watchdog's default timeout."""
        warmup = warm_up(lambda items: answer(self, items), self.model, self.pad_id + 1, self.placement.device)
        if self.info.vision is not None:  # and the image tower, with one image
            warmup.detail["image_forward_ms"] = clip.warm_image(self.model, self.info.vision)
        return warmup


def _transformers_model(info: ModelFolder, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification  # off the native path

    loaders = {"embedding": AutoModel, "multi-vector": AutoModel, "sparse": AutoModelForMaskedLM}
    loader = loaders.get(info.kind, AutoModelForSequenceClassification)
    try:
        return loader.from_pretrained(str(info.path), dtype=dtype, weights_only=True).to(device).eval()
    except Exception as exc:  # transformers raises many types for a broken folder
        raise ModelError(f"cannot load model from {info.path}: {type(exc).__name__}: {exc}") from exc
