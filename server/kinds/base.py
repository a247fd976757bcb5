"""What every output kind provides, and the one shape every embedding surface parses its body into.

A model's output kind is decided once, when its folder is read (`ModelFolder.output`); a request
reaches it through `server.kinds.of(ctx)`. A kind owns how an embedding request's inputs are
prepared (`embed`), how the engine's rows become one item per input (`items`), how the pairs of
a scoring request are encoded and scored (`pairs`, `scores`), and what /v1/models and TEI's /info
say about it (`card`, `tei_type`). Surfaces (server/routes/) parse their peer's body into an `Ask`
and render the items in their peer's shape: they never ask the folder what the model is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.wire import Tokens
from server.core import inputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared
from server.kinds.pairs import PairAsk, Pairs
from server.protocols.openai import SparseOptions, VectorEncoding
from server.texts.chunking import LongInputs
from server.texts.prompts import prompt_text
from server.tokenizing.tokenizer import Direction

Item = dict[str, Any]  # one input's answer, keyed as OpenAI's embedding entries are: embedding, sparse, multi_vector


@dataclass(frozen=True)
class Ask:
    """An embedding request, whatever surface it came by: its inputs and the options that shape them."""

    inputs: Any  # texts, or token ids
    field: str = "input"  # the surface's name for them, in errors
    truncate: int | None = None  # -1: at the model's maximum; None: too long is refused (or chunked)
    long_inputs: LongInputs | None = None  # None: WARMPOOL_LONG_INPUTS
    prompt_name: str | None = None
    prompt: str | None = None  # the prompt itself, where the surface picked it (Cohere's input_type)
    direction: Direction = "right"
    dimensions: int | None = None  # Matryoshka
    normalize: bool | None = None  # None: as the model's modules say
    encoding: VectorEncoding = dataclasses.field(default_factory=VectorEncoding)  # the dense vectors'
    outputs: tuple[str, ...] | None = None  # bge-m3's outputs asked for
    outputs_field: str = "outputs"
    sparse: SparseOptions = dataclasses.field(default_factory=lambda: SparseOptions(top_k=None, threshold=None))
    late_chunking: bool = False
    input_type: str | None = None  # Cohere's, on vLLM's /pooling: a multi-vector model's role
    request: Any = None  # the surface's own body, for its render


class OutputKind:
    """One output kind. The defaults are a dense model's card; everything else a kind must say."""

    name: ClassVar[str]
    capabilities: ClassVar[tuple[str, ...]] = ()  # Infinity's names for what it serves
    takes_images: ClassVar[bool] = False
    reads_pairs: ClassVar[bool] = False  # a pair is one input (a cross-encoder's), not two scored apart

    def card(self, folder: ModelFolder, settings: Settings) -> dict[str, Any]:
        """What /v1/models adds for it: its outputs, pooling and similarity."""
        return {}

    def tei_type(self, folder: ModelFolder) -> dict[str, Any]:
        """TEI's /info `model_type`."""
        labels = {str(i): label for i, label in sorted(folder.id2label.items())} or {"0": "LABEL_0"}
        return {"classifier": {"id2label": labels, "label2id": {name: int(i) for i, name in labels.items()}}}

    def embed(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, Any]:
        """The request's engine inputs, checked and admitted; its own state beside them."""
        raise NotImplementedError(f"{self.name} models are not embedded (the route's require() refuses them first)")

    def items(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[Item]:
        """One item per input, from the engine's rows (or from the state alone, where no engine ran)."""
        raise NotImplementedError

    def lexical(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[dict[str, Any]]:
        """Each input's sparse weights as {indices, values} (TEI's /embed_sparse)."""
        raise NotImplementedError

    def embed_tokens(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, Any]:
        """The inputs for every token's vector (TEI's /embed_all, vLLM's token_embed)."""
        raise NotImplementedError

    def token_items(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[np.ndarray]:
        """Each input's token vectors."""
        raise NotImplementedError

    def pair_prompt(self, ctx: RequestContext, prompt_name: str | None) -> str:
        """The prompt a scoring request's texts get (TEI's /similarity names one)."""
        return prompt_text(ctx.folder, prompt_name)

    def pairs(self, ask: PairAsk, ctx: RequestContext) -> tuple[list[Tokens], Pairs]:
        """A scoring request's engine inputs: which of them hold each pair's sides."""
        raise NotImplementedError

    def scores(self, vectors: Any, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
        """Each pair's score, from the engine's rows."""
        raise NotImplementedError


def check_float_encoding(ask: Ask, what: str) -> None:
    """Encodings other than floats apply to dense vectors alone: a 400 naming the field elsewhere."""
    if ask.encoding.encoding_format != "float":
        raise inputs.bad_request(
            f"encoding_format={ask.encoding.encoding_format} applies to dense vectors alone, not to {what}",
            "encoding_format",
        )


def check_dimensions(dimensions: int | None, ctx: RequestContext) -> None:
    if dimensions is not None and dimensions > ctx.folder.dimensions:
        raise inputs.bad_request(
            f"dimensions={dimensions} is larger than the model's {ctx.folder.dimensions}", "dimensions"
        )
