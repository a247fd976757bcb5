"""Dynamic batching: what one batch takes from the queue, and how a batch is cut into forward passes."""

from __future__ import annotations

import itertools
import math
import random
from collections import deque

import pytest

from common.wire import Keyed, Tokens
from engine.runtime.batching import (
    BULK_ALONE_GROUP_TOKENS,
    BULK_GROUP_TOKENS,
    CUT_BEFORE_TOKENS,
    GROUP_TOKENS,
    INTERACTIVE_GROUP_TOKENS,
    Pending,
    split_by_length,
    split_by_tokens,
    split_packed,
    take_batch,
)


def item(key: int, length: int) -> Keyed:
    """An input on the wire whose token list is `length` long."""
    return (key, Tokens(list(range(length))))


def queue(*lengths: int) -> deque[Keyed]:
    """Pending inputs keyed 0, 1, 2, ... in arrival order."""
    return deque(item(key, length) for key, length in enumerate(lengths))


def keys(items: list[Keyed] | deque[Keyed]) -> list[int]:
    return [key for key, _ in items]


def random_batch(rng: random.Random, max_items: int, max_length: int) -> list[Keyed]:
    return [item(key, rng.randint(1, max_length)) for key in range(rng.randint(1, max_items))]


def padded_cost(groups: list[list[Keyed]], call_overhead: float) -> float:
    """What the groups cost to run: per call, the overhead plus longest x count."""
    return sum(call_overhead + max(len(t.input_ids) for _, t in group) * len(group) for group in groups)


# take_batch


def test_take_batch_takes_the_oldest_first_and_removes_them_from_the_queue() -> None:
    """Within the budget, the batch is the queue's head in arrival order, and it leaves the queue."""
    pending = queue(3, 1, 4, 1, 5)
    batch = take_batch(pending, max_tokens=1000, max_size=100)
    assert keys(batch) == [0, 1, 2, 3, 4]
    assert not pending


def test_take_batch_stops_before_the_padded_size_passes_the_budget() -> None:
    """The budget caps longest x count, not the sum of real tokens (10+10+30 = 50 would fit 60)."""
    pending = queue(10, 10, 30, 10)
    batch = take_batch(pending, max_tokens=60, max_size=100)
    assert keys(batch) == [0, 1]
    assert keys(pending) == [2, 3]


def test_take_batch_pads_to_the_longest_item_taken_so_far() -> None:
    """A short item joining a batch is charged at the batch's longest length: 30 x 3 = 90 > 80."""
    pending = queue(30, 5, 5)
    batch = take_batch(pending, max_tokens=80, max_size=100)
    assert keys(batch) == [0, 1]


def test_take_batch_takes_a_batch_whose_padded_size_equals_the_budget() -> None:
    """The budget is inclusive: 3 items of 20 tokens fit a budget of 60."""
    pending = queue(20, 20, 20, 20)
    batch = take_batch(pending, max_tokens=60, max_size=100)
    assert keys(batch) == [0, 1, 2]


def test_take_batch_does_not_skip_past_an_item_that_does_not_fit() -> None:
    """Order is kept: a later item that would fit is not taken ahead of the one that does not."""
    pending = queue(10, 50, 1)
    batch = take_batch(pending, max_tokens=60, max_size=100)
    assert keys(batch) == [0]
    assert keys(pending) == [1, 2]


def test_take_batch_always_takes_the_first_item_even_if_it_is_longer_than_the_budget() -> None:
    """An input longer than the whole budget still runs, alone."""
    pending = queue(100, 1)
    batch = take_batch(pending, max_tokens=50, max_size=100)
    assert keys(batch) == [0]
    assert keys(pending) == [1]


def test_take_batch_takes_at_most_max_size_items() -> None:
    """However much budget is left, a batch holds no more than max_size inputs."""
    pending = queue(1, 1, 1, 1, 1)
    batch = take_batch(pending, max_tokens=1000, max_size=2)
    assert keys(batch) == [0, 1]
    assert keys(pending) == [2, 3, 4]


def test_take_batch_of_an_empty_queue_is_empty() -> None:
    """Nothing pending, nothing taken."""
    assert take_batch(deque(), max_tokens=100, max_size=10) == []


# split_by_tokens


