"""A batch input file's lines: read a group at a byte offset, checked one by one (a malformed line
is an error line, not a failed job), and the output and error lines in OpenAI's shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from server.batches.store import new_id


@dataclass(frozen=True)
class Line:
    """One input line, ready to run (body) or refused (error: code, message)."""

    custom_id: str | None
    body: bytes = b""
    error: tuple[str, str] | None = None


@dataclass
class Scan:
    """What a whole input file holds: its line count, the lines that repeat an earlier custom_id
    (by number), the models its bodies name (None: the default) and how many lines are JSON objects."""

    total: int = 0
    duplicates: set[int] = field(default_factory=set)
    models: set[str | None] = field(default_factory=set)
    objects: int = 0


def lines_of(data: bytes) -> list[bytes]:
    """The file's lines, blank ones skipped (a trailing newline is no line)."""
    return [line for line in data.split(b"\n") if line.strip()]


def scan(path: Path) -> Scan:
    found = Scan()
    seen: set[str] = set()
    for number, raw in enumerate(lines_of(path.read_bytes())):
        found.total += 1
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(line, dict):
            continue
        found.objects += 1
        custom_id = line.get("custom_id")
        if isinstance(custom_id, str):
            if custom_id in seen:
                found.duplicates.add(number)
            seen.add(custom_id)
        body = line.get("body")
        if isinstance(body, dict):
            model = body.get("model")
            found.models.add(model if isinstance(model, str) else None)
    return found


def read_group(path: Path, offset: int, count: int) -> tuple[list[bytes], int]:
    """Up to `count` non-blank lines from byte `offset`, and the offset after them."""
    group: list[bytes] = []
    with open(path, "rb") as source:
        source.seek(offset)
        while len(group) < count:
            raw = source.readline()
            if not raw:
                break
            offset += len(raw)
            if raw.strip():
                group.append(raw)
    return group, offset


def check(raw: bytes, number: int, endpoint: str, duplicates: set[int]) -> Line:
    """The line as OpenAI's batch input line: {custom_id, method: POST, url: the job's endpoint, body}."""
    try:
        line: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Line(None, error=("invalid_json", f"line {number + 1} is not JSON: {exc}"))
    if not isinstance(line, dict):
        return Line(None, error=("invalid_json", f"line {number + 1} is not a JSON object"))
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(None, error=("missing_custom_id", f"line {number + 1} has no string 'custom_id'"))
    if number in duplicates:
        return Line(custom_id, error=("duplicate_custom_id", f"custom_id {custom_id!r} appears on an earlier line"))
    if line.get("method") != "POST":
        return Line(custom_id, error=("invalid_method", "'method' must be POST"))
    if line.get("url") != endpoint:
        return Line(custom_id, error=("invalid_url", f"'url' must be the batch's endpoint, {endpoint}"))
    body = line.get("body")
    if not isinstance(body, dict):
        return Line(custom_id, error=("invalid_body", "'body' must be a JSON object"))
    return Line(custom_id, orjson.dumps(body))


def answer_line(custom_id: str, status: int, body: bytes) -> bytes:
    """The route's answer: an output line (2xx) or, refused, an error line with its response."""
    request_id = new_id("req_")
    response = {"status_code": status, "request_id": request_id, "body": orjson.Fragment(body)}
    return (
        orjson.dumps({"id": new_id("batch_req_"), "custom_id": custom_id, "response": response, "error": None}) + b"\n"
    )


def error_line(custom_id: str | None, code: str, message: str) -> bytes:
    """A line that never reached the route."""
    error = {"code": code, "message": message}
    return orjson.dumps({"id": new_id("batch_req_"), "custom_id": custom_id, "response": None, "error": error}) + b"\n"
