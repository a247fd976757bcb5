"""The exact result cache's pieces: what an input's engine answer is keyed by, the answer's compact
binary form (the same bytes in this process and in Redis), and the process-local LRU bounded by bytes.

What is cached is the engine's answer for one input (a pooled row, token rows, or bge-m3's dict of
arrays), not a response: everything a request does after the engine (normalisation, dimensions,
encodings, chunk pooling, the surface's shape) runs on a hit as on a miss. So the key holds what
decides the engine's bits: the model's files, its precision, device and engine mode, and the input as
the engine receives it (`common.wire.Tokens`: token ids after the prompt and truncation, token types,
head, masked keys, bge-m3's outputs, an image's pixels, the LoRA adapter); never its priority or its place
in the queue (`behind`).
"""

from __future__ import annotations

import hashlib
import struct
import sys
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from common.folderjson import ModelError
from common.modelfiles import files_to_load
from common.wire import Tokens

FORMAT_VERSION = 1  # of the value's bytes and of the key's recipe: a change makes every old entry a miss
BYTES_HEADER = sys.getsizeof(b"")  # a bytes object's header and trailing NUL beside its contents (33)
BYTEARRAY_HEADER = bytearray.__basicsize__  # a bytearray's object; its contents (and a NUL) are a block apart
SMALL_OBJECT = 512  # CPython's own allocator serves blocks up to this size, in 16-byte classes; glibc the rest
NODE = 32  # an OrderedDict node (key, hash, links): sys.getsizeof counts one per entry
SAMPLE_BYTES = 1 << 20  # of each file, its first and last MiB are hashed: a content digest at a few ms a model

Value = np.ndarray | dict[str, np.ndarray]  # one input's engine answer


class CacheFormatError(ValueError):
    """Bytes that are not a value of this format version (another version's, or damaged)."""


def model_digest(folder: Path, precision: str, device: str, mode: str) -> str:
    """What decides a model's answers beside the input: its files' names, sizes and sampled contents
    (the same on every replica that holds the same files, whatever their mtimes), the precision, the
    device and the engine mode (a compiled forward's bits may differ from eager's). An input's adapter
    is in its own key (input_key)."""
    h = hashlib.blake2b(f"v{FORMAT_VERSION}|{precision}|{device}|{mode}".encode(), digest_size=16)
    try:
        files = [(f"model/{f.relative_to(folder)}", f) for f in files_to_load(folder)]
    except (ModelError, OSError, ValueError):
        files = []
    _sampled(h, files)
    return h.hexdigest()


def adapter_digest(folder: Path) -> str:
    """A LoRA adapter's files, sampled as model_digest samples a model's: one loaded at run time under a
    name another had keys its answers apart from the other's."""
    h = hashlib.blake2b(b"adapter", digest_size=16)
    _sampled(h, [(f.name, f) for f in sorted(folder.glob("*")) if f.is_file()])
    return h.hexdigest()


def _sampled(h: hashlib.blake2b, files: list[tuple[str, Path]]) -> None:
    """Each file's label, size and first and last SAMPLE_BYTES into `h`."""
    for label, path in files:
        h.update(label.encode() + b"\0")
        try:
            with path.open("rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(0)
                h.update(struct.pack("<Q", size) + fh.read(SAMPLE_BYTES))
                if size > SAMPLE_BYTES:
                    fh.seek(max(size - SAMPLE_BYTES, SAMPLE_BYTES))
                    h.update(fh.read(SAMPLE_BYTES))
        except OSError:
            h.update(b"unreadable")


def input_key(digest: str, t: Tokens, adapter: str = "") -> bytes:
    """An input's key: the model's digest, its adapter's (adapter_digest) and every field of its Tokens
    that changes the engine's answer."""
    h = hashlib.blake2b(digest.encode(), digest_size=20)
    h.update(f"|{t.head}|{t.keys}|{','.join(t.outputs)}|{t.adapter}:{adapter}|".encode())
    h.update(np.asarray(t.input_ids, dtype=np.int64).tobytes())
    if t.token_type_ids is not None:
        h.update(b"|types|" + np.asarray(t.token_type_ids, dtype=np.int64).tobytes())
    if t.pixels is not None:
        pixels = np.ascontiguousarray(t.pixels)
        h.update(f"|pixels|{pixels.dtype.str}|{pixels.shape}|".encode() + pixels.tobytes())
    return h.digest()


# header: format version, number of arrays (0: one bare array, else a dict's entries)
_HEAD = struct.Struct("<BB")
# per array: name length, dtype string length, ndim
_ARRAY = struct.Struct("<BBB")


def encode(value: Value) -> bytes:
    """A value as bytes: a small header (format version, entries), then per array its name, dtype,
    shape and raw bytes."""
    arrays = [("", value)] if isinstance(value, np.ndarray) else sorted(value.items())
    parts: list[bytes | memoryview] = [_HEAD.pack(FORMAT_VERSION, 0 if isinstance(value, np.ndarray) else len(arrays))]
    for name, array in arrays:
        array = np.ascontiguousarray(array)
        label, dtype = name.encode(), array.dtype.str.encode()
        parts.append(_ARRAY.pack(len(label), len(dtype), array.ndim) + label + dtype)
        parts.append(struct.pack(f"<{array.ndim}Q", *array.shape))
        parts.append(array.data)  # joined from its buffer: no copy of its own to allocate and free
    return b"".join(parts)


def decode(data: bytes) -> Value:
    """encode's inverse; CacheFormatError for bytes of another version or cut short. Arrays are copies
    (writable: rendering may work on them in place)."""
    try:
        version, count = _HEAD.unpack_from(data, 0)
        if version != FORMAT_VERSION:
            raise CacheFormatError(f"cache value of format {version}, not {FORMAT_VERSION}")
        at = _HEAD.size
        arrays: dict[str, np.ndarray] = {}
        for _ in range(max(count, 1)):
            name_len, dtype_len, ndim = _ARRAY.unpack_from(data, at)
            at += _ARRAY.size
            name = data[at : at + name_len].decode()
            dtype = np.dtype(data[at + name_len : at + name_len + dtype_len].decode())
            at += name_len + dtype_len
            shape = struct.unpack_from(f"<{ndim}Q", data, at)
            at += 8 * ndim
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if at + size > len(data):
                raise CacheFormatError("cache value cut short")
            flat = np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize, offset=at)
            arrays[name] = flat.reshape(shape).copy()
            at += size
    except (struct.error, UnicodeDecodeError, TypeError, ValueError) as exc:
        if isinstance(exc, CacheFormatError):
            raise
        raise CacheFormatError(f"not a cache value: {exc}") from None
    return arrays[""] if count == 0 else arrays


