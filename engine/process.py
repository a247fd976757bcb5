"""The engine process: load, warm up, then run batches from the pipe until told to stop or orphaned.

Preloaded by the forkserver, so forked engines find torch and this package already imported
(and transformers too, for a model served through the transformers fallback).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import MutableSequence
from multiprocessing.connection import Connection
from typing import Any

from common.folderjson import ModelError
from common.m3 import REFUSED as M3_REFUSED
from common.modelfiles import weight_files
from common.modelfolder import read_model_folder
from common.wire import EngineSpec, Keyed, Msg, order, send
from engine.compiling.compilation import Compilation, begin
from engine.heads import answer
from engine.layers.checkpoint import refuse_pickles
from engine.runtime.batching import (
    BULK_ALONE_GROUP_TOKENS,
    INTERACTIVE_GROUP_TOKENS,
    Pending,
    split_by_length,
    split_by_urgency,
    split_packed,
)
from engine.runtime.device import memory_detail, place
from engine.runtime.heap import HeapTrim
from engine.runtime.inbox import Inbox
from engine.runtime.model import PoolingModel
from engine.runtime.threads import ThreadShare

# The pid that imported this module: the forkserver's when preloading worked, the engine's otherwise.
IMPORTED_BY_PID = os.getpid()
COMPILE_POLL_S = 0.5  # an idle engine with a compile on the way looks at it this often


def run_engine(conn: Connection, spec: EngineSpec, busy: MutableSequence[float]) -> None:
    # The HTTP process owns shutdown: SIGINT from a terminal must not kill the engine mid-batch.
    # (An engine on a thread, as tests/app runs one, leaves its host's signals alone.)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The HTTP process must get a core the moment it has work (probes, 429s, tokenizing): the
    # engine yields to it and still takes every idle cycle.
    os.nice(spec.nice)
    heap = HeapTrim()
    started = time.monotonic()
    try:
        info = read_model_folder(spec.model_path)
        refuse_pickles(info, spec.allow_bin_weights)
        placement = place(spec.device, spec.dtype, weight_files(info.path))  # a Router's: its encoder's
        # a re-fork reads the adapters the way a run-time load does: one it cannot read is refused alone;
        # the GEMM backend chosen for this CPU is kept in the compile cache
        adapters = () if spec.adapters_refusable else spec.adapters
        model = PoolingModel(info, spec.threads, placement, adapters, spec.compile_cache)
        refused = model.sync_adapters(spec.adapters)["refused"] if spec.adapters_refusable and spec.adapters else {}
        share = ThreadShare(busy, spec.slot, spec.threads, spec.solo_threads, spec.keep_warm_s)
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
                    **({"head": f"splade ({info.splade.strategy}, {info.splade.activation})"} if info.splade else {}),
                    **({"head": f"colbert ({info.dimensions} dims per token)"} if info.late else {}),
                    **({"head": "bge-m3 (dense, sparse, multi_vector)"} if model.m3 else {}),
                    **({M3_REFUSED: model.m3_refused} if model.m3_refused else {}),
                    "heap": heap.detail,
                    **({"adapters": dict(model.adapters.bytes)} if model.adapters and model.adapters.bytes else {}),
                    **({"adapters_refused": refused} if refused else {}),
                    **model.weights,
                    **placement.detail,
                    **memory_detail(placement),
                },
            ),
        )
        share.wait_quiet(spec.quiet_wait_s)
        waited, loaded = time.monotonic() - loaded, time.monotonic()
        share.working()
        warmup = model.warm_up()
        share.ran()
        overhead = warmup.overhead_tokens
        warmup_s = time.monotonic() - loaded
        compilation, compile_detail = _compile(conn, model, spec)
        share.idle()
        # the most tokens one answer can wait on (the largest group, or one input): the stall watchdog's yardstick
        group_tokens = (
            max(BULK_ALONE_GROUP_TOKENS, INTERACTIVE_GROUP_TOKENS, info.max_model_len)
            if model.packed
            else spec.max_batch_tokens
        )
        send(
            conn,
            (
                Msg.READY,
                {
                    "warmup_s": round(warmup_s, 3),
                    **({"waited_for_idle_s": round(waited, 3)} if spec.quiet_wait_s else {}),
                    "call_overhead_tokens": round(overhead, 1),
                    "ms_per_token": round(warmup.per_token_s * 1000, 4),
                    "group_tokens": group_tokens,
                    **warmup.detail,
                    "compile": compile_detail,
                },
            ),
        )
    except ModelError as exc:
        send(conn, (Msg.FAILED, (str(exc), None)))
        return
    except Exception as exc:
        send(conn, (Msg.FAILED, (f"{type(exc).__name__}: {exc}", traceback.format_exc())))
        return
    try:
        serve_batches(conn, model, spec, overhead, share, heap, compilation)
    finally:
        if compilation is not None:
            compilation.stop()


def _compile(conn: Connection, model: PoolingModel, spec: EngineSpec) -> tuple[Compilation | None, dict[str, Any]]:
    """The engine's compilation (engine/compiling/compilation.py's begin); a wait for it said on the pipe."""
    return begin(
        model,
        spec.compile,
        spec.compile_cache,
        spec.compile_timeout_s,
        lambda detail: send(conn, (Msg.COMPILE, detail)),
        spec.compile_nice,
    )


def serve_batches(
    conn: Connection,
    model: PoolingModel,
    spec: EngineSpec,
    overhead: float,
    share: ThreadShare,
    heap: HeapTrim,
    compilation: Compilation | None = None,
) -> None:
    pending = Pending()
    inbox = Inbox(conn, reader=model.info.vision is not None)  # images arrive while a group computes
    while True:
        try:
            if not pending:
                share.idle()
                if not inbox.poll(0):  # nothing waiting: the moment to hand freed memory back
                    heap.idle()
                while compilation is not None and compilation.pending and not inbox.poll(COMPILE_POLL_S):
                    _switch_if_built(conn, compilation)
                share.idle_warm(inbox.poll)
                if not _handle(conn, inbox.recv(), pending, model):
                    return
            while inbox.poll(0):
                if not _handle(conn, inbox.recv(), pending, model):
                    return
        except (EOFError, OSError):
            return  # the HTTP process is gone: nothing left to serve
        share.compiling = compilation is not None and compilation.pending
        batch = pending.take(spec.max_batch_tokens, spec.max_batch_size)
        try:
            if batch and not _run_batch(inbox, model, batch, overhead, share, pending):
                return
        except (EOFError, OSError):
            return
        if compilation is not None:
            _switch_if_built(conn, compilation)


def _switch_if_built(conn: Connection, compilation: Compilation) -> None:
    """Between batches: take the compiled forward if its worker is done, and say so."""
    if compilation.poll():
        send(conn, (Msg.COMPILE, compilation.detail))


def _handle(
    conn: Connection,
    message: tuple[str, Any],
    pending: Pending,
    model: PoolingModel,
    cancelled: set[int] | None = None,
) -> bool:
    """One message from the HTTP process; False for STOP. Cancelled keys are also added to
    `cancelled` (a running batch drops them from the groups it has not run). ADAPTERS is handled
    between groups: no forward runs while the set changes."""
    kind, body = message
    if kind == Msg.SUBMIT:
        pending.extend(body)
    elif kind == Msg.CANCEL:
        pending.drop(set(body))
        if cancelled is not None:
            cancelled.update(body)
        # The client counts cancelled inputs as this engine's load until it hears from it: an
        # engine that only dropped them would otherwise look busy (and, idle, stalled) forever.
        send(conn, (Msg.CANCELLED, None))
    elif kind == Msg.ADAPTERS:
        seq, wanted = body
        send(conn, (Msg.ADAPTERS, (seq, model.sync_adapters(wanted))))
    elif kind == Msg.STOP:
        return False
    return True


def _run_batch(
    inbox: Inbox, model: PoolingModel, batch: list[Keyed], overhead: float, share: ThreadShare, pending: Pending
) -> bool:
    """Run `batch` group by group; False if told to stop meanwhile. Between groups the inbox is read:
    inputs more urgent than any left in the batch stop it there, and what it had not run goes back
    to `pending` (a bulk batch yields to interactive work within one group's time)."""
    # A batch runs as groups whose results stream back one by one (their sizes: engine.runtime.batching).
    firsts = pending.firsts(batch)  # read whatever the split: each key's mark is forgotten as it is taken
    if model.packed:
        groups = split_packed(batch, pending.bulk_group_tokens(), firsts)
    else:
        groups = [group for run in split_by_urgency(batch) for group in split_by_length(run, overhead)]
    conn = inbox.conn
    cancelled: set[int] = set()
    for index, group in enumerate(groups):
        if index:
            while inbox.poll(0):
                if not _handle(conn, inbox.recv(), pending, model, cancelled):
                    return False
            if cancelled:  # acknowledged as dropped: they must not run (the client no longer counts them)
                group = [item for item in group if item[0] not in cancelled]
                groups[index + 1 :] = [[i for i in g if i[0] not in cancelled] for g in groups[index + 1 :]]
                cancelled.clear()
            best = pending.best()
            # packed groups keep the batch's priority order, so the next group's first input is the
            # most urgent left; padded ones are sorted by length, so that first test is only a filter
            if best is not None and group and best < order(group[0][1]):
                rest = [item for later in [group, *groups[index + 1 :]] for item in later]
                if best < min(order(tokens) for _, tokens in rest):
                    pending.requeue(rest)
                    return True
            if not group:
                continue
        group = _held(conn, model, group)
        if not group:
            continue
        share.working()
        t0 = time.perf_counter()
        try:
            vectors = answer(model, [tokens for _, tokens in group])  # each input's head's answer
        except Exception as exc:  # a bad batch fails its requests, not the engine
            share.ran()
            send(conn, (Msg.ERROR, ([key for key, _ in group], f"{type(exc).__name__}: {exc}")))
            continue
        share.ran()
        send(
            conn,
            (
                Msg.RESULT,
                (
                    [key for key, _ in group],
                    vectors,
                    {
                        "batch_size": len(group),
                        "batch_tokens": _tokens(group, model.packed),
                        "inference_ms": (time.perf_counter() - t0) * 1000,
                    },
                ),
            ),
        )
    return True


def _held(conn: Connection, model: PoolingModel, group: list[Keyed]) -> list[Keyed]:
    """The group less its inputs naming a LoRA adapter this engine does not hold (refused when it was sent
    the set: its folder gone or unreadable since another engine loaded it): those are answered NO_ADAPTER,
    one message per adapter, and not run; they fail their requests alone, not the group."""
    missing: dict[str, list[int]] = {}
    for key, tokens in group:
        if tokens.adapter and not model.holds_adapter(tokens.adapter):
            missing.setdefault(tokens.adapter, []).append(key)
    if not missing:
        return group
    for name, keys in missing.items():
        send(conn, (Msg.NO_ADAPTER, (keys, name)))
    return [(key, tokens) for key, tokens in group if tokens.adapter not in missing]


def _tokens(group: list[Keyed], packed: bool) -> int:
    """Tokens the forward pass computed on: the real ones when packed, padded ones otherwise."""
    lengths = [len(tokens.input_ids) for _, tokens in group]
    return sum(lengths) if packed else max(lengths) * len(lengths)
