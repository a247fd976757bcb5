"""A model folder embedded in this process as the server embeds it: tokenized by the server's
TokenizerPool (prompt before each text, cut to the model's length), run by the engine's PoolingModel
(packed groups under inference_mode, the same pooling and Dense modules, any precision, compiled
where the engine compiles), normalised where the folder's modules say. Vectors equal what
/v1/embeddings answers for the same texts, without a server, an HTTP hop or a second process.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from common.modelfolder import read_model_folder
from common.setting_fields import SettingFields
from common.wire import Keyed, Tokens
from engine.compiling.compilation import Compilation, begin
from engine.runtime.batching import split_by_length, split_by_tokens, take_batch
from engine.runtime.device import place
from engine.runtime.model import PoolingModel
from server.tokenizing.tokenizer import TokenizerPool, runs

Precision = Literal["auto", "float32", "bfloat16", "float16", "int8"]
CompileMode = Literal["auto", "off", "required"]

# Tokens per forward pass. The server streams groups of up to 1,536 tokens back while it computes; a corpus has
# no one waiting on a group, and bigger ones amortise each call's costs (engine/runtime/batching.py).
BATCH_TOKENS = 2048
# Characters kept of a text before it is tokenized, per token the model takes (the server's
# CHARS_PER_TOKEN, server/core/inputs.py): the tokenizer's cost grows with the characters, and far
# fewer than this reach the model's length.
CHARS_PER_TOKEN = 32
# WARMPOOL_COMPILE_CACHE's default (a factory's: the field's `default` is unset)
_COMPILE_CACHE = SettingFields.model_fields["compile_cache"].get_default(call_default_factory=True)


class InProcessEmbedder:
    """Texts -> float32 vectors, one row per text in order, with warmpool's engine in this process.

    `precision` is WARMPOOL_DTYPE's (int8 and bfloat16 where the CPU has the instructions, else a clear
    error); `compile` WARMPOOL_COMPILE's: `auto` builds the compiled forward in a worker (nice 19) and
    switches to it between groups once built and checked against eager (a cached artifact from the
    first group); `required` waits for it; `off` runs eager. `batch_tokens` is the tokens per forward
    pass (packed models count real tokens, others padded ones). `prompt_name` picks one of the
    folder's sentence-transformers prompts (its default prompt when None). Texts longer than the
    model takes are cut to its length, as sentence-transformers cuts them."""

    def __init__(
        self,
        model_dir: str | Path,
        precision: Precision = "float32",
        compile: CompileMode = "auto",
        batch_tokens: int = BATCH_TOKENS,
        prompt_name: str | None = None,
        device: str = "cpu",
        threads: int | None = None,
        compile_cache: str | Path | None = None,
        compile_timeout_s: float = 900.0,
    ) -> None:
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be at least 1, got {batch_tokens}")
        info = read_model_folder(Path(model_dir))
        if info.output not in ("dense", "m3"):  # bge-m3: its dense vector, the engine's default head
            raise ValueError(f"{info.path} is a {info.output} model: InProcessEmbedder embeds dense models only")
        self.info = info
        self.prompt = _prompt(info.prompts, info.default_prompt_name, prompt_name)
        self.batch_tokens = batch_tokens
        self.tokenizers = TokenizerPool(info.path)
        # Ray sets an actor's OMP_NUM_THREADS (torch's default) from its num_cpus
        placement = place(device, precision, [])
        cache = Path(compile_cache) if compile_cache is not None else _COMPILE_CACHE
        # its layers' products on this CPU's faster GEMM backend, the choice kept beside the artifacts
        self.model = PoolingModel(info, threads or torch.get_num_threads(), placement, (), cache)
        self.compilation: Compilation | None
        self.compilation, self.compile_detail = begin(self.model, compile, cache, compile_timeout_s)

    @property
    def dimensions(self) -> int:
        return self.info.dimensions

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One float32 row per text, in order; ValueError for an item that is not a string."""
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"text {i} is a {type(text).__name__}, not a string: {text!r:.80}")
        if not texts:
            return np.empty((0, self.dimensions), dtype=np.float32)
        tokens = self.tokenize(texts)
        rows = np.empty((len(tokens), self.dimensions), dtype=np.float32)
        for group in self.groups(list(enumerate(tokens))):
            self._switch_if_built()
            rows[[key for key, _ in group]] = self.model.forward([item for _, item in group])
        return _normalized(rows) if self.info.normalize else rows

    def tokenize(self, texts: Sequence[str]) -> list[Tokens]:
        """The prompt before each text, cut to the model's length (its special tokens kept)."""
        most = CHARS_PER_TOKEN * self.info.max_model_len
        capped = [(self.prompt + text)[:most] for text in texts]
        return [t for run in runs(capped) for t in self.tokenizers.encode_batch(run, self.info.max_model_len)]

    def groups(self, keyed: list[Keyed]) -> list[list[Keyed]]:
        """Forward passes as the engine cuts them: packed models in groups of about `batch_tokens` real
        tokens, in order; padded ones in batches of at most `batch_tokens` padded tokens, each cut by length."""
        if self.model.packed:
            return split_by_tokens(keyed, self.batch_tokens)
        pending: deque[Keyed] = deque(sorted(keyed, key=lambda item: len(item[1].input_ids)))
        groups: list[list[Keyed]] = []
        while pending:
            groups += split_by_length(take_batch(pending, self.batch_tokens, len(pending)))
        return groups

    def _switch_if_built(self) -> None:
        if self.compilation is not None and self.compilation.poll():
            self.compile_detail = self.compilation.detail

    def close(self) -> None:
        """Stop a compile still running (its worker would otherwise outlive nothing: it dies with us)."""
        compilation = getattr(self, "compilation", None)  # None too where __init__ failed before it
        if compilation is not None:
            compilation.stop()

    def __del__(self) -> None:
        self.close()


def _prompt(prompts: dict[str, str], default: str | None, name: str | None) -> str:
    """The text of prompt `name` (the default prompt when None, "" without one), as the server picks it
    (server/texts/prompts.py); ValueError naming the folder's prompts for a name it lacks."""
    name = default if name is None else name
    if name is None:
        return ""
    if name not in prompts:
        raise ValueError(f"prompt_name {name!r} is not a prompt of this model; it has: {sorted(prompts)}")
    return prompts[name]


def _normalized(rows: np.ndarray) -> Any:
    """Unit rows, computed as the server's outputs.normalize computes them (server/core/outputs.py)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32)
