"""Multi-vector (ColBERT) models on the HTTP side: queries and documents tokenized as PyLate
tokenizes them, the vectors a document keeps, and MaxSim.

A document is its text's tokens with the document marker after the first one, cut to the model's
document length; its vectors leave out the skiplist's tokens (punctuation). A query is cut to the
query length with its marker, then padded to it with the mask token, which the query's own tokens
do not attend to (unless the model attends to its expansion): every one of its vectors is scored.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.wire import Tokens
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared
from server.kinds.base import Ask, OutputKind
from server.kinds.pairs import PairAsk, Pairs
from server.tokenizing.markers import Markers
from server.tokenizing.tokenizer import Direction

Role = Literal["query", "document"]

# prompt_name values and Cohere input types that make an input a query or a document
_ROLES: dict[str, Role] = {
    "query": "query",
    "search_query": "query",
    "document": "document",
    "search_document": "document",
    "passage": "document",
}


def role_of(ctx: RequestContext, prompt_name: str | None = None, input_type: str | None = None) -> Role:
    """What a request asks its inputs to be encoded as: a document unless it names a query role."""
    for field, value in (("prompt_name", prompt_name), ("input_type", input_type)):
        if value is not None:
            if value not in _ROLES:
                raise inputs.bad_request(
                    f"{field} '{value}' is neither a query nor a document role of this multi-vector model "
                    f"(one of {sorted(_ROLES)})",
                    field,
                )
            return _ROLES[value]
    return "document"


def markers(ctx: RequestContext) -> Markers:
    found = ctx.tokenizers.markers
    assert found is not None, "a multi-vector model's tokenizer resolves its markers"
    return found


def tokenize(
    value: Any,
    ctx: RequestContext,
    role: Role,
    truncate: int | None,
    field: str = "input",
    direction: Direction = "right",
    vectors: bool = True,
) -> list[Tokens]:
    """Each input as the model encodes it in `role`, marked for per-token vectors. Token ids are
    taken as given; a text's marker counts toward its length (queries are always cut to theirs).
    With `vectors` the answer holds the token vectors: their size is checked against the budget."""
    late, found = ctx.folder.late, markers(ctx)
    assert late is not None
    marker = found.query if role == "query" else found.document
    limit = (
        min(late.query_tokens, ctx.folder.max_model_len) if role == "query" else inputs.truncation_limit(truncate, ctx)
    )
    room = None if limit is None else limit - (marker is not None)
    given = [value] if isinstance(value, str) else value
    texts = bool(given) and all(isinstance(v, str) for v in given)
    prompt = late.query_prompt if role == "query" else late.document_prompt
    tokens = inputs.tokenize_inputs(value, ctx, room if texts else truncate, field, prompt=prompt, direction=direction)
    marked = []
    for i, tok in enumerate(tokens):
        ids = tok.input_ids
        if texts and marker is not None:
            ids = [*ids[:1], marker, *ids[1:]]
        keys = 0
        if texts and role == "query" and late.expansion and found.mask is not None and len(ids) < late.query_length:
            keys = 0 if late.attend_expansion else len(ids)
            ids = ids + [found.mask] * (late.query_length - len(ids))
        inputs.check_length(len(ids), ctx.folder, f"{field}[{i}]" if len(tokens) > 1 else field)
        types = None if tok.token_type_ids is None else [0] * len(ids)
        marked.append(Tokens(ids, types, priority=tok.priority, keys=keys))  # default head: tokens
    if vectors:
        size = sum(len(t.input_ids) for t in marked) * ctx.folder.dimensions * outputs.JSON_FLOAT_BYTES
        ctx.budget_response(size, field)
    return marked


def kept(vectors: np.ndarray, tokens: Tokens, role: Role, ctx: RequestContext) -> np.ndarray:
    """The vectors the model scores: a query's all (unless the model skips in queries too), a
    document's without its skiplist's tokens."""
    late = ctx.folder.late
    if role == "query" and not (late is not None and late.skip_queries):
        return vectors
    skip = markers(ctx).skip
    keep = [i for i, token in enumerate(tokens.input_ids) if token not in skip]
    return vectors if len(keep) == len(tokens.input_ids) else vectors[keep]


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """For each query vector its best dot product with any document vector, summed (ColBERT)."""
    return float((query.astype(np.float64) @ document.astype(np.float64).T).max(axis=1).sum())


class MultiVector(OutputKind):
    """A ColBERT model: every scored token's vector, queries and documents in their roles; MaxSim."""

    name = "multi-vector"
    capabilities: ClassVar[tuple[str, ...]] = ("rerank",)  # its token vectors are on /pooling and /embed_all

    def card(self, folder: ModelFolder, settings: Settings) -> dict[str, Any]:
        return {"outputs": ["multi_vector"], "pooling": "none", "similarity": "maxsim"}

    def tei_type(self, folder: ModelFolder) -> dict[str, Any]:
        return {"embedding": {"pooling": "none"}}

    def pair_prompt(self, ctx: RequestContext, prompt_name: str | None) -> str:
        return ""  # its roles bring their own prompts

    def embed_tokens(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, Role]:
        if ask.outputs is not None:
            raise inputs.bad_request(
                "'outputs' selects a bge-m3 model's outputs; this one answers token vectors",
                "outputs",
            )
        role = role_of(ctx, ask.prompt_name, ask.input_type)
        return Prepared(ask, tokenize(ask.inputs, ctx, role, ask.truncate, ask.field, ask.direction), role)

    def token_items(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[np.ndarray]:
        """Each input's scored vectors."""
        return [kept(v, t, prep.state, ctx) for v, t in zip(outcome.vectors, prep.tokens, strict=True)]

    def pairs(self, ask: PairAsk, ctx: RequestContext) -> tuple[list[Tokens], Pairs]:
        """Each distinct left text encoded once as a query, each distinct right text once as a
        document (a text on both sides is encoded both ways)."""
        queries, documents = list(dict.fromkeys(ask.lefts)), list(dict.fromkeys(ask.rights))
        (left_field, right_field), truncate, direction = ask.fields, ask.truncate, ask.direction
        ctx.admit(len(queries) + len(documents), right_field)  # every list the engine runs, both roles
        tokens = tokenize(queries, ctx, "query", truncate, left_field, direction, vectors=False)
        tokens += tokenize(documents, ctx, "document", truncate, right_field, direction, vectors=False)
        query_at = {text: i for i, text in enumerate(queries)}
        document_at = {text: len(queries) + i for i, text in enumerate(documents)}
        left, right = [query_at[t] for t in ask.lefts], [document_at[t] for t in ask.rights]
        return tokens, Pairs(len(ask.lefts), False, left, right, late=tokens)

    def scores(self, vectors: Any, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
        late = pairs.late
        assert late is not None
        queries = {a: kept(vectors[a], late[a], "query", ctx) for a in set(pairs.left)}
        documents = {b: kept(vectors[b], late[b], "document", ctx) for b in set(pairs.right)}
        return np.array([maxsim(queries[a], documents[b]) for a, b in zip(pairs.left, pairs.right, strict=True)])