_BYTEARRAY_HELD = (BYTEARRAY_HEADER + 15) & -16  # a small block


class LocalLRU:
    """Encoded values by key, least recently used first out, within `bound` bytes of memory: each
    entry's key and value as their allocators hold them (cost()), and the ordered dict's tables and
    nodes as CPython counts them (its __sizeof__; the table is sized by the entries it has held, 3 to
    6 slots of ~28 bytes an entry). Thread-safe: looked up and filled on the executor.

    A value is kept in a bytearray of the LRU's own, and an evicted value's bytearray of the new
    value's length is written over instead of freed. Values are stored by whichever executor thread
    answered, in that thread's glibc arena; a block freed by another thread goes back to its own
    arena, which only its own thread reuses: freeing and allocating anew, the arenas' free space grew
    with traffic (64 MiB of 384-float rows from 4 threads: 10 MiB after 200,000 puts, 20 MiB after
    600,000). A model's rows have one length: once full, no value is allocated or freed. What still
    moves between the threads' arenas is the dict's table, rebuilt every few tens of thousands of puts
    (deleted keys use up its slots): in that test the process held 2-15 MiB more than the bound
    after 600,000 puts, from run to run, against 18-24 MiB before.
    """

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.bytes = 0  # what the entries and the dict hold: the figure kept within `bound`
        self.evictions = 0
        self._entries: OrderedDict[bytes, bytearray] = OrderedDict()
        self._objects = 0  # the entries' keys and values alone
        self._sizeof = self._entries.__sizeof__  # sys.getsizeof less the GC header, at a third of its cost
        self._table = self._sizeof()  # the dict's tables and nodes, as the last change left them
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def cost(key: bytes, value: bytes | bytearray) -> int:
        """An entry's key and value as their allocators hold them: each block rounded up to CPython's
        16-byte classes, or above SMALL_OBJECT to glibc's chunk (an 8-byte size header, 16-byte
        granules). The key is a bytes object; the value a bytearray: its object, and its contents and
        a NUL as a block of their own. Its share of the dict is counted as the dict's size."""
        k, v = BYTES_HEADER + len(key), len(value) + 1  # inline: this runs on every put
        k = (k + 15) & -16 if k <= SMALL_OBJECT else (k + 23) & -16
        return k + _BYTEARRAY_HELD + ((v + 15) & -16 if v <= SMALL_OBJECT else (v + 23) & -16)

    def get(self, key: bytes) -> bytes | None:
        """The value (a copy: the LRU's own may be written over once evicted)."""
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                return None
            self._entries.move_to_end(key)
            return bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        """Store (a value larger than the whole bound is not kept); the oldest go until it fits."""
        cost = self.cost(key, value)
        if cost > self.bound:
            return
        size = len(value)
        with self._lock:
            entries = self._entries
            spare = entries.pop(key, None)
            if spare is not None:
                self._objects -= self.cost(key, spare)
                self._table -= NODE
            # the dict as it will be with the entry in (one more node), unless it grows its table then
            while entries and self._objects + cost + self._table + NODE > self.bound:
                gone = self._evict()
                if len(gone) == size:
                    spare = gone
            if spare is not None and len(spare) == size:
                spare[:] = value  # the same length: copied in place, nothing allocated
            else:
                spare = bytearray(value)
            entries[key] = spare
            self._objects += cost
            self._table = table = self._sizeof()
            while self._objects + table > self.bound and len(entries) > 1:
                self._evict()  # the dict grew its table as the entry went in
                table = self._table
            self.bytes = self._objects + table

    def _evict(self) -> bytearray:
        key, value = self._entries.popitem(last=False)
        self._objects -= self.cost(key, value)
        self._table -= NODE
        self.evictions += 1
        return value