def test_split_by_tokens_keeps_every_item_once_in_order() -> None:
    """Concatenated, the groups are the batch itself: nothing lost, repeated or reordered."""
    rng = random.Random(1)
    for _ in range(200):
        batch = random_batch(rng, max_items=40, max_length=300)
        groups = split_by_tokens(batch, budget=384)
        assert [x for group in groups for x in group] == batch


def test_split_by_tokens_makes_no_empty_group() -> None:
    """Every group runs a forward pass, so none is empty."""
    rng = random.Random(2)
    for _ in range(200):
        groups = split_by_tokens(random_batch(rng, max_items=40, max_length=2000), budget=384)
        assert all(groups)


def test_split_by_tokens_keeps_a_batch_within_the_budget_whole() -> None:
    """A batch whose tokens fit the budget is one group: no per-call cost is paid twice."""
    batch = [item(0, 100), item(1, 200), item(2, 84)]
    assert split_by_tokens(batch, budget=384) == [batch]


def test_split_by_tokens_fills_groups_up_to_the_budget() -> None:
    """8 inputs of 96 tokens with a budget of 384 are two groups of 4 (exactly 384 each)."""
    batch = [item(key, 96) for key in range(8)]
    groups = split_by_tokens(batch, budget=384)
    assert [len(group) for group in groups] == [4, 4]


def test_split_by_tokens_never_passes_the_budget_with_a_group_of_several() -> None:
    """A group of more than one input stays within the budget; only a lone input may be longer."""
    rng = random.Random(3)
    for _ in range(200):
        for group in split_by_tokens(random_batch(rng, max_items=40, max_length=600), budget=384):
            assert len(group) == 1 or sum(len(t.input_ids) for _, t in group) <= 384


def test_split_by_tokens_runs_an_input_longer_than_the_budget_alone() -> None:
    """An input longer than the budget is a group of its own; its neighbours are not packed with it."""
    batch = [item(0, 50), item(1, 1000), item(2, 50)]
    groups = split_by_tokens(batch, budget=384)
    assert [keys(group) for group in groups if 1 in keys(group)] == [[1]]


def test_split_by_tokens_keeps_groups_within_the_budget_when_a_split_within_it_exists() -> None:
    """7 inputs of 100 tokens fit a budget of 384 as 3+3+1; no group may hold 400 tokens."""
    batch = [item(key, 100) for key in range(7)]
    groups = split_by_tokens(batch, budget=384)
    assert max(sum(len(t.input_ids) for _, t in group) for group in groups) <= 384


# split_by_length

OVERHEADS = [0.0, 1.0, 7.5, 16.0, 100.0]


def brute_force_min_cost(batch: list[Keyed], call_overhead: float) -> float:
    """The cheapest cost over every contiguous partition of the length-sorted batch."""
    ordered = sorted(batch, key=lambda x: len(x[1].input_ids))
    n = len(ordered)
    best = math.inf
    for cuts in itertools.product([False, True], repeat=n - 1):
        groups: list[list[Keyed]] = [[ordered[0]]]
        for cut, x in zip(cuts, ordered[1:], strict=True):
            if cut:
                groups.append([])
            groups[-1].append(x)
        best = min(best, padded_cost(groups, call_overhead))
    return best


def brute_force_cases() -> list[tuple[list[Keyed], float]]:
    rng = random.Random(20240601)
    return [(random_batch(rng, max_items=8, max_length=64), rng.choice(OVERHEADS)) for _ in range(200)]


def test_split_by_length_costs_the_brute_force_minimum() -> None:
    """The dynamic programme's groups cost exactly the least of every contiguous partition (200 cases)."""
    for batch, overhead in brute_force_cases():
        groups = split_by_length(batch, call_overhead=overhead)
        expected = brute_force_min_cost(batch, overhead)
        assert math.isclose(padded_cost(groups, overhead), expected), (keys(batch), overhead)


def test_split_by_length_covers_every_item_exactly_once() -> None:
    """Every input of the batch is in exactly one group (200 random cases)."""
    for batch, overhead in brute_force_cases():
        groups = split_by_length(batch, call_overhead=overhead)
        assert sorted(x[0] for group in groups for x in group) == sorted(keys(batch))


def test_split_by_length_groups_are_runs_of_the_length_sorted_batch() -> None:
    """Groups come shortest first, and no group's lengths interleave with the next one's."""
    for batch, overhead in brute_force_cases():
        groups = split_by_length(batch, call_overhead=overhead)
        lengths = [len(t.input_ids) for group in groups for _, t in group]
        assert lengths == sorted(lengths)


