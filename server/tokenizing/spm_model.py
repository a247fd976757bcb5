"""sentencepiece's model file (spiece.model: a ModelProto) read without the sentencepiece package: the
pieces with their scores and types, and the trainer and normalizer settings encoding depends on.

A protobuf message is a run of (field number, wire type, value) records; only the fields read here
are decoded, the rest skipped (their values are never needed to encode text).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path


class PieceType(IntEnum):
    """sentencepiece's ModelProto.SentencePiece.Type."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


UNIGRAM = 1  # TrainerSpec.model_type (BPE = 2, WORD = 3, CHAR = 4)
_FLOAT = struct.Struct("<f")  # a score: a little-endian float32 (wire type 5)


class SpmError(ValueError):
    """The file is not a sentencepiece model this reader understands."""


@dataclass(frozen=True)
class SpmModel:
    """A ModelProto's fields that decide how text is encoded; defaults are the .proto file's."""

    pieces: list[tuple[str, float, PieceType]]  # in id order
    model_type: int = UNIGRAM
    unk_id: int = 0
    byte_fallback: bool = False
    treat_whitespace_as_suffix: bool = False
    precompiled_charsmap: bytes = b""  # the normalization rules (nmt_nfkc, ...) compiled; empty: none
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True


def read_spm(path: Path) -> SpmModel:
    """The model in `path`; SpmError for a file that does not parse as a ModelProto with pieces."""
    try:
        return _model(path.read_bytes())
    except (IndexError, TypeError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise SpmError(f"cannot read {path} as a sentencepiece model: {exc}") from exc


def _model(data: bytes) -> SpmModel:
    pieces: list[tuple[str, float, PieceType]] = []
    trainer: dict[int, int | bytes] = {}
    normalizer: dict[int, int | bytes] = {}
    for number, value in _fields(data):
        if number == 1 and isinstance(value, bytes):  # repeated SentencePiece pieces
            pieces.append(_piece(value))
        elif number == 2 and isinstance(value, bytes):  # TrainerSpec
            trainer = dict(_fields(value))
        elif number == 3 and isinstance(value, bytes):  # NormalizerSpec
            normalizer = dict(_fields(value))
    if not pieces:
        raise SpmError("no pieces")
    charsmap = normalizer.get(2, b"")
    return SpmModel(
        pieces=pieces,
        model_type=int(trainer.get(3, UNIGRAM)),
        unk_id=int(trainer.get(40, 0)),
        byte_fallback=bool(trainer.get(35, 0)),
        treat_whitespace_as_suffix=bool(trainer.get(24, 0)),
        precompiled_charsmap=charsmap if isinstance(charsmap, bytes) else b"",
        add_dummy_prefix=bool(normalizer.get(3, 1)),
        remove_extra_whitespaces=bool(normalizer.get(4, 1)),
        escape_whitespaces=bool(normalizer.get(5, 1)),
    )


def _piece(data: bytes) -> tuple[str, float, PieceType]:
    """One SentencePiece message: piece (1), score (2), type (3). Its usual layout, written by
    sentencepiece in field order with a one-byte length, is read directly (a multilingual model has
    250k pieces); anything else goes through the general reader."""
    size = data[1] if data[:1] == b"\x0a" else 0x80
    if size < 0x80 and data[2 + size : 3 + size] == b"\x15":
        text, score = data[2 : 2 + size], _FLOAT.unpack_from(data, 3 + size)[0]
        rest = data[7 + size :]
        if not rest:
            return text.decode("utf-8"), score, PieceType.NORMAL
        if len(rest) == 2 and rest[0] == 0x18:
            return text.decode("utf-8"), score, PieceType(rest[1])
    fields = dict(_fields(data))
    piece, packed, kind = fields.get(1, b""), fields.get(2, bytes(4)), fields.get(3, PieceType.NORMAL)
    if not isinstance(piece, bytes) or not isinstance(packed, bytes) or not isinstance(kind, int):
        raise SpmError("a piece of the wrong shape")
    return piece.decode("utf-8"), _FLOAT.unpack(packed)[0], PieceType(kind)


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one message, in order: a varint as an int, a length-delimited field
    (a string, bytes or a message) or a fixed 32/64-bit one (a float) as its bytes."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        wire = key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:
            raise SpmError(f"unexpected wire type {wire}")
        if pos > end:
            raise SpmError("truncated")
        yield key >> 3, value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
