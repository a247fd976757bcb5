"""Engine process entry: load, warm up, then serve batches from the pipe until told to stop or orphaned.

Preloaded by the forkserver, so forked engines find torch and transformers already imported.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections import deque
from collections.abc import MutableSequence
from multiprocessing.connection import Connection
from typing import Any

from server.engine.batching import Item, split_by_length, split_by_tokens, take_batch
from server.engine.model import PoolingModel
from server.engine.threads import ThreadShare
from server.ipc import EngineSpec, Msg, send
from server.modelinfo import ModelError, load_model_info

# The pid that imported this module: the forkserver's when preloading worked, the engine's otherwise.
IMPORTED_BY_PID = os.getpid()


def run(conn: Connection, spec: EngineSpec, busy: MutableSequence[int]) -> None:
    # The HTTP process owns shutdown: SIGINT from a terminal must not kill the engine mid-batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The HTTP process must get a core the moment it has work (probes, 429s, tokenizing): the
    # engine yields to it and still takes every idle cycle.
    os.nice(spec.nice)
    started = time.monotonic()
    try:
        info = load_model_info(spec.model_path)
        model = PoolingModel(info, spec.threads)
        share = ThreadShare(busy, spec.slot, spec.threads, spec.solo_threads)
        loaded = time.monotonic()
        send(
            conn,
            (
                Msg.LOADED,
                {
                    "pid": os.getpid(),
                    "load_s": round(loaded - started, 3),
                    "preloaded": os.getpid() != IMPORTED_BY_PID,
                    "backend": "native" if info.native else "transformers",
                },
            ),
        )
        share.working()
        overhead = model.warm_up()
        share.idle()
        send(
            conn,
            (
                Msg.READY,
                {"warmup_s": round(time.monotonic() - loaded, 3), "call_overhead_tokens": round(overhead, 1)},
            ),
        )
    except ModelError as exc:
        send(conn, (Msg.FAILED, str(exc)))
        return
    except Exception as exc:
        send(conn, (Msg.FAILED, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))
        return
    serve(conn, model, spec, overhead, share)


def serve(conn: Connection, model: PoolingModel, spec: EngineSpec, overhead: float, share: ThreadShare) -> None:
    pending: deque[Item] = deque()
    while True:
        try:
            if not pending:
                share.idle()
                if not _handle(conn.recv(), pending):
                    return
            while conn.poll(0):
                if not _handle(conn.recv(), pending):
                    return
        except (EOFError, OSError):
            return  # the HTTP process is gone: nothing left to serve
        batch = take_batch(pending, spec.max_batch_tokens, spec.max_batch_size)
        if batch:
            _run_batch(conn, model, batch, overhead, share)


def _handle(message: tuple[str, Any], pending: deque[Item]) -> bool:
    kind, body = message
    if kind == Msg.SUBMIT:
        pending.extend(Item(*fields) for fields in body)
    elif kind == Msg.CANCEL:
        dropped = set(body)
        kept = [item for item in pending if item.key not in dropped]
        pending.clear()
        pending.extend(kept)
    elif kind == Msg.STOP:
        return False
    return True


def _run_batch(conn: Connection, model: PoolingModel, batch: list[Item], overhead: float, share: ThreadShare) -> None:
    # A batch runs as groups whose results stream back one by one, so the HTTP loop never
    # takes a burst of renders (one group per batch measured probe p99 16-18 ms at 32 clients,
    # against 5-11 ms split).
    groups = split_by_tokens(batch) if model.packed else split_by_length(batch, overhead)
    for group in groups:
        share.working()
        t0 = time.perf_counter()
        try:
            vectors = model.forward(group)
        except Exception as exc:  # a bad batch fails its requests, not the engine
            send(conn, (Msg.ERROR, ([item.key for item in group], f"{type(exc).__name__}: {exc}")))
            continue
        send(
            conn,
            (
                Msg.RESULT,
                (
                    [item.key for item in group],
                    vectors,
                    {
                        "batch_size": len(group),
                        "batch_tokens": _tokens(group, model.packed),
                        "inference_ms": (time.perf_counter() - t0) * 1000,
                    },
                ),
            ),
        )


def _tokens(group: list[Item], packed: bool) -> int:
    """Tokens the forward pass computed on: the real ones when packed, padded ones otherwise."""
    lengths = [len(item.input_ids) for item in group]
    return sum(lengths) if packed else max(lengths) * len(lengths)
