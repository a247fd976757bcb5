"""The engine's idle heap trim (engine/runtime/heap.py), in a child process whose heap nothing else uses."""

from __future__ import annotations

import ctypes
import multiprocessing
from multiprocessing.connection import Connection

from engine.runtime.heap import HeapTrim

MIB = 1 << 20


def _resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / MIB


def _fragment_then_trim(conn: Connection, trim_above: int, build: bool = False) -> None:
    """Frees 56 of 64 touched 1 MiB blocks from the heap, every eighth kept so the holes cannot be
    returned from its top; sends the resident MiB after the frees and after heap.idle() (`build`:
    after the forkserver's build_all of no model instead)."""
    if build:
        from engine.runtime.preloaded import build_all  # torch's import first: it would fill the holes

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(16 * MIB))  # a freed 16 MiB mapping lifts glibc's mmap threshold above 1 MiB
    blocks = [libc.malloc(MIB) for _ in range(64)]
    for block in blocks:
        ctypes.memset(block, 1, MIB)
    for i, block in enumerate(blocks):
        if i % 8:
            libc.free(block)
    freed = _resident_mib()
    heap = HeapTrim(trim_above=trim_above, every_s=0.0)
    if build:
        build_all([])
    else:
        heap.idle()
    conn.send((freed, _resident_mib(), heap.trims))


def _run(trim_above: int, build: bool = False) -> tuple[float, float, int]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_fragment_then_trim, args=(child, trim_above, build))
    proc.start()
    assert parent.poll(60), "the child did not report"
    result: tuple[float, float, int] = parent.recv()
    proc.join(10)
    return result


def test_an_idle_engine_hands_freed_heap_memory_back() -> None:
    """Memory freed inside the heap stays resident until the idle trim, which returns it."""
    freed, trimmed, trims = _run(trim_above=32 * MIB)
    assert trims == 1
    assert freed - trimmed >= 40  # of the 56 MiB freed


def test_a_heap_with_little_free_is_not_trimmed() -> None:
    """Below the free-bytes mark idle() trims nothing."""
    freed, trimmed, trims = _run(trim_above=1 << 40)
    assert trims == 0 and abs(freed - trimmed) < 8


def test_the_forkserver_hands_freed_heap_memory_back_before_forking() -> None:
    """What building the models freed (a checkpoint's float32 copies converted to bfloat16) is not
    inherited by every engine: build_all ends with a trim."""
    freed, trimmed, _ = _run(trim_above=1 << 40, build=True)
    assert freed - trimmed >= 40


def test_idle_checks_at_most_once_per_interval() -> None:
    """Within `every_s` of the last check idle() does not even look at the heap."""
    heap = HeapTrim(trim_above=0, every_s=3600)
    heap.idle()
    assert heap.trims == 0
