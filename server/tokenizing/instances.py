"""Instances — a folder's tokenizers, shared by threads: each call sets its own truncation on the tokenizer
it uses, so a thread holds one for the call; at most one per CPU this process may run on exist (made as
needed, kept for reuse). An XLM-R tokenizer of 250,002 pieces is ~290 MB: one per executor thread held
1.2 GB for tokenizing no faster than one per core."""

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


class Instances:
    def __init__(self, serialized: str) -> None:
        self._json = serialized
        self._local = threading.local()  # .tok: the tokenizer this thread holds now, if any
        self._idle: queue.SimpleQueue[Tokenizer] = queue.SimpleQueue()
        self._limit = max(1, len(os.sched_getaffinity(0)))
        self.made = 0
        self._making = threading.Lock()

    @contextlib.contextmanager
    def held(self) -> Iterator[Tokenizer]:
        """A tokenizer for this thread until the block ends (the one it holds already, if it does): an
        idle one, a new one while fewer than the limit exist, else the next one given back."""
        mine: Tokenizer | None = getattr(self._local, "tok", None)
        if mine is not None:
            yield mine
            return
        tok = self._take()
        self._local.tok = tok
        try:
            yield tok
        finally:
            self._local.tok = None
            self._idle.put(tok)

    def get(self) -> Tokenizer:
        """The tokenizer this thread holds."""
        tok: Tokenizer | None = getattr(self._local, "tok", None)
        assert tok is not None, "a tokenizer used outside held()"
        return tok

    def _take(self) -> Tokenizer:
        with contextlib.suppress(queue.Empty):
            return self._idle.get_nowait()
        with self._making:
            make = self.made < self._limit
            self.made += make
        if not make:
            return self._idle.get()  # held for one call's tokenizing: no deadline of its own needed
        try:
            return Tokenizer.from_str(self._json)
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
