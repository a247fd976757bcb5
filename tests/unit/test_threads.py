"""ThreadShare (engine/threads.py): torch threads by who else is busy, and a later engine's warm-up
waiting for the serving engines to be idle."""

from __future__ import annotations

import threading

import torch

from engine.threads import ThreadShare


def test_working_alone_takes_the_solo_threads_and_beside_another_the_shared() -> None:
    """An engine that is the only busy one uses its solo thread count; with another busy, its share."""
    threads = torch.get_num_threads()
    try:
        busy = [0, 0]
        share = ThreadShare(busy, slot=1, shared=1, solo=2)
        share.working()
        assert torch.get_num_threads() == 2 and busy == [0, 1]
        share.idle()
        busy[0] = 1
        share.working()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_wait_quiet_returns_once_the_other_engines_are_idle() -> None:
    """wait_quiet blocks while another engine is busy and returns when it goes idle, before its
    timeout."""
    busy = [1, 0]
    share = ThreadShare(busy, slot=1, shared=1, solo=1)
    order: list[str] = []
    waiting = threading.Thread(target=lambda: (share.wait_quiet(60), order.append("warm-up")))
    waiting.start()
    waiting.join(0.05)
    assert waiting.is_alive() and order == []
    order.append("first engine idle")
    busy[0] = 0
    waiting.join(10)
    assert order == ["first engine idle", "warm-up"]


def test_wait_quiet_gives_up_at_its_timeout_and_ignores_its_own_flag() -> None:
    """Under steady work elsewhere wait_quiet returns after its timeout; its own busy flag does not
    count."""
    busy = [1, 1]
    share = ThreadShare(busy, slot=1, shared=1, solo=1)
    share.wait_quiet(0.01)
    assert busy == [1, 1]
    ThreadShare([0, 1], slot=1, shared=1, solo=1).wait_quiet(60)  # returns at once: only itself busy
