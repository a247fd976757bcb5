"""`warmpool embed` against a fake /v1/embeddings (httpx.MockTransport): input order kept whatever
answers first, retries bounded, bulk priority, --resume after a failed run, and the exit codes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from orchestrator.__main__ import main as orchestrator_main
from orchestrator.embed import cli, client
from tests.unit.test_embed_files import RECORDS, write_corpus

URL = "http://embed.test"
WAIT_S = 10.0  # a deadline on the test's own waits


def vector(text: str) -> list[float]:
    """A fake embedding that says which text it is."""
    number = int(text.rsplit(" ", 1)[-1])
    return [float(number), float(len(text)), 1.0, -1.0]


def answer(body: dict[str, Any], status: int = 200) -> httpx.Response:
    data = [
        {"index": i, "embedding": base64.b64encode(np.array(vector(t), "<f4").tobytes()).decode()}
        for i, t in enumerate(body["input"])
    ]
    return httpx.Response(status, json={"data": data})


Handler = Callable[[httpx.Request], Any]


def run(args: list[str], handler: Handler) -> int:
    return cli.main([*args, "--url", URL], transport=httpx.MockTransport(handler))


def fake(request: httpx.Request) -> httpx.Response:
    return answer(orjson.loads(request.content))


def out_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()  # type: ignore[no-any-return]
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "BACKOFF_FIRST_S", 0.0)


def test_rows_come_out_in_input_order_when_later_requests_answer_first(tmp_path: Path) -> None:
    answered: list[str] = []
    second_answered = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        if body["input"] == ["text number 0"]:
            await asyncio.wait_for(second_answered.wait(), WAIT_S)
        answered.append(body["input"][0])
        if body["input"] == ["text number 1"]:
            second_answered.set()
        return answer(body)

    out = tmp_path / "out.jsonl"
    args = [str(write_corpus(tmp_path, ".jsonl")), "-o", str(out), "--batch-size", "1", "--concurrency", "3"]
    assert run(args, handler) == cli.EXIT_DONE
    assert answered[0] == "text number 1" and answered.index("text number 0") > 0
    rows = out_rows(out)
    assert [r["row"] for r in rows] == list(range(10)) and [r["id"] for r in rows] == [r["id"] for r in RECORDS]
    assert [r["embedding"] for r in rows] == [vector(r["text"]) for r in RECORDS]  # type: ignore[arg-type]


def test_requests_are_bulk_priority_base64_with_the_api_key(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return fake(request)

    args = [str(write_corpus(tmp_path, ".csv")), "-o", str(tmp_path / "o.npy"), "--api-key", "k", "--model", "m"]
    assert run(args, handler) == cli.EXIT_DONE
    body = orjson.loads(seen[0].content)
    assert body["priority"] > 0 and body["encoding_format"] == "base64" and body["model"] == "m"
    assert seen[0].headers["authorization"] == "Bearer k"
    assert np.load(tmp_path / "o.npy").shape == (10, 4)


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_server_is_tried_again(tmp_path: Path, status: int) -> None:
    refusals = [status, status]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(refusals.pop()) if refusals else fake(request)

    assert run([str(write_corpus(tmp_path, ".jsonl")), "-o", str(tmp_path / "o.jsonl")], handler) == cli.EXIT_DONE
    assert len(out_rows(tmp_path / "o.jsonl")) == 10


def test_retries_are_bounded_then_exit_1(tmp_path: Path) -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise httpx.ConnectError("refused")

    args = [str(write_corpus(tmp_path, ".jsonl")), "-o", str(tmp_path / "o.jsonl"), "--retries", "3"]
    assert run([*args, "--concurrency", "1", "--batch-size", "10"], handler) == cli.EXIT_FAILED
    assert attempts == 4


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_resume_after_a_failed_run_gives_each_row_once(tmp_path: Path, suffix: str) -> None:
    """The first run is refused (400, not retried) at its third request; OUT keeps the rows before it."""
    requests = 0

    def failing(request: httpx.Request) -> httpx.Response:
        nonlocal requests
        requests += 1
        return httpx.Response(400, json={"error": {"message": "no"}}) if requests == 3 else fake(request)

    out = tmp_path / f"out{suffix}"
    args = [str(write_corpus(tmp_path, ".jsonl")), "-o", str(out), "--batch-size", "2", "--concurrency", "1"]
    assert run(args, failing) == cli.EXIT_FAILED
    assert run(args, fake) == cli.EXIT_USAGE  # OUT (or its parts) there: --resume is needed
    assert run([*args, "--resume"], fake) == cli.EXIT_DONE
    rows = out_rows(out)
    assert [r["row"] for r in rows] == list(range(10))
    assert [r["embedding"] for r in rows] == [vector(r["text"]) for r in RECORDS]  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".npy"])
def test_a_run_that_wrote_nothing_can_be_run_again_without_resume(tmp_path: Path, suffix: str) -> None:
    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    args = [str(write_corpus(tmp_path, ".jsonl")), "-o", str(tmp_path / f"o{suffix}"), "--retries", "0"]
    assert run(args, unreachable) == cli.EXIT_FAILED
    assert run(args, fake) == cli.EXIT_DONE


def test_resume_refuses_an_output_of_another_shard(tmp_path: Path) -> None:
    corpus = str(write_corpus(tmp_path, ".jsonl"))
    assert run([corpus, "-o", str(tmp_path / "o.jsonl"), "--shard", "0/2"], fake) == cli.EXIT_DONE
    assert run([corpus, "-o", str(tmp_path / "o.jsonl"), "--shard", "1/2", "--resume"], fake) == cli.EXIT_USAGE


def test_a_missing_field_is_exit_2(tmp_path: Path) -> None:
    args = [str(write_corpus(tmp_path, ".parquet")), "-o", str(tmp_path / "o.jsonl"), "--field", "body"]
    assert run(args, fake) == cli.EXIT_USAGE


def interrupted_at_second_request(tmp_path: Path, interrupt: Callable[[], None]) -> list[int]:
    """Three rows a request, one at a time, `interrupt()` on the second: the rows written, after exit 130."""
    requests = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal requests
        requests += 1
        if requests == 2:
            interrupt()
        return fake(request)

    out = tmp_path / "o.jsonl"
    args = [str(write_corpus(tmp_path, ".jsonl")), "-o", str(out), "--batch-size", "3", "--concurrency", "1"]
    assert run(args, handler) == cli.EXIT_INTERRUPTED
    return [r["row"] for r in out_rows(out)]


def test_an_interruption_is_exit_130_and_keeps_what_was_written(tmp_path: Path) -> None:
    def ctrl_c() -> None:
        raise KeyboardInterrupt

    assert interrupted_at_second_request(tmp_path, ctrl_c) == [0, 1, 2]


def test_a_sigterm_whose_exception_is_swallowed_still_stops_the_run(tmp_path: Path) -> None:
    """The handler's KeyboardInterrupt can land where it is ignored (a finalizer): the next chunk stops."""

    def swallowed_sigterm() -> None:
        with contextlib.suppress(KeyboardInterrupt):
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # type: ignore[operator]

    assert interrupted_at_second_request(tmp_path, swallowed_sigterm) == [0, 1, 2, 3, 4, 5]


def test_the_orchestrator_hands_the_embed_word_to_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert orchestrator_main(["embed", "--help"]) == 0
    assert "Exit codes" in capsys.readouterr().out
    assert orchestrator_main(["embed"]) == cli.EXIT_USAGE  # no input: argparse's usage error


def test_the_sigterm_handler_is_the_callers_again_after_a_run(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert run([str(write_corpus(tmp_path, ".jsonl")), "-o", str(tmp_path / "o.jsonl")], fake) == cli.EXIT_DONE
    assert signal.getsignal(signal.SIGTERM) == before
