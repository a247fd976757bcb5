"""The engine's message handling, over a real pipe (no model needed)."""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from common.wire import Msg, Tokens, send
from engine.process import _handle, _run_batch
from engine.runtime.batching import BULK_ALONE_GROUP_TOKENS, INTERACTIVE_GROUP_TOKENS, Pending
from engine.runtime.inbox import Inbox
from engine.runtime.model import PoolingModel

NO_MODEL: PoolingModel = None  # type: ignore[assignment]  # these messages need none
ONE_GROUP = INTERACTIVE_GROUP_TOKENS * 3 // 4  # an interactive input's tokens that fill a group of its own
WAIT_S = 10.0


def answer(conn: Connection) -> tuple[str, Any]:
    """The engine loop's next message, which must come within WAIT_S (a missing one fails, never hangs)."""
    assert conn.poll(WAIT_S), "the engine loop sent nothing more"
    message: tuple[str, Any] = conn.recv()
    return message


def test_a_cancel_drops_queued_inputs_and_is_acknowledged() -> None:
    """CANCEL removes those inputs from the queue and answers CANCELLED, so the client stops
    counting them as this engine's load."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    pending = Pending()
    pending.extend([(1, Tokens([5])), (2, Tokens([6])), (3, Tokens([7]))])
    assert _handle(theirs, (Msg.CANCEL, [1, 3]), pending, NO_MODEL)
    assert [key for key, _ in pending] == [2]
    assert ours.poll(5) and answer(ours) == (Msg.CANCELLED, None)


def test_stop_ends_the_loop() -> None:
    """STOP makes the handler say the engine should stop."""
    _, theirs = multiprocessing.Pipe(duplex=True)
    assert _handle(theirs, (Msg.STOP, None), Pending(), NO_MODEL) is False


@pytest.fixture(params=[True, False], ids=["reader", "no-reader"])
def reader(request: pytest.FixtureRequest) -> bool:
    """Engines of image models read their pipe on a thread of their own, the others between groups."""
    return bool(request.param)


def received(conn: Connection, reader: bool) -> Inbox:
    """An engine's inbox on `conn` once what was sent has reached it (before a batch starts)."""
    inbox = Inbox(conn, reader)
    assert inbox.poll(5)
    return inbox


def test_the_inbox_receives_while_the_engine_computes() -> None:
    """Images larger together than the socket's buffer all reach the engine while it is busy (it
    reads nothing meanwhile): the sender is not held up, and the next batch finds them all."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    inbox = Inbox(theirs)
    pixels = np.zeros((3, 224, 224), dtype=np.uint8)  # 150 KB, as the server sends them: 1.2 MB in all
    sender = threading.Thread(
        target=lambda: [send(ours, (Msg.SUBMIT, [(k, Tokens([0], pixels=pixels))])) for k in range(8)]
    )
    sender.start()
    sender.join(10)
    assert not sender.is_alive()
    messages = []
    while inbox.poll(0.5):
        messages.append(inbox.recv())
    assert [(kind, body[0][0]) for kind, body in messages] == [(Msg.SUBMIT, k) for k in range(8)]
    ours.close()
    for _ in range(2):  # the pipe's end, every time it is asked, as Connection.recv says it
        with pytest.raises(EOFError):
            inbox.recv()


class FakeModel:
    """Stands in for a packed PoolingModel: one zero vector per input."""

    packed = True
    default_head = "pooled"

    def forward(self, items: list[Tokens]) -> np.ndarray:
        return np.zeros((len(items), 2), dtype=np.float32)


class FakeShare:
    """Counts what the batch loop tells the engine's thread share."""

    def __init__(self) -> None:
        self.forwards = 0

    def working(self) -> None:
        pass

    def ran(self) -> None:
        self.forwards += 1


