"""Dense embeddings: one vector per input, pooled as the model's modules say (sentence-transformers'
Pooling, Dense and Normalize); long inputs as windows combined, or one document's chunks pooled
late; Matryoshka `dimensions`; scored by the cosine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.wire import Tokens
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared
from server.kinds.base import Ask, Item, OutputKind, check_dimensions
from server.kinds.pairs import PairAsk, Pairs, dot_products, encode_pairs
from server.texts import chunking, late_chunking
from server.texts.prompts import prompt_text

_TEI_POOLING = {"lasttoken": "last_token"}  # TEI's names where they differ from ours


def check_no_sparse_options(ask: Ask) -> None:
    """top_k and threshold prune sparse weights: a 400 on a model without them."""
    for name in ("top_k", "threshold"):
        if getattr(ask.sparse, name) is not None:
            raise inputs.bad_request(f"'{name}' applies to sparse (SPLADE) models only", name)


def only_dense(names: Sequence[str] | None, field: str) -> None:
    """`outputs` on a model without bge-m3's heads: the dense vector alone, else a 400."""
    if names is not None and set(names) != {"dense"}:
        raise inputs.bad_request(
            "'outputs' other than dense need a bge-m3 model (sparse_linear, colbert_linear)", field
        )


def check_quantized_width(ask: Ask) -> None:
    """embed_dtype and endianness shape base64's floats: with quantized codes they cannot apply."""
    encoding = ask.encoding
    if encoding.encoding_format in outputs.QUANTIZED and encoding.embed_dtype != "float32":
        raise inputs.bad_request(
            f"embed_dtype={encoding.embed_dtype} sets the width of base64's floats: "
            f"encoding_format={encoding.encoding_format} answers its own codes",
            "embed_dtype",
        )


def late(ask: Ask, ctx: RequestContext, prompt: str) -> Prepared[Ask, late_chunking.LateChunks]:
    """One document's chunks, encoded together and pooled each from its own tokens' states."""
    if ask.truncate is not None or ask.outputs is not None or ask.long_inputs is not None:
        raise inputs.bad_request(
            "late_chunking windows the whole document itself: truncate_prompt_tokens, long_inputs and "
            "outputs do not apply",
            "late_chunking",
        )
    tokens, chunks = late_chunking.tokenize(ask.inputs, ctx, prompt)
    return Prepared(ask, tokens, chunks)


def windowed(ask: Ask, ctx: RequestContext, prompt: str) -> tuple[list[Tokens], chunking.Windows | None]:
    return chunking.tokenize(
        ask.inputs,
        ctx,
        ask.truncate,
        ask.long_inputs,
        ask.field,
        prompt=prompt,
        direction=ask.direction,
    )


class Dense(OutputKind):
    """One vector per input, pooled as the model's modules say; long inputs as windows or late chunks;
    Matryoshka `dimensions`; pairs scored by the cosine."""

    name = "dense"
    capabilities: ClassVar[tuple[str, ...]] = ("embed",)

    def card(self, folder: ModelFolder, settings: Settings) -> dict[str, Any]:
        return {"outputs": ["dense"], "pooling": folder.pooling}

    def tei_type(self, folder: ModelFolder) -> dict[str, Any]:
        return {"embedding": {"pooling": _TEI_POOLING.get(folder.pooling, folder.pooling)}}

    def prompt(self, ask: Ask, ctx: RequestContext) -> str:
        return ask.prompt if ask.prompt is not None else prompt_text(ctx.folder, ask.prompt_name)

    def embed(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, Any]:
        check_dimensions(ask.dimensions, ctx)
        check_no_sparse_options(ask)
        check_quantized_width(ask)
        prompt = self.prompt(ask, ctx)
        if ask.late_chunking:
            return late(ask, ctx, prompt)
        only_dense(ask.outputs, ask.outputs_field)
        tokens, windows = windowed(ask, ctx, prompt)
        return Prepared(ask, tokens, windows)

    def vectors(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> np.ndarray:
        """One vector per input: windows combined, late chunks pooled; cut and normalised as asked."""
        state = prep.state
        if isinstance(state, late_chunking.LateChunks):
            pooled = late_chunking.pooled(outcome.vectors, state, normalize=False)
        else:
            pooled = chunking.combine(outcome.vectors, state if isinstance(state, chunking.Windows) else None)
        ask = prep.body
        normalize = ctx.folder.normalize if ask.normalize is None else ask.normalize
        return outputs.embeddings(pooled, ask.dimensions, normalize)

    def items(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[Item]:
        encoding = prep.body.encoding
        vectors = self.vectors(prep, outcome, ctx)
        encoded = outputs.encode_vectors(vectors, encoding.encoding_format, encoding.embed_dtype, encoding.endianness)
        return [{"embedding": e} for e in encoded]

    def embed_tokens(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, None]:
        """Each token's last hidden state (special tokens included), as TEI's /embed_all answers."""
        tokens = inputs.tokenize_inputs(
            ask.inputs,
            ctx,
            ask.truncate,
            ask.field,
            prompt=prompt_text(ctx.folder, ask.prompt_name),
            direction=ask.direction,
        )
        values = sum(len(t.input_ids) for t in tokens) * ctx.folder.hidden_size
        ctx.budget_response(values * outputs.JSON_FLOAT_BYTES, ask.field)
        return Prepared(ask, [t._replace(head="tokens") for t in tokens])

    def token_items(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[np.ndarray]:
        return list(outcome.vectors)

    def pairs(self, ask: PairAsk, ctx: RequestContext) -> tuple[list[Tokens], Pairs]:
        return encode_pairs(ask, ctx, cross=False)

    def scores(self, vectors: Any, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
        return dot_products(vectors, pairs)
