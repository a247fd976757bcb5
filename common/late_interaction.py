"""A ColBERT folder's late-interaction settings, as PyLate saves them (no torch).

PyLate writes its switches into config_sentence_transformers.json beside the sentence-transformers
modules (a Transformer, then Dense projections applied to every token): the marker tokens put after
the first token of a query and of a document, the query's fixed width (short queries padded with
the mask token, which the other tokens do not attend to unless the model says so), the document
length, and the words whose tokens a document's vectors leave out (punctuation).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
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
