"""Dynamic batching: take what is queued, cap by a padded-token budget, sort by length to cut padding."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# A sub-batch closes when padding would exceed this share of its real tokens. Forward calls on
# CPU cost little beyond their tokens, so short sorted sub-batches beat one padded batch.
MAX_PADDING_SHARE = 0.25
MIN_SUB_BATCH = 4


@dataclass(frozen=True, slots=True)
class Item:
    key: int
    input_ids: list[int]
    token_type_ids: list[int] | None = None


def take_batch(pending: deque[Item], max_tokens: int, max_size: int) -> list[Item]:
    """Oldest first, until the padded size (longest x count) would pass the budget.

    The first item is always taken, so an input longer than the budget still runs, alone.
    """
    batch: list[Item] = []
    longest = 0
    while pending and len(batch) < max_size:
        length = len(pending[0].input_ids)
        if batch and max(longest, length) * (len(batch) + 1) > max_tokens:
            break
        longest = max(longest, length)
        batch.append(pending.popleft())
    return batch


def split_by_length(batch: list[Item]) -> list[list[Item]]:
    """Sorted sub-batches whose padding stays under MAX_PADDING_SHARE of their real tokens."""
    ordered = sorted(batch, key=lambda item: len(item.input_ids))
    groups: list[list[Item]] = []
    current: list[Item] = []
    real = 0
    for item in ordered:
        length = len(item.input_ids)
        padded = length * (len(current) + 1)
        if len(current) >= MIN_SUB_BATCH and padded - (real + length) > MAX_PADDING_SHARE * (real + length):
            groups.append(current)
            current, real = [], 0
        current.append(item)
        real += length
    if current:
        groups.append(current)
    return groups
