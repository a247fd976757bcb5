"""The engine's message handling, over a real pipe (no model needed)."""

from __future__ import annotations

import multiprocessing
from collections import deque

from common.wire import Keyed, Msg, Tokens
from engine.process import _handle


def test_a_cancel_drops_queued_inputs_and_is_acknowledged() -> None:
    """CANCEL removes those inputs from the queue and answers CANCELLED, so the client stops
    counting them as this engine's load."""
    ours, theirs = multiprocessing.Pipe(duplex=True)
    pending: deque[Keyed] = deque([(1, Tokens([5])), (2, Tokens([6])), (3, Tokens([7]))])
    assert _handle(theirs, (Msg.CANCEL, [1, 3]), pending)
    assert [key for key, _ in pending] == [2]
    assert ours.poll(5) and ours.recv() == (Msg.CANCELLED, None)


def test_stop_ends_the_loop() -> None:
    """STOP makes the handler say the engine should stop."""
    _, theirs = multiprocessing.Pipe(duplex=True)
    assert _handle(theirs, (Msg.STOP, None), deque()) is False
