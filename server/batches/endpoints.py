"""The routes a batch job's lines may name: each line runs through the route's own prepare and render."""

from __future__ import annotations

from dataclasses import dataclass

from server.core.pipeline import Prepare, Render
from server.routes import classify, embeddings, score


@dataclass(frozen=True)
class Endpoint:
    prepare: Prepare
    render: Render
    kinds: tuple[str, ...]  # the model kinds that serve it (none: the route decides, line by line)


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/embeddings": Endpoint(embeddings.prepare_embeddings, embeddings.render_embeddings, ()),
    "/pooling": Endpoint(embeddings.prepare_pooling, embeddings.render_pooling, ()),
    "/v1/score": Endpoint(score.prepare_score, score.render_score, score.SCORERS),
    "/v1/rerank": Endpoint(score.prepare_rerank, score.render_rerank, score.SCORERS),
    "/classify": Endpoint(classify.prepare_classify, classify.render_classify, classify.CLASSIFIERS),
}