def test_more_urgent_work_stops_a_batch_between_groups(reader: bool) -> None:
    """An urgent input arriving while a bulk batch runs stops it after the group in progress: the
    groups not run go back to the queue behind the urgent input, in their order."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    # one group each: more than half a bulk group's budget (no interactive input seen yet, a large one)
    bulk = [(key, Tokens(list(range(BULK_ALONE_GROUP_TOKENS * 3 // 4)), priority=1)) for key in range(3)]
    send(ours, (Msg.SUBMIT, [(9, Tokens([1, 2, 3]))]))  # priority 0, there before the second group
    pending = Pending()
    assert _run_batch(received(theirs, reader), FakeModel(), bulk, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    kind, (keys, _, _) = answer(ours)
    assert (kind, keys) == (Msg.RESULT, [0])
    assert not ours.poll(0.1)  # nothing else ran
    assert [key for key, _ in pending] == [9, 1, 2]


def test_work_of_the_same_priority_waits_for_the_batch(reader: bool) -> None:
    """Inputs no more urgent than the batch's are queued and the batch runs to its end."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(ONE_GROUP)))) for key in range(3)]
    send(ours, (Msg.SUBMIT, [(9, Tokens([1, 2, 3]))]))
    pending = Pending()
    assert _run_batch(received(theirs, reader), FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    assert [answer(ours)[1][0] for _ in range(3)] == [[0], [1], [2]]
    assert [key for key, _ in pending] == [9]


def test_each_group_run_is_reported_to_the_thread_share(reader: bool) -> None:
    """The thread share judges each forward it is told of, so every group that ran is reported once."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(ONE_GROUP)))) for key in range(3)]  # one group each
    share = FakeShare()
    assert _run_batch(Inbox(theirs, reader), FakeModel(), batch, 0.0, share, Pending())  # type: ignore[arg-type]
    assert [answer(ours)[1][0] for _ in range(3)] == [[0], [1], [2]]
    assert share.forwards == 3


def test_an_urgent_input_read_earlier_stops_the_batch_at_the_first_bulk_group(reader: bool) -> None:
    """An urgent input that arrived while urgent groups ran waits for them, not for the bulk
    groups after them: the batch yields where its bulk part starts."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(ONE_GROUP)), priority=0 if key < 2 else 1)) for key in range(4)]
    send(ours, (Msg.SUBMIT, [(9, Tokens([1, 2, 3]))]))
    pending = Pending()
    assert _run_batch(received(theirs, reader), FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    assert [answer(ours)[1][0] for _ in range(2)] == [[0], [1]]
    assert not ours.poll(0.1)
    assert [key for key, _ in pending] == [9, 2, 3]


def test_inputs_cancelled_during_a_batch_do_not_run(reader: bool) -> None:
    """A CANCEL read between groups drops those inputs from the groups not run yet, as it is
    acknowledged (the client stops counting them at once)."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(ONE_GROUP)))) for key in range(3)]
    send(ours, (Msg.CANCEL, [1]))
    pending = Pending()
    assert _run_batch(received(theirs, reader), FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    answers = [answer(ours) for _ in range(3)]
    assert [a[0] for a in answers] == [Msg.RESULT, Msg.CANCELLED, Msg.RESULT]
    assert [answers[0][1][0], answers[2][1][0]] == [[0], [2]]
    assert not ours.poll(0.1)


def test_stop_during_a_batch_ends_it(reader: bool) -> None:
    """STOP read between groups: the batch stops there and says the engine should stop."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(ONE_GROUP)))) for key in range(3)]
    send(ours, (Msg.STOP, None))
    assert _run_batch(received(theirs, reader), FakeModel(), batch, 0.0, FakeShare(), Pending()) is False  # type: ignore[arg-type]


def test_a_query_sent_before_a_big_request_is_answered_first_and_alone(reader: bool) -> None:
    """The engine marks where each SUBMIT's request begins: a one-input request queued before an
    8-input one comes back in a group of its own, before the big one's."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    pending = Pending()
    _handle(theirs, (Msg.SUBMIT, [(0, Tokens(list(range(20))))]), pending, NO_MODEL)
    _handle(theirs, (Msg.SUBMIT, [(k, Tokens(list(range(20)))) for k in range(1, 9)]), pending, NO_MODEL)
    batch = pending.take(max_tokens=10_000, max_size=100)
    assert _run_batch(Inbox(theirs, reader), FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    assert [answer(ours)[1][0] for _ in range(2)] == [[0], list(range(1, 9))]


def test_another_tenants_input_stops_a_batch_of_inputs_queued_behind(reader: bool) -> None:
    """At one priority, an input not `behind` arriving while a batch of a tenant over its share runs
    stops it after the group in progress, and runs before the rest of it."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(300)), behind=True)) for key in range(3)]  # one group each
    send(ours, (Msg.SUBMIT, [(9, Tokens([1, 2, 3]))]))
    pending = Pending()
    assert _run_batch(received(theirs, reader), FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    assert answer(ours)[1][0] == [0]
    assert not ours.poll(0.1)
    assert [key for key, _ in pending] == [9, 1, 2]
