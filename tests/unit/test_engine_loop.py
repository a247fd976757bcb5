"""The engine's message handling, over a real pipe (no model needed)."""

from __future__ import annotations

import multiprocessing

import numpy as np

from common.wire import Msg, Tokens, send
from engine.batching import Pending
from engine.process import _handle, _run_batch


def test_a_cancel_drops_queued_inputs_and_is_acknowledged() -> None:
    """CANCEL removes those inputs from the queue and answers CANCELLED, so the client stops
    counting them as this engine's load."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    pending = Pending()
    pending.extend([(1, Tokens([5])), (2, Tokens([6])), (3, Tokens([7]))])
    assert _handle(theirs, (Msg.CANCEL, [1, 3]), pending)
    assert [key for key, _ in pending] == [2]
    assert ours.poll(5) and ours.recv() == (Msg.CANCELLED, None)


def test_stop_ends_the_loop() -> None:
    """STOP makes the handler say the engine should stop."""
    _, theirs = multiprocessing.Pipe(duplex=True)
    assert _handle(theirs, (Msg.STOP, None), Pending()) is False


class FakeModel:
    """Stands in for a packed PoolingModel: one zero vector per input."""

    packed = True

    def forward(self, items: list[Tokens]) -> np.ndarray:
        return np.zeros((len(items), 2), dtype=np.float32)


class FakeShare:
    def working(self) -> None:
        pass


def test_more_urgent_work_stops_a_batch_between_groups() -> None:
    """An urgent input arriving while a bulk batch runs stops it after the group in progress: the
    groups not run go back to the queue behind the urgent input, in their order."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    bulk = [(key, Tokens(list(range(300)), priority=1)) for key in range(3)]  # one group each
    send(ours, (Msg.SUBMIT, [(9, Tokens([1, 2, 3]))]))  # priority 0, there before the second group
    assert theirs.poll(5)
    pending = Pending()
    assert _run_batch(theirs, FakeModel(), bulk, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    kind, (keys, _, _) = ours.recv()
    assert (kind, keys) == (Msg.RESULT, [0])
    assert not ours.poll(0.1)  # nothing else ran
    assert [key for key, _ in pending] == [9, 1, 2]


def test_work_of_the_same_priority_waits_for_the_batch() -> None:
    """Inputs no more urgent than the batch's are queued and the batch runs to its end."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(300)))) for key in range(3)]
    send(ours, (Msg.SUBMIT, [(9, Tokens([1, 2, 3]))]))
    pending = Pending()
    assert _run_batch(theirs, FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    assert [ours.recv()[1][0] for _ in range(3)] == [[0], [1], [2]]
    assert [key for key, _ in pending] == [9]


def test_an_urgent_input_read_earlier_stops_the_batch_at_the_first_bulk_group() -> None:
    """An urgent input that arrived while urgent groups ran waits for them, not for the bulk
    groups after them: the batch yields where its bulk part starts."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(300)), priority=0 if key < 2 else 1)) for key in range(4)]
    send(ours, (Msg.SUBMIT, [(9, Tokens([1, 2, 3]))]))
    pending = Pending()
    assert _run_batch(theirs, FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    assert [ours.recv()[1][0] for _ in range(2)] == [[0], [1]]
    assert not ours.poll(0.1)
    assert [key for key, _ in pending] == [9, 2, 3]


def test_inputs_cancelled_during_a_batch_do_not_run() -> None:
    """A CANCEL read between groups drops those inputs from the groups not run yet, as it is
    acknowledged (the client stops counting them at once)."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(300)))) for key in range(3)]
    send(ours, (Msg.CANCEL, [1]))
    pending = Pending()
    assert _run_batch(theirs, FakeModel(), batch, 0.0, FakeShare(), pending)  # type: ignore[arg-type]
    answers = [ours.recv() for _ in range(3)]
    assert [a[0] for a in answers] == [Msg.RESULT, Msg.CANCELLED, Msg.RESULT]
    assert [answers[0][1][0], answers[2][1][0]] == [[0], [2]]
    assert not ours.poll(0.1)


def test_stop_during_a_batch_ends_it() -> None:
    """STOP read between groups: the batch stops there and says the engine should stop."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    batch = [(key, Tokens(list(range(300)))) for key in range(3)]
    send(ours, (Msg.STOP, None))
    assert _run_batch(theirs, FakeModel(), batch, 0.0, FakeShare(), Pending()) is False  # type: ignore[arg-type]
