"""`warmpool embed IN -o OUT` (also `python -m orchestrator embed`): the argument parser and the run."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np

from orchestrator.embed.appliance import ApplianceError, own_appliance
from orchestrator.embed.client import EmbedError, Requests, embed_in_order
from orchestrator.embed.corpus import Corpus, InputError, Row, Shard
from orchestrator.embed.progress import progress
from orchestrator.embed.sinks import Sink, open_sink

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

EPILOG = """\
Output: row i of OUT is row i of the input (of its shard), with its input row number (`row`) and
its id where the input has one. JSONL is appended and flushed chunk by chunk; Parquet is written as
parts in OUT.parts/ and joined into OUT at the end; .npy holds the vectors alone (float32, rows x dim).
An interrupted run leaves what it wrote readable: --resume checks it against the input (row numbers,
ids) and continues after it (not for .npy).

Sharding: --shard i/N takes the rows whose number modulo N is i (interleaved), so N processes
(a Kubernetes Indexed Job's pods) each embed one share into outputs of their own.

Exit codes:
  0    every row embedded
  1    rows failed: the server refused a request, or stayed unavailable through the retries
       (or the server of its own did not start); OUT holds the rows before them: --resume continues
  2    usage or input errors (a missing file or field, a row without text, OUT not matching --resume)
  130  interrupted (Ctrl-C, SIGTERM): OUT holds what was written; --resume continues
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="warmpool embed",
        description="Embed a corpus (JSONL, CSV or Parquet) through a warmpool server's /v1/embeddings.",
        epilog=EPILOG,
        # a fixed width: the same text at any terminal (docs/reference/cli.md is made from it)
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, width=100),
    )
    p.add_argument("input", type=Path, help="the corpus: .jsonl, .csv or .parquet")
    p.add_argument("-o", "--output", type=Path, required=True, help="the output: .jsonl, .parquet or .npy")
    p.add_argument("--field", default="text", help="the field (column) holding the text (default: text)")
    p.add_argument("--id-field", help="a field carried through as the row's id (default: `id` where present)")
    p.add_argument("--url", help="a running server (e.g. http://warmpool:8000); without it one is started")
    p.add_argument("--api-key", default=os.environ.get("WARMPOOL_API_KEY"), help="default: $WARMPOOL_API_KEY")
    p.add_argument(
        "--model",
        help="with --url: the served model's name; without: the model folder the started server serves "
        "(default: $WARMPOOL_MODEL)",
    )
    p.add_argument("--batch-size", type=_positive, default=64, help="inputs per request (default: 64)")
    p.add_argument("--concurrency", type=_positive, default=4, help="requests in flight (default: 4)")
    p.add_argument("--retries", type=_count, default=8, help="tries again on 429/502/503/504/connection errors")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take (default: 300)")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds the started server may take")
    p.add_argument("--shard", default="0/1", help="i/N: the rows whose number %% N == i (default: 0/1)")
    p.add_argument("--resume", action="store_true", help="continue the output an interrupted run left")
    return p


def main(argv: list[str] | None = None, transport: httpx.AsyncBaseTransport | None = None) -> int:
    """The exit code. `transport`: the HTTP transport (tests hand the in-process app's)."""
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    on_main_thread = threading.current_thread() is threading.main_thread()
    _INTERRUPTED.clear()
    if on_main_thread:  # a pod stopped: as Ctrl-C, what was written kept
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(args, transport)
    except InputError as exc:
        print(f"warmpool embed: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (EmbedError, ApplianceError) as exc:
        print(f"warmpool embed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("warmpool embed: interrupted; --resume continues", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace, transport: httpx.AsyncBaseTransport | None) -> int:
    corpus = Corpus(args.input, args.field, args.id_field or "id", id_required=args.id_field is not None)
    shard = Shard.parse(args.shard)
    corpus.check()
    sink = open_sink(args.output, args.resume)
    rows = corpus.rows(shard)
    done = resumed(sink, rows)
    total = shard.size(corpus.count())
    how = Requests(args.model if args.url else None, args.concurrency, args.retries, args.timeout)
    counts = (total, done)
    finished = False
    try:
        if args.url:
            asyncio.run(_embed(args.url, args, rows, sink, counts, how, transport))
        else:
            with own_appliance(args.model, args.start_timeout) as url:
                asyncio.run(_embed(url, args, rows, sink, counts, how, transport))
        finished = True
    finally:
        if finished:
            sink.close()
        else:
            sink.flush()
    return EXIT_DONE


def resumed(sink: Sink, rows: Iterator[Row]) -> int:
    """The rows OUT holds already, checked against the input's first rows (consumed from `rows`)."""
    count = 0
    for index, out_id in sink.existing():
        row = next(rows, None)
        if row is None or index != row.index or out_id != row.id:
            expected = "no more rows" if row is None else f"row {row.index}, id {row.id!r}"
            raise InputError(
                f"the output's row for input row {index} (id {out_id!r}) is not the input's next ({expected}): "
                "another input or --shard?"
            )
        count += 1
    return count


async def _embed(
    url: str,
    args: argparse.Namespace,
    rows: Iterator[Row],
    sink: Sink,
    counts: tuple[int, int],
    how: Requests,
    transport: httpx.AsyncBaseTransport | None,
) -> None:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, transport=transport, timeout=how.timeout_s) as client:

        async def chunks() -> AsyncIterator[list[Row]]:
            while chunk := await asyncio.to_thread(lambda: list(itertools.islice(rows, args.batch_size))):
                if _INTERRUPTED.is_set():  # the handler's exception was swallowed where it landed
                    raise KeyboardInterrupt
                yield chunk

        async def write(chunk: list[Row], vectors: np.ndarray) -> None:
            await asyncio.to_thread(sink.write, chunk, vectors)
            bar.update(len(chunk))

        bar = progress(*counts)  # from here: the rate is the requests', not the server's start
        try:
            await embed_in_order(client, chunks(), write, how)
        finally:
            bar.close()


# Set by a SIGTERM, besides the KeyboardInterrupt its handler raises: raised wherever the main thread is,
# that can land in a finalizer, which ignores it: the run would go on to its end.
_INTERRUPTED = threading.Event()


def _interrupt(signum: int, frame: object) -> None:
    _INTERRUPTED.set()
    raise KeyboardInterrupt


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("at least 0")
    return value
