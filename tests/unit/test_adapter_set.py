"""The HTTP side's LoRA adapter set (server/core/adapters.py, server/core/engine_adapters.py) against a
fake engine client: one load however many requests wait; an unload waits for the requests using the
adapter; a (re-)forked engine gets the set as it is when it attaches."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

from common.wire import Msg
from server.core.adapters import AdapterSet
from server.core.engine_adapters import EngineAdapters
from server.core.engine_pipe import EnginePipe

FOLDER = Path("/adapters/legal")
WAIT_S = 5.0


class FakeEngines:
    """change_adapters as EngineClient's: each change recorded, answered when the test says."""

    def __init__(self) -> None:
        self.changes: list[tuple[tuple[str, Path], ...]] = []
        self.pending: list[asyncio.Future[dict[str, Any]]] = []

    def change_adapters(self, wanted: tuple[tuple[str, Path], ...]) -> asyncio.Future[dict[str, Any]]:
        self.changes.append(wanted)
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def answer(self) -> None:
        for future in self.pending:
            future.set_result({"loaded": {name: 100 for name, _ in self.changes[-1]}, "refused": {}})
        self.pending.clear()


async def _until(condition: Any) -> None:
    """Yield to the loop until `condition()` holds (a deadline, not a sleep, decides a failure)."""
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0)


def test_requests_waiting_for_one_adapter_share_one_load() -> None:
    async def main() -> None:
        engines = FakeEngines()
        adapters = AdapterSet(engines, wait_s=WAIT_S)  # type: ignore[arg-type]
        loading = asyncio.ensure_future(adapters.load("legal", FOLDER))
        await _until(lambda: engines.pending)
        deadline = asyncio.get_running_loop().time() + WAIT_S
        waiting = [asyncio.ensure_future(adapters.until_loaded("legal", deadline)) for _ in range(3)]
        await asyncio.sleep(0)
        engines.answer()
        await asyncio.gather(loading, *waiting)
        assert engines.changes == [(("legal", FOLDER),)]

    asyncio.run(main())


def test_an_unload_waits_for_the_requests_using_the_adapter() -> None:
    async def main() -> None:
        engines = FakeEngines()
        adapters = AdapterSet(engines, wait_s=WAIT_S)  # type: ignore[arg-type]
        loading = asyncio.ensure_future(adapters.load("legal", FOLDER))
        await _until(lambda: engines.pending)
        engines.answer()
        await loading
        use = adapters.use("legal")
        use.__enter__()
        unloading = asyncio.ensure_future(adapters.unload("legal", asyncio.get_running_loop().time() + WAIT_S))
        await _until(lambda: "legal" not in adapters)  # new requests get the 404 at once
        assert len(engines.changes) == 1  # the engines keep it while a request uses it
        use.__exit__(None, None, None)
        await _until(lambda: len(engines.changes) == 2)
        engines.answer()
        await unloading
        assert engines.changes[-1] == ()

    asyncio.run(main())


def test_an_engine_attaching_gets_the_set_as_it_is_now() -> None:
    async def main() -> None:
        broadcast = EngineAdapters(asyncio.get_running_loop(), started_with=())
        broadcast.change((("legal", FOLDER),), {})  # loaded at run time, before this engine attached
        ours, theirs = multiprocessing.Pipe(duplex=True)
        pipe = EnginePipe(0, ours, lambda *_: None, lambda _: None)
        broadcast.attached(pipe)
        assert theirs.poll(WAIT_S)
        kind, (_, wanted) = theirs.recv()
        assert (kind, wanted) == (Msg.ADAPTERS, [("legal", FOLDER)])
        pipe.close_sender()
        theirs.close()

    asyncio.run(main())
