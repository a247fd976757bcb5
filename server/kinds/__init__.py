"""Output kinds, one module each, registered here once: what a model answers and how it scores,
decided when its folder is read (common.modelfolder.ModelFolder.output). Routes reach a request's
kind through `of(ctx)`; adding a kind is a module and a line in KINDS."""

from __future__ import annotations

from server.core.inputs import RequestContext
from server.kinds.base import OutputKind
from server.kinds.dense import Dense
from server.kinds.image_text import ImageText
from server.kinds.inference_free_sparse import InferenceFreeSparse
from server.kinds.labels import CrossEncoder, Labels
from server.kinds.m3 import M3
from server.kinds.multi_vector import MultiVector
from server.kinds.sparse import Sparse

KINDS: dict[str, OutputKind] = {
    kind.name: kind
    for kind in (Dense(), Sparse(), InferenceFreeSparse(), MultiVector(), M3(), ImageText(), Labels(), CrossEncoder())
}


def of(ctx: RequestContext) -> OutputKind:
    """The kind of the model the request selected."""
    return KINDS[ctx.folder.output]
