"""A ColBERT's marker, mask and skiplist token ids, looked up in its tokenizer once when its folder is read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from common.folderjson import ModelError
from common.late_interaction import LateInteraction


@dataclass(frozen=True)
class Markers:
    """A ColBERT's token ids: the query and document markers (None: the model has none), the mask
    token a short query is padded with, and the tokens a document's vectors leave out."""

    query: int | None
    document: int | None
    mask: int | None
    skip: frozenset[int]


def markers_of(tok: Tokenizer, folder: Path, late: LateInteraction) -> Markers:
    """The ids PyLate looks up with convert_tokens_to_ids; a marker or mask token the vocabulary
    lacks is a ModelError, a skiplist word it lacks is left out (it would otherwise match [UNK])."""

    def token(text: str, what: str) -> int:
        found = tok.token_to_id(text)
        found = tok.token_to_id(text.strip()) if found is None else found
        if found is None:
            raise ModelError(f"the tokenizer of {folder} has no {what} token {text!r}")
        return found

    mask = None
    if late.expansion:
        try:
            named = json.loads((folder / "tokenizer_config.json").read_text()).get("mask_token") or "[MASK]"
        except (OSError, ValueError):
            named = "[MASK]"
        mask = token(named["content"] if isinstance(named, dict) else str(named), "mask")
    return Markers(
        query=token(late.query_prefix, "query marker") if late.query_prefix else None,
        document=token(late.document_prefix, "document marker") if late.document_prefix else None,
        mask=mask,
        skip=frozenset(i for i in (tok.token_to_id(word) for word in late.skiplist) if i is not None),
    )
