"""The engine wire protocol: what the HTTP process and an engine say to each other over a pipe.

Messages are `(kind, body)` tuples pickled with plain pickle:
- to the engine: SUBMIT `[(key, Tokens), ...]`, CANCEL `[key, ...]`, STOP `None`, ADAPTERS
  `(seq, [(name, folder), ...])`: the LoRA adapters it serves from then on (loaded, or dropped, between
  groups), answered ADAPTERS `(seq, {"loaded": {name: bytes}, "refused": {name: reason}})`;
- from the engine while starting: LOADED `{detail}`, READY `{detail}`, or FAILED
  `("one-line reason", traceback or None)`; then, per group of inputs run, RESULT
  `([key, ...], answers, batch stats dict)` or ERROR `([key, ...], "reason")` (the group failed), and
  CANCELLED `None` once it has dropped the inputs of a CANCEL; NO_ADAPTER `([key, ...], name)` for a
  group's inputs naming a LoRA adapter it does not hold (it refused it when sent the set, which another
  engine may hold): those are not run, the rest of their group is, and answered as usual; COMPILE
  `{detail}` whenever its compiled forward's state changes (engine/compiling/compilation.py), while
  starting or serving.

What the engine answers for an input is named by its head, `Tokens.head` (engine/heads/__init__.py
registers them; "" is the model's default, decided once at load from its folder):
- `pooled` (the default, but for multi-vector models): the model's row per input: the pooled (and
  Dense) vector of an embedder, the logits of a classifier or cross-encoder, a sparse model's SPLADE
  weights; float32 [dims];
- `tokens` (a multi-vector model's default): every token's row: an embedder's last hidden state
  (TEI's /embed_all, late chunking), a ColBERT's normalised token vectors; float32 [tokens, dims];
- `m3`: bge-m3's outputs that `Tokens.outputs` names (common.m3.OUTPUTS): a dict of arrays.
A group whose inputs all name one head answers as that head does (the pooled head: one float32
array [n, dims]; the others: a list, one answer per key); a group mixing heads answers a list, each
input's answer in its key's place.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

# The compile worker's niceness where WARMPOOL_COMPILE_NICE says nothing: the cycles serving leaves
COMPILE_NICE = 19


class Msg:
    SUBMIT = "submit"
    CANCEL = "cancel"
    STOP = "stop"
    LOADED = "loaded"
    READY = "ready"
    FAILED = "failed"
    RESULT = "result"
    ERROR = "error"
    CANCELLED = "cancelled"
    NO_ADAPTER = "no_adapter"
    COMPILE = "compile"
    ADAPTERS = "adapters"


class Tokens(NamedTuple):
    """One tokenized input: what the tokenizer makes, the engine client sends and the engine batches.
    A NamedTuple pickles as cheaply as a bare tuple, and every input crosses the pipe."""

    input_ids: list[int]
    token_type_ids: list[int] | None = None
    head: str = ""  # what the engine answers for it (the docstring above); "": the model's default head
    priority: int = 0  # the request's priority: lower runs first (vLLM's `priority`)
    keys: int = 0  # attend to the first `keys` tokens only (a ColBERT query's padding masks); 0: all
    outputs: tuple[str, ...] = ()  # the m3 head's option: bge-m3's outputs asked for (common.m3.OUTPUTS)
    # an image for a CLIP/SigLIP model's image tower: uint8 [3, S, S], resized and cropped (server/vision/images.py;
    # the engine rescales and normalises it, engine/layers/pixels.py);
    # input_ids then hold one placeholder per position the tower computes on, so that batching, load
    # and usage count an image by its work
    pixels: Any = None
    adapter: str = ""  # the LoRA adapter it runs with, by name (EngineSpec.adapters); "": the base model
    # queued behind the inputs of its priority that are not: its tenant sends well past the others' share
    # (server/core/engine_routing.py); set as it is sent, so it changes neither its answer nor its cache key
    behind: bool = False


Keyed = tuple[int, Tokens]  # an input on the wire: the client's key for it, and its tokens


def order(tokens: Tokens) -> tuple[int, bool]:
    """Where an input queues at an engine: by priority (lower first), then those not `behind` first."""
    return tokens.priority, tokens.behind


# The engines' busy slots, one float each in shared memory (orchestrator/supervisor.py): BUSY while the
# engine has work, else the monotonic time it went idle (0: never busy). Engines size their torch pools
# by them (engine/runtime/threads.py); the engine client marks those it sends work to before sending.
BUSY = -1.0

# The forkserver's environment names the models it builds before forking engines, as a JSON list of
# [folder, dtype] (orchestrator.forkserver.preload_weights -> engine.forkserver_preload).
FORKSERVER_MODELS_ENV = "_WARMPOOL_FORKSERVER_MODELS"
# A forkserver started before the settings are read (orchestrator.forkserver_early) has no such list
# yet: its environment names a file, written once they are, as JSON {"modules": [...], "models": [...]}
# (the rest of its preload list, the [folder, dtype] pairs) -> engine.forkserver_preload waits for it.
FORKSERVER_PLAN_ENV = "_WARMPOOL_FORKSERVER_PLAN"


@dataclass(frozen=True)
class EngineSpec:
    """Everything an engine process needs to start: it reads no settings of its own."""

    model_path: Path
    slot: int  # which engine of the group: its flag in the shared busy array
    threads: int  # torch threads while other engines are busy too
    solo_threads: int  # torch threads while it is the only busy engine
    max_batch_tokens: int
    max_batch_size: int
    nice: int = 0
    device: str = "cpu"  # cpu or cuda:N: CUDA is initialised in the engine, after the fork
    dtype: str = "auto"
    allow_bin_weights: bool = False  # unpickle pytorch_model.bin (weights_only) where there is no safetensors
    keep_warm_s: float = 0.0  # after a forward on every core, its threads kept awake this long while idle
    quiet_wait_s: float = 0.0  # before warming up, wait up to this long for the other engines to be idle
    compile: str = "off"  # auto, off or required (common.settings.Settings.compile)
    compile_cache: Path | None = None
    compile_timeout_s: float = 900.0
    compile_nice: int = COMPILE_NICE
    # PEFT LoRA adapters (name, folder) of this model, loaded at the engine's start (engine/layers/lora.py);
    # those loaded at run time come as an ADAPTERS message, the first one sent when the engine attaches
    adapters: tuple[tuple[str, Path], ...] = ()
    # an engine started after the model has served: an adapter of `adapters` it cannot read (its folder
    # gone since) is refused, its inputs answered NO_ADAPTER, instead of failing the engine's start
    adapters_refusable: bool = False


def send(conn: Connection, message: tuple[str, Any]) -> None:
    """conn.send() without multiprocessing's ForkingPickler, which copies the copyreg dispatch table
    for every message: ~10% of the HTTP process's CPU at 32 clients. Nothing sent here needs its
    reducers (no fds or sockets); the receiving conn.recv() is a plain pickle.loads either way."""
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
