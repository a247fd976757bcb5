"""Just enough of a 64-bit little-endian ELF file to plan prefetch reads without loading it: the
segments the dynamic loader maps, and the dynamic section's DT_NEEDED and RUNPATH/RPATH."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_PT_LOAD, _PT_DYNAMIC, _PF_X = 1, 2, 1
_DT_NEEDED, _DT_STRTAB, _DT_STRSZ, _DT_RPATH, _DT_RUNPATH = 1, 5, 10, 15, 29
_ERRORS = (OSError, struct.error, ValueError, UnicodeDecodeError, KeyError, StopIteration)


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD segment: where it lies in the file and in memory, and whether it holds code."""

    offset: int
    vaddr: int
    size: int
    executable: bool


def loaded_segments(path: Path) -> list[Segment] | None:
    """The file's PT_LOAD segments in file order (what the loader maps: no debug sections, no
    symbol tables for debuggers); None when it is not such an ELF file or cannot be read."""
    try:
        with open(path, "rb") as f:
            headers = _program_headers(f)
    except _ERRORS:
        return None
    return None if headers is None else sorted(headers[0], key=lambda s: s.offset)


def dynamic_section(path: Path) -> tuple[list[str], list[Path]]:
    """(DT_NEEDED names, RUNPATH or else RPATH directories with $ORIGIN expanded); ([], []) for
    anything else or on any error."""
    try:
        with open(path, "rb") as f:
            return _read_dynamic(f, path.parent)
    except _ERRORS:
        return [], []


def _program_headers(f: BinaryIO) -> tuple[list[Segment], tuple[int, int] | None] | None:
    """(PT_LOAD segments, the dynamic section's (offset, size) or None); None when not ELF64 LE."""
    header = f.read(64)
    if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        return None
    phoff, phentsize, phnum = struct.unpack_from("<Q", header, 0x20)[0], *struct.unpack_from("<HH", header, 0x36)
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, flags, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == _PT_LOAD and filesz:
            loads.append(Segment(offset, vaddr, filesz, bool(flags & _PF_X)))
        elif p_type == _PT_DYNAMIC:
            dynamic = (offset, filesz)
    return loads, dynamic


def _read_dynamic(f: BinaryIO, origin: Path) -> tuple[list[str], list[Path]]:
    headers = _program_headers(f)
    if headers is None or headers[1] is None:
        return [], []
    loads, (offset, size) = headers[0], headers[1]
    f.seek(offset)
    raw = f.read(size)
    tags: dict[int, list[int]] = {}
    for at in range(0, len(raw) - 15, 16):
        tag, value = struct.unpack_from("<qQ", raw, at)
        if tag == 0:
            break
        tags.setdefault(tag, []).append(value)
    address = tags[_DT_STRTAB][0]  # a virtual address: found in the segment that maps it
    f.seek(next(s.offset + address - s.vaddr for s in loads if s.vaddr <= address < s.vaddr + s.size))
    strings = f.read(tags[_DT_STRSZ][0])

    def string(at: int) -> str:
        return strings[at : strings.index(b"\0", at)].decode()

    paths = tags.get(_DT_RUNPATH) or tags.get(_DT_RPATH) or []
    dirs = [
        Path(d.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin)))
        for at in paths
        for d in string(at).split(":")
        if d
    ]
    return [string(at) for at in tags.get(_DT_NEEDED, [])], dirs
