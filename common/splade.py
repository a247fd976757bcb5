"""A SparseEncoder folder's SPLADE pooling, read from its config (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


class SpladeError(ValueError):
    pass


@dataclass(frozen=True)
class Splade:
    """sentence-transformers' SpladePooling: log(1 + relu(logits)) (log1p twice for `log1p_relu`),
    then the max or the sum over each input's tokens: one weight per vocabulary entry."""

    strategy: Literal["max", "sum"] = "max"
    activation: Literal["relu", "log1p_relu"] = "relu"


def read_splade(conf: dict[str, Any], folder: Path) -> Splade:
    """SpladePooling's config.json; SpladeError for a strategy or an activation it does not define."""
    strategy, activation = conf.get("pooling_strategy", "max"), conf.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise SpladeError(f"SPLADE pooling {strategy!r} with {activation!r} in {folder} is not supported")
    return Splade(strategy, activation)


@dataclass(frozen=True)
class Routed:
    """A SparseEncoder Router folder (sentence-transformers' Router): documents through the masked
    LM in `encoder` and the SpladePooling in `pooling`; queries, where `idf` names the weights of a
    SparseStaticEmbedding, with no forward at all (inference-free: each token's weight)."""

    encoder: Path
    pooling: Path
    idf: Path | None


def read_router(path: Path, modules: list[dict[str, Any]], read: Any) -> Routed | None:
    """The routes of a folder whose only module is a Router (router_config.json); None for any
    other folder. `read` reads a JSON file ({} when absent). SpladeError for routes it cannot serve:
    the document route must be a masked LM then SpladePooling, the query route the same modules
    or one SparseStaticEmbedding."""
    if len(modules) != 1 or not str(modules[0].get("type", "")).endswith("Router"):
        return None
    config = read(path / "router_config.json")
    types, routes = config.get("types") or {}, config.get("structure") or {}
    document: list[str] = (
        routes.get("document") or routes.get((config.get("parameters") or {}).get("default_route") or "") or []
    )
    query: list[str] = routes.get("query") or document
    kinds = {name: str(types.get(name, "")) for name in [*document, *query]}
    if not document or len(document) != 2 or not kinds[document[1]].endswith("SpladePooling"):
        raise SpladeError(f"{path}: a Router's document route must be a masked LM then SpladePooling, got {document}")
    if query != document and not (len(query) == 1 and kinds[query[0]].endswith("SparseStaticEmbedding")):
        raise SpladeError(f"{path}: a Router's query route must be the document's modules or one SparseStaticEmbedding")
    idf = None if query == document else path / query[0] / "model.safetensors"
    if idf is not None and not idf.is_file():
        raise SpladeError(f"{path}: the query route's SparseStaticEmbedding has no model.safetensors")
    return Routed(path / document[0], path / document[1], idf)
