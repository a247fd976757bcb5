"""A ColBERT folder's late-interaction settings, as PyLate saves them (no torch).

PyLate writes its switches into config_sentence_transformers.json beside the sentence-transformers
modules (a Transformer, then Dense projections applied to every token): the marker tokens put after
the first token of a query and of a document, the query's fixed width (short queries padded with
the mask token, which the other tokens do not attend to unless the model says so), the document
length, and the words whose tokens a document's vectors leave out (punctuation).
"""

from __future__ import annotations

import json
import string
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# What PyLate's config_sentence_transformers.json carries; any one of them makes the folder a ColBERT.
PYLATE_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length", "do_query_expansion")


class LateInteractionError(ValueError):
    pass


@dataclass(frozen=True)
class LateInteraction:
    """How a ColBERT model encodes a query and a document, and which document tokens it scores."""

    query_prefix: str = "[unused0]"  # "" for none
    document_prefix: str = "[unused1]"
    query_length: int = 32  # every query is this many tokens: cut to it, or padded with the mask token
    document_length: int = 180  # the most a document takes, its marker included
    expansion: bool = True  # pad queries with the mask token (query augmentation)
    attend_expansion: bool = False  # the other tokens attend to the padding masks too
    skiplist: tuple[str, ...] = tuple(string.punctuation)  # tokens a document's vectors leave out
    # sentence-transformers' own MultiVectorEncoder saves: the roles' prompts (text put before the
    # input, as prompts are), the most tokens a query keeps where longer ones are not cut to its
    # width (query expansion "min"), and whether queries leave the skiplist's tokens out too
    query_prompt: str = ""
    document_prompt: str = ""
    query_cap: int | None = None
    skip_queries: bool = False

    @property
    def query_tokens(self) -> int:
        """The most tokens a query keeps."""
        return self.query_length if self.query_cap is None else max(self.query_cap, self.query_length)


def is_pylate(st_config: dict[str, Any]) -> bool:
    """PyLate's ColBERT saves say model_type "ColBERT", or carry its keys, or score by MaxSim."""
    return (
        st_config.get("model_type") == "ColBERT"
        or str(st_config.get("similarity_fn_name", "")).lower() == "maxsim"
        or any(key in st_config for key in PYLATE_KEYS)
    )


def read_late_interaction(st_config: dict[str, Any], folder: Path) -> LateInteraction:
    """PyLate's switches with PyLate's defaults where absent; LateInteractionError for values of the
    wrong kind."""
    default = LateInteraction()

    def get(key: str, kind: type, fallback: Any) -> Any:
        value = st_config.get(key)
        if value is None:
            return fallback
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            raise LateInteractionError(f"'{key}' in {folder / 'config_sentence_transformers.json'} is {value!r}")
        return value

    skiplist = get("skiplist_words", list, list(default.skiplist))
    found = LateInteraction(
        query_prefix=get("query_prefix", str, default.query_prefix),
        document_prefix=get("document_prefix", str, default.document_prefix),
        query_length=get("query_length", int, default.query_length),
        document_length=get("document_length", int, default.document_length),
        expansion=get("do_query_expansion", bool, default.expansion),
        attend_expansion=get("attend_to_expansion_tokens", bool, default.attend_expansion),
        skiplist=tuple(str(word) for word in skiplist),
    )
    if found.query_length < 3 or found.document_length < 3:
        raise LateInteractionError(f"query_length and document_length in {folder} must be at least 3")
    return found


def read_stanford(folder: Path) -> tuple[LateInteraction, tuple[int, int]]:
    """A Stanford-NLP ColBERT folder (architectures HF_ColBERT): its artifact.metadata's switches
    (ColBERT's defaults where absent; queries always padded with masks) and the (out, in) shape of
    the projection its checkpoint keeps beside the encoder, as `linear.weight`."""
    where = folder / "artifact.metadata"
    try:
        meta = json.loads(where.read_text()) if where.is_file() else {}
    except (OSError, ValueError) as exc:
        raise LateInteractionError(f"cannot read {where}: {exc}") from exc
    if not isinstance(meta, dict):
        raise LateInteractionError(f"{where} is not a JSON object")
    default = LateInteraction()
    late = read_late_interaction(
        {
            "query_prefix": meta.get("query_token_id") or default.query_prefix,
            "document_prefix": meta.get("doc_token_id") or default.document_prefix,
            "query_length": meta.get("query_maxlen"),
            "document_length": meta.get("doc_maxlen"),
            "attend_to_expansion_tokens": meta.get("attend_to_mask_tokens"),
            "skiplist_words": list(string.punctuation) if meta.get("mask_punctuation", True) else [],
        },
        folder,
    )
    return late, _tensor_shape(folder / "model.safetensors", "linear.weight")


def _tensor_shape(path: Path, name: str) -> tuple[int, int]:
    """A 2-D tensor's shape from a safetensors file's JSON header (no torch)."""
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(size, 100_000_000)))
        rows, cols = header[name]["shape"]
        return int(rows), int(cols)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise LateInteractionError(f"no 2-D '{name}' in {path}: a Stanford ColBERT keeps its projection there") from exc


def read_multi_vector_encoder(
    st_config: dict[str, Any], transformer: dict[str, Any], mask: dict[str, Any], max_len: int, folder: Path
) -> LateInteraction:
    """A MultiVectorEncoder save: its `query` and `document` prompts, the Transformer's document
    length and query expansion, and its MultiVectorMask's skiplist (`mask`, {} without one)."""
    prompts = st_config.get("prompts") or {}
    expansion = transformer.get("query_expansion")
    if expansion is not None and (not isinstance(expansion, dict) or expansion.get("strategy") not in ("fixed", "min")):
        raise LateInteractionError(f"query_expansion {expansion!r} in {folder} is not supported")
    if expansion is not None and expansion.get("token") is not None:
        raise LateInteractionError(
            f"query_expansion with its own token in {folder} is not supported (the mask token is)"
        )
    query_cap = transformer.get("query_length") or max_len
    tasks = mask.get("skiplist_tasks") or ["document"]
    found = read_late_interaction(
        {
            "query_prefix": "",
            "document_prefix": "",
            "query_length": (expansion or {}).get("length") or query_cap,
            "document_length": transformer.get("document_length") or max_len,
            "do_query_expansion": expansion is not None,
            "attend_to_expansion_tokens": bool((expansion or {}).get("attend")),
            "skiplist_words": mask.get("skiplist_words") or [],
        },
        folder,
    )
    return replace(
        found,
        query_prompt=str(prompts.get("query") or ""),
        document_prompt=str(prompts.get("document") or ""),
        query_cap=query_cap if (expansion or {}).get("strategy") == "min" else None,
        skip_queries="query" in tasks,
    )