def test_split_by_length_keeps_one_group_when_calls_are_expensive() -> None:
    """When a call costs more than any padding, the whole batch is one forward pass."""
    batch = [item(0, 5), item(1, 60), item(2, 30)]
    groups = split_by_length(batch, call_overhead=1e6)
    assert len(groups) == 1
    assert keys(groups[0]) == [0, 2, 1]


def test_split_by_length_does_not_pad_short_inputs_to_a_long_one_when_a_call_is_cheaper() -> None:
    """Lengths 1 and 100 with overhead 16: two calls (16+1 + 16+100) beat one padded (16+200)."""
    groups = split_by_length([item(0, 100), item(1, 1)], call_overhead=16.0)
    assert [keys(group) for group in groups] == [[1], [0]]


def test_split_by_length_of_an_empty_batch_is_no_groups() -> None:
    """Nothing to run, no forward pass."""
    assert split_by_length([]) == []


@pytest.mark.parametrize("overhead", [1.0, 7.5, 16.0, 100.0])
def test_split_by_length_keeps_inputs_of_one_length_in_one_group(overhead: float) -> None:
    """Inputs of one length need no padding, so any split would only add calls."""
    batch = [item(key, 12) for key in range(6)]
    assert len(split_by_length(batch, call_overhead=overhead)) == 1


# Pending: by priority


def urgent(key: int, length: int, priority: int) -> Keyed:
    return (key, Tokens(list(range(length)), priority=priority))


def test_pending_takes_the_most_urgent_priority_first_then_oldest() -> None:
    """Lower priority numbers run first; within one priority, arrival order."""
    pending = Pending()
    pending.extend([urgent(0, 4, 1), urgent(1, 4, 0), urgent(2, 4, 1), urgent(3, 4, -1), urgent(4, 4, 0)])
    assert keys(pending.take(max_tokens=1000, max_size=100)) == [3, 1, 4, 0, 2]
    assert not pending


def test_a_full_budget_leaves_lower_priorities_waiting() -> None:
    """The padded budget is spent on the urgent inputs first; the rest wait for the next batch."""
    pending = Pending()
    pending.extend([urgent(0, 10, 5), urgent(1, 10, 0), urgent(2, 10, 0)])
    assert keys(pending.take(max_tokens=20, max_size=100)) == [1, 2]
    assert keys(list(pending)) == [0]


def test_requeued_inputs_go_back_ahead_of_their_priority() -> None:
    """Inputs taken but not run return in front of those that came after them."""
    pending = Pending()
    pending.extend([urgent(5, 3, 1)])
    pending.requeue([urgent(1, 3, 1), urgent(2, 3, 1)])
    assert keys(list(pending)) == [1, 2, 5]
    assert pending.best() == (1, False)


def test_drop_removes_cancelled_inputs_of_every_priority() -> None:
    """A CANCEL finds its inputs whatever their priority; emptied priorities are gone."""
    pending = Pending()
    pending.extend([urgent(0, 3, 0), urgent(1, 3, 2), urgent(2, 3, 2)])
    pending.drop({0, 2})
    assert keys(list(pending)) == [1]
    assert pending.best() == (2, False) and len(pending) == 1


def test_bulk_runs_in_small_groups_only_while_urgent_work_is_about() -> None:
    """Bulk alone runs in large groups; an urgent arrival shrinks bulk groups for a while,
    and the urgent inputs never share a group with bulk ones."""
    pending = Pending()
    pending.extend([urgent(0, 60, 1)])
    assert pending.bulk_group_tokens() == BULK_ALONE_GROUP_TOKENS > GROUP_TOKENS
    pending.extend([urgent(1, 10, 0)])
    assert pending.bulk_group_tokens() == BULK_GROUP_TOKENS
    batch = [urgent(1, 10, 0), *(urgent(k, 40, 1) for k in range(2, 8))]
    groups = split_packed(batch, BULK_GROUP_TOKENS)
    assert keys(groups[0]) == [1]
    assert all(sum(len(t.input_ids) for _, t in g) <= BULK_GROUP_TOKENS for g in groups[1:])


# split_by_request: a request waiting alone does not wait for a big one that came after it


def requests(pending: Pending, *sizes: list[int]) -> list[Keyed]:
    """Each size list one request's inputs (one SUBMIT each), keyed in arrival order; the batch taken."""
    key = itertools.count()
    for lengths in sizes:
        pending.extend([item(next(key), length) for length in lengths])
    return pending.take(max_tokens=10_000, max_size=1_000)


