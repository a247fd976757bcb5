"""Instances — a folder's tokenizers, shared by threads: each call sets its own truncation on the tokenizer
it uses, so a thread holds one for the call; at most one per CPU this process may run on exist (made as
needed, kept for reuse). An XLM-R tokenizer of 250,002 pieces is ~290 MB: one per executor thread held
1.2 GB for tokenizing no faster than one per core. A slot may hold variants of the tokenizer beside it
(SigLIP's plain one), taken and given back with it."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tokenizers import Tokenizer

Method = TypeVar("Method", bound=Callable[..., Any])


Slot = tuple[Tokenizer, ...]  # the tokenizer, then its variants


class Instances:
    def __init__(self, serialized: str, *variants: str) -> None:
        self._json = (serialized, *variants)
        self._local = threading.local()  # .tok: the slot this thread holds now, if any
        self._idle: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        self._limit = max(1, len(os.sched_getaffinity(0)))
        self.made = 0
        self._making = threading.Lock()

    @contextlib.contextmanager
    def held(self) -> Iterator[Tokenizer]:
        """A tokenizer for this thread until the block ends (the one it holds already, if it does): an
        idle one, a new one while fewer than the limit exist, else the next one given back."""
        mine: Slot | None = getattr(self._local, "tok", None)
        if mine is not None:
            yield mine[0]
            return
        slot = self._take()
        self._local.tok = slot
        try:
            yield slot[0]
        finally:
            self._local.tok = None
            self._idle.put(slot)

    def get(self, variant: int = 0) -> Tokenizer:
        """The tokenizer this thread holds (0), or one of its variants."""
        slot: Slot | None = getattr(self._local, "tok", None)
        assert slot is not None, "a tokenizer used outside held()"
        return slot[variant]

    def _take(self) -> Slot:
        with contextlib.suppress(queue.Empty):
            return self._idle.get_nowait()
        with self._making:
            make = self.made < self._limit
            self.made += make
        if not make:
            return self._idle.get()  # held for one call's tokenizing: no deadline of its own needed
        try:
            return tuple(Tokenizer.from_str(serialized) for serialized in self._json)
        except BaseException:
            with self._making:
                self.made -= 1
            raise


def holding(method: Method) -> Method:
    """The pool's method runs with one of its tokenizers held by its thread (pool.get() is it)."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self.instances.held():
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]
