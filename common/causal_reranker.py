"""Causal-LM rerankers (Qwen3-Reranker): a language model asked, in a fixed prompt, whether a document
meets a query, scored by its "yes" and "no" logits at the prompt's last token. The prompt template,
which folders are served this way, and the two token ids the score reads; config files only.

The rule: a folder whose config names one of CAUSAL_RERANKERS' architectures (Qwen3ForCausalLM)
and that has no sentence-transformers modules (no modules.json; Qwen3-Embedding has one) is a
reranker, and its tokenizer must know "yes" and "no" as single tokens. vLLM and sentence-transformers
do not recognise it on their own (vLLM wants hf_overrides naming the tokens and the conversion,
and the client to format the prompt); here the folder alone decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PairTemplate:
    """A (query, document) pair as the prompt a causal-LM reranker reads: prefix, body and suffix,
    encoded as the model card encodes them (the body with the tokenizer's own special tokens and cut
    to fit, prefix and suffix without any and never cut)."""

    prefix: str
    body: str  # with {instruction}, {query} and {document}
    suffix: str
    instruction: str  # the default instruction

    def format(self, query: str, document: str) -> str:
        """The body for this pair (only the template is parsed for fields, never the texts)."""
        return self.body.format(instruction=self.instruction, query=query, document=document)


# Qwen3-Reranker's model card, verbatim.
QWEN3_RERANKER = PairTemplate(
    prefix="<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n',
    body="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    instruction="Given a web search query, retrieve relevant passages that answer the query",
)

# model_type -> the architecture served as a yes/no reranker (without sentence-transformers
# modules) and its prompt template; engine.families.SCORERS has a loader for each.
CAUSAL_RERANKERS: dict[str, tuple[str, PairTemplate]] = {"qwen3": ("Qwen3ForCausalLM", QWEN3_RERANKER)}
TRUE_TOKEN, FALSE_TOKEN = "yes", "no"


def reranker_template(config: dict[str, Any], architecture: str, has_modules: bool) -> PairTemplate | None:
    """The prompt template when the folder is a causal-LM reranker by the rule above, else None."""
    served = CAUSAL_RERANKERS.get(str(config.get("model_type")))
    if served is None or has_modules or architecture != served[0]:
        return None
    return served[1]


def score_token_ids(path: Path) -> tuple[int, int] | None:
    """The ids of the single tokens "no" and "yes" in the folder's tokenizer.json (added tokens first,
    then the model's vocabulary, as the model card's convert_tokens_to_ids looks them up), or None
    when either is missing."""
    try:
        tokenizer = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    vocab = tokenizer.get("model", {}).get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] rows, the id is the row
        vocab = {row[0]: i for i, row in enumerate(vocab)}
    ids = {**(vocab or {}), **{t["content"]: t["id"] for t in tokenizer.get("added_tokens") or []}}
    no, yes = ids.get(FALSE_TOKEN), ids.get(TRUE_TOKEN)
    return (int(no), int(yes)) if no is not None and yes is not None else None