def test_a_query_before_a_big_request_runs_in_a_group_of_its_own() -> None:
    """One 20-token input, then an 8-input request of 160 tokens: within one group's budget, yet cut."""
    pending = Pending()
    batch = requests(pending, [20], [20] * 8)
    assert [keys(g) for g in split_packed(batch, firsts=pending.firsts(batch))] == [[0], list(range(1, 9))]


def test_requests_of_one_size_share_groups_as_before() -> None:
    """32 clients' 8-input requests: no request is twice the inputs before it, so no cut."""
    pending = Pending()
    batch = requests(pending, [12] * 8, [12] * 8, [12] * 8)
    assert split_packed(batch, firsts=pending.firsts(batch)) == split_by_tokens(batch)


def test_one_sentence_requests_share_groups_as_before() -> None:
    """Requests under CUT_BEFORE_TOKENS never start a group, however they compare."""
    pending = Pending()
    batch = requests(pending, [5], [CUT_BEFORE_TOKENS - 1], [5], [CUT_BEFORE_TOKENS - 1])
    assert split_packed(batch, firsts=pending.firsts(batch)) == [batch]


def test_a_big_request_after_inputs_weighing_more_than_half_of_it_is_not_cut() -> None:
    pending = Pending()
    batch = requests(pending, [61], [30] * 4)  # 61 before a request of 120: more than half
    assert split_packed(batch, firsts=pending.firsts(batch)) == [batch]


def test_bulk_requests_keep_their_groups_full() -> None:
    """The cut is for latency: a Batch API job's one-input line before an 8-input one shares its group."""
    pending = Pending()
    pending.extend([(0, Tokens(list(range(20)), priority=1))])
    pending.extend([(1 + i, Tokens(list(range(20)), priority=1)) for i in range(8)])
    batch = pending.take(max_tokens=10_000, max_size=1_000)
    assert [keys(g) for g in split_packed(batch, firsts=pending.firsts(batch))] == [list(range(9))]


def test_request_marks_are_forgotten_when_taken_or_dropped() -> None:
    """Pending keeps a mark per request only while its first input waits: the set stays bounded."""
    pending = Pending()
    batch = requests(pending, [20], [20] * 8)
    assert pending.firsts(batch) == {0, 1}
    assert pending.firsts(batch) == set()
    pending.extend([item(20, 5)])
    pending.drop({20})
    assert pending._firsts == set()


def behind(key: int, length: int) -> Keyed:
    """An interactive input of a tenant sending past the others' share."""
    return (key, Tokens(list(range(length)), behind=True))


def test_inputs_behind_queue_after_the_others_of_their_priority_and_run_apart() -> None:
    """Within priority 0, a tenant over its share waits behind the others, older or not, and never
    shares their group; bulk work still waits behind both."""
    pending = Pending()
    pending.extend([behind(0, 10), behind(1, 10)])
    pending.extend([urgent(2, 10, 1)])
    pending.extend([urgent(3, 10, 0)])
    batch = pending.take(max_tokens=1000, max_size=100)
    assert keys(batch) == [3, 0, 1, 2]
    assert [keys(g) for g in split_packed(batch)] == [[3], [0, 1], [2]]


def test_interactive_inputs_run_in_one_group_up_to_its_budget_and_those_behind_in_small_ones() -> None:
    """32 clients' sentences waiting at one engine (~640 tokens) run as one forward; a tenant's over its
    share in GROUP_TOKENS groups, so the others wait for a small one at most."""
    batch = [item(key, 40) for key in range(16)]
    assert split_packed(batch) == [batch]
    queued_behind = [behind(key, 40) for key in range(16)]
    groups = split_packed(queued_behind)
    assert len(groups) > 1 and all(sum(len(t.input_ids) for _, t in g) <= GROUP_TOKENS for g in groups)
    assert [i for group in groups for i in group] == queued_behind


def test_interactive_groups_stay_within_their_budget() -> None:
    batch = [item(key, 40) for key in range(100)]
    groups = split_packed(batch)
    assert len(groups) == math.ceil(4000 / INTERACTIVE_GROUP_TOKENS)
    assert all(sum(len(t.input_ids) for _, t in g) <= INTERACTIVE_GROUP_TOKENS for g in groups)
