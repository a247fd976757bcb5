"""Each of TEI's RPCs as the pooling pipeline runs it: the request message becomes the body the HTTP
route parses (same prepare: same checks, limits and admission), and the route's engine output is
rendered straight into the response message's bytes (on the executor, as the routes render JSON).

Every `prepare` here builds its JSON body on the executor: nothing of the request's size is done on
the event loop; except a short text's (Embed's, Predict's, up to LOOP_CHARS), prepared and rendered
on the loop (pipeline.respond's on_loop): tokenizing it costs less CPU than the executor hops around
it (~35-80 us each on a Zen 3 core), and a stream of such messages is gRPC's common case."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from server import kinds
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepare, Prepared, Render
from server.grpc.messages import message
from server.protocols.tei import DecodeRequest, TEITokenizeRequest
from server.routes import score, sparse, tei, tokenize
from server.tokenizing.tokenizer import Direction

Body = dict[str, Any]

EmbedResponse = message("EmbedResponse")
EmbedSparseResponse = message("EmbedSparseResponse")
EmbedAllResponse = message("EmbedAllResponse")
PredictResponse = message("PredictResponse")
RerankResponse = message("RerankResponse")
EncodeResponse = message("EncodeResponse")
DecodeResponse = message("DecodeResponse")
SparseValue = message("SparseValue")
Prediction = message("Prediction")
Rank = message("Rank")
SimpleToken = message("SimpleToken")

DIRECTIONS: tuple[Direction, Direction] = ("right", "left")  # TEI's TruncationDirection enum, by value
LOOP_CHARS = 1024  # ~0.5 ms of the loop's time to prepare (the tokenizer: ~0.45 ms on a Zen 3 core)


class InvalidRequest(Exception):
    """A check TEI makes itself before any work, with its message (gRPC's INVALID_ARGUMENT)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def packed_floats(vector: np.ndarray) -> bytes:
    """Field 1 as `repeated float` (EmbedResponse.embeddings, TokenEmbedding.embeddings): packed
    little-endian float32, written straight from the array's bytes."""
    data = np.ascontiguousarray(vector, dtype="<f4").tobytes()
    return b"\x0a" + _varint(len(data)) + data


def _submessage(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def direction(value: int) -> Direction:
    return DIRECTIONS[value] if 0 <= value < len(DIRECTIONS) else "right"


def text_options(request: Any) -> Body:
    """What Embed, EmbedSparse and EmbedAll share: the input, truncation and its side, a prompt name."""
    if not request.inputs:
        raise InvalidRequest("`inputs` cannot be empty")
    body: Body = {
        "inputs": request.inputs,
        "truncate": request.truncate,
        "truncation_direction": direction(request.truncation_direction),
    }
    if request.HasField("prompt_name"):
        body["prompt_name"] = request.prompt_name
    return body


def fed(route_prepare: Prepare, body: Callable[[], Body]) -> Prepare:
    """The route's prepare, given the request as the route's JSON body (built on the executor)."""

    def prepare(raw: bytes, ctx: RequestContext) -> Prepared[Any, Any]:
        return route_prepare(orjson.dumps(body()), ctx)

    return prepare


@dataclass(frozen=True)
class Call:
    """An RPC that runs on an engine: prepare and render for pipeline.respond, the response's class
    (its metadata is added after), the characters it computes on (TEI's compute_chars), and whether
    a render this cheap may run on the loop (for a short enough request: `on_loop`)."""

    prepare: Prepare
    render: Render
    response: Any
    chars: int
    cheap_render: bool = False

    @property
    def on_loop(self) -> bool:
        return self.cheap_render and self.chars <= LOOP_CHARS


def embed(request: Any) -> Call:
    def body() -> Body:
        fields = text_options(request)
        if request.HasField("normalize"):
            fields["normalize"] = request.normalize
        if request.HasField("dimensions"):
            fields["dimensions"] = request.dimensions
        return fields

    def render(prep: Prepared[Any, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
        (item,) = kinds.of(ctx).items(prep, outcome, ctx)
        return packed_floats(item["embedding"])

    return Call(fed(tei.prepare_embed, body), render, EmbedResponse, len(request.inputs), cheap_render=True)


def embed_sparse(request: Any) -> Call:
    def render(prep: Prepared[Any, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
        (weights,) = kinds.of(ctx).lexical(prep, outcome, ctx)
        pairs = zip(weights["indices"], weights["values"], strict=True)
        values = [SparseValue(index=int(i), value=float(v)) for i, v in pairs]
        return bytes(EmbedSparseResponse(sparse_embeddings=values).SerializeToString())

    prepare = fed(sparse.prepare_embed_sparse, lambda: text_options(request))
    return Call(prepare, render, EmbedSparseResponse, len(request.inputs))


def embed_all(request: Any) -> Call:
    def render(prep: Prepared[Any, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
        (vectors,) = kinds.of(ctx).token_items(prep, outcome, ctx)
        return b"".join(_submessage(1, packed_floats(v)) for v in vectors)

    prepare = fed(tei.prepare_embed_all, lambda: text_options(request))
    return Call(prepare, render, EmbedAllResponse, len(request.inputs))


def _render_predict(prep: Prepared[Any, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
    (labels,) = tei.predictions(prep, outcome, ctx)
    return bytes(PredictResponse(predictions=[Prediction(**p) for p in labels]).SerializeToString())


def predict(request: Any) -> Call:
    if not request.inputs:
        raise InvalidRequest("`inputs` cannot be empty")
    body = {"inputs": [request.inputs], "truncate": request.truncate, "raw_scores": request.raw_scores}
    body["truncation_direction"] = direction(request.truncation_direction)
    chars = len(request.inputs)
    return Call(fed(tei.prepare_predict, lambda: body), _render_predict, PredictResponse, chars, cheap_render=True)


def predict_pair(request: Any) -> Call:
    texts = list(request.inputs)
    if len(texts) not in (1, 2):
        raise InvalidRequest(f"`inputs` must have a single or two elements. Given: {len(texts)}")
    body = {"inputs": [texts], "truncate": request.truncate, "raw_scores": request.raw_scores}
    body["truncation_direction"] = direction(request.truncation_direction)
    chars = sum(len(t) for t in texts)
    return Call(fed(tei.prepare_predict, lambda: body), _render_predict, PredictResponse, chars, cheap_render=True)


def _ranks(scores: np.ndarray, order: list[int], texts: list[str] | None) -> bytes:
    ranks = [Rank(index=i, score=float(scores[i]), **({"text": texts[i]} if texts else {})) for i in order]
    return bytes(RerankResponse(ranks=ranks).SerializeToString())


def rerank(request: Any, max_texts: int) -> Call:
    """TEI's Rerank: the same ranking as POST /rerank in TEI's shape."""
    texts = list(request.texts)
    check_rerank_size(len(texts), max_texts)

    def body() -> Body:
        return {
            "query": request.query,
            "texts": texts,
            "truncate": request.truncate,
            "raw_scores": request.raw_scores,
            "return_text": request.return_text,
            "truncation_direction": direction(request.truncation_direction),
        }

    def render(prep: Prepared[Any, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
        found, order, _ = score.ranked(prep, outcome.vectors, ctx)  # TEI's message has no passage
        return _ranks(found, order, texts if request.return_text else None)

    chars = len(request.query) * len(texts) + sum(len(t) for t in texts)
    return Call(fed(score.prepare_rerank, body), render, RerankResponse, chars)


def check_rerank_size(count: int, max_texts: int) -> None:
    if count == 0:
        raise InvalidRequest("`texts` cannot be empty")
    if count > max_texts:
        raise InvalidRequest(f"batch size {count} > maximum allowed batch size {max_texts}")


def rerank_pairs(requests: list[Any]) -> Call:
    """TEI's RerankStream: each message one (query, text) pair, scored and ranked together; the
    first message's raw_scores, return_text and truncation decide, as TEI's comments say."""
    first = requests[0]
    queries, texts = [r.query for r in requests], [r.text for r in requests]
    limit = -1 if first.truncate else None

    def prepare(raw: bytes, ctx: RequestContext) -> Prepared[Any, Any]:
        ctx.require("/rerank", *score.SCORERS)
        fields = ("query", "text")
        tokens, pairs = score.tokenize_pairs(queries, texts, ctx, limit, fields, direction(first.truncation_direction))
        return Prepared(first, tokens, pairs)

    def render(prep: Prepared[Any, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
        found = score.pair_scores(outcome.vectors, prep.state, ctx, raw=first.raw_scores)
        order = sorted(range(len(found)), key=lambda i: -found[i])
        return _ranks(found, order, texts if first.return_text else None)

    chars = sum(len(q) + len(t) for q, t in zip(queries, texts, strict=True))
    return Call(prepare, render, RerankResponse, chars)


def metadata(call: Call, prepared: Prepared[Any, Any], timings: Any, total_s: float) -> bytes:
    """The response's field 2, Metadata, to append to the rendered message (fields of concatenated
    messages merge)."""
    fields = {
        "compute_chars": call.chars,
        "compute_tokens": prepared.n_tokens,
        "total_time_ns": int(total_s * 1e9),
        "tokenization_time_ns": int(timings.tokenization_ms * 1e6),
        "queue_time_ns": int(timings.queue_ms * 1e6),
        "inference_time_ns": int(timings.inference_ms * 1e6),
    }
    return bytes(call.response(metadata=fields).SerializeToString())


# The tokenizer alone (no engine): respond functions for pipeline.respond_without_engine


def tokenize_respond(request: Any) -> Callable[[bytes, RequestContext], bytes]:
    if not request.inputs:
        raise InvalidRequest("`inputs` cannot be empty")

    def respond(raw: bytes, ctx: RequestContext) -> bytes:
        ctx.shape = "tei"
        body = TEITokenizeRequest(
            inputs=request.inputs,
            add_special_tokens=request.add_special_tokens,
            prompt_name=request.prompt_name if request.HasField("prompt_name") else None,
        )
        (spans,) = tokenize.tei_spans(body, ctx)
        tokens = [SimpleToken(**{k: v for k, v in span.items() if v is not None}) for span in spans]
        return bytes(EncodeResponse(tokens=tokens).SerializeToString())

    return respond


def decode_respond(request: Any) -> Callable[[bytes, RequestContext], bytes]:
    if not request.ids:
        raise InvalidRequest("`input_ids` cannot be empty")

    def respond(raw: bytes, ctx: RequestContext) -> bytes:
        body = DecodeRequest(ids=list(request.ids), skip_special_tokens=request.skip_special_tokens)
        (text,) = tokenize.decoded(body, ctx)
        return bytes(DecodeResponse(text=text).SerializeToString())

    return respond
