"""A batch job's status machine, as OpenAI's Batch object names its states and their timestamps."""

from __future__ import annotations

from typing import Any

# status -> the statuses it may move to
STEPS: dict[str, tuple[str, ...]] = {
    "validating": ("in_progress", "failed", "cancelling"),
    "in_progress": ("finalizing", "failed", "cancelling", "expired"),
    "finalizing": ("completed", "failed"),
    "cancelling": ("cancelled", "failed"),
    "completed": (),
    "failed": (),
    "cancelled": (),
    "expired": (),
}
FINISHED = tuple(status for status, onward in STEPS.items() if not onward)
STAMPED = ("in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled", "expired")


class StateError(ValueError):
    """A move the status machine does not allow (cancelling a finished job)."""


def moved(record: dict[str, Any], status: str, now: int) -> dict[str, Any]:
    """The record in `status`, its `<status>_at` stamped; StateError for a move not in STEPS."""
    if status not in STEPS[record["status"]]:
        raise StateError(f"a batch that is {record['status']} cannot become {status}")
    record = {**record, "status": status}
    if status in STAMPED:
        record[f"{status}_at"] = now
    return record
