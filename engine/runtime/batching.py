"""Dynamic batching: take what is queued, cap by a padded-token budget, cut into forward passes."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

from common.wire import Keyed, Tokens, order

# What one forward call costs beyond its tokens, in tokens; the engine measures it at warm-up.
DEFAULT_CALL_OVERHEAD_TOKENS = 16.0
# Tokens per packed forward pass of interactive inputs. A batch cut into several groups set the tail
# under closed-loop load: the clients a batch's last group answers send again just after the engine took
# its next batch, and wait for all of it as well as their own. On 2 cores of an AMD EPYC Zen 4 at 32
# clients (bench.paired, compiled, 12 rounds against 384-token groups), 1536: p99 of all rounds'
# requests 239.3 against 256.9 ms (round median 0.93x), 1.00x the inputs/s; 768: p99 0.91-0.97x in
# four runs, 0.99-1.03x the inputs/s. Streaming results back group by group once let the HTTP process
# render while the engine computed (one group per batch measured probe p99 16-18 ms against 5-11 ms
# split); with rendering on the executor the probe's p99 was 6.3 against 6.7 ms.
INTERACTIVE_GROUP_TOKENS = 1536
# Tokens per packed forward pass of interactive inputs queued behind the others' (a tenant over its
# share, common.wire.Tokens.behind): the others, arriving while one runs, wait for it.
GROUP_TOKENS = 384
# Bulk work's groups (priority above 0) while urgent work is about (an input at priority 0 or
# lower within URGENT_WINDOW_S): an urgent input waits for the group running when it arrives, and
# on 2 busy cores a 384-token group took ~130 ms. bench.priority under a bulk flood, interactive p99
# over its p99 alone: 384: 9.9x; 128: 3.5x (bulk at 74% of its rate); 64: 2.2x (bulk at 60%).
# The window is long so that interactive requests seconds apart still find small groups (the first
# one after a quiet spell waits for a large one).
BULK_GROUP_TOKENS = 64
URGENT_WINDOW_S = 10.0
# Bulk work's groups while no urgent work is about (a Batch API job, a bulk client alone): nobody
# waits on a group, so it takes bigger ones, which amortise each call's costs. A Batch API job of
# 5,000 mixed sentences on 2 Zen 5 cores (128 lines in flight): 1.04-1.06x the lines/s of 384-token
# groups; one thread, eager or compiled, 1.03-1.04x. The price: the first urgent input after a quiet
# spell waits for one such group (~0.15 s on one core for all-MiniLM-L6-v2).
BULK_ALONE_GROUP_TOKENS = 1536
# A request of at least this many tokens (several inputs, or a long one) starts a group of its own
# when the inputs before it at its priority (since the last such cut) weigh at most half as much: they
# run first, without it. Packed into one group with it, a one-input search query that reached an engine
# just before a tenant's 8-input request waited for all nine (~40 ms on one Zen 5 core instead of
# ~7). Requests of one sentence each (32 clients' batch-1 load) never reach it, nor do requests of one
# size (32 clients' 8-input requests): their groups are as before.
CUT_BEFORE_TOKENS = GROUP_TOKENS // 4


def n_tokens(item: Keyed) -> int:
    return len(item[1].input_ids)


def take_batch(pending: deque[Keyed], max_tokens: int, max_size: int, batch: list[Keyed] | None = None) -> list[Keyed]:
    """Oldest first, until the padded size (longest x count) would pass the budget; onto `batch`
    when one is being filled.

    The first item is always taken, so an input longer than the budget still runs, alone.
    """
    batch = [] if batch is None else batch
    longest = max((n_tokens(item) for item in batch), default=0)
    while pending and len(batch) < max_size:
        length = n_tokens(pending[0])
        if batch and max(longest, length) * (len(batch) + 1) > max_tokens:
            break
        longest = max(longest, length)
        batch.append(pending.popleft())
    return batch


class Pending:
    """The inputs an engine holds, by priority (lower first, as vLLM's `priority`; within one, those not
    `behind` first: common.wire.order), oldest first within one."""

    def __init__(self) -> None:
        self._queues: dict[tuple[int, bool], deque[Keyed]] = {}
        self.urgent_at = -URGENT_WINDOW_S  # when an input at priority 0 or lower last arrived (monotonic)
        self._firsts: set[int] = set()  # the key of each request's first input here (split_by_request)

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __iter__(self) -> Iterator[Keyed]:
        for rank in sorted(self._queues):
            yield from self._queues[rank]

    def extend(self, items: list[Keyed]) -> None:
        """One message's inputs: one request's share (several requests' when inputs move between engines,
        then taken for one by split_by_request)."""
        if items:
            self._firsts.add(items[0][0])
        urgent = False
        for item in items:
            rank = order(item[1])
            urgent = urgent or rank[0] <= 0
            queue = self._queues.get(rank)
            if queue is None:
                queue = self._queues[rank] = deque()
            queue.append(item)
        if urgent:
            self.urgent_at = time.monotonic()

    def bulk_group_tokens(self) -> int:
        """Bulk groups' budget: small while urgent work is about, else large."""
        return BULK_GROUP_TOKENS if time.monotonic() - self.urgent_at < URGENT_WINDOW_S else BULK_ALONE_GROUP_TOKENS

    def requeue(self, items: list[Keyed]) -> None:
        """Inputs taken but not run go back ahead of those of their priority that came after them."""
        for item in reversed(items):
            self._queues.setdefault(order(item[1]), deque()).appendleft(item)

    def firsts(self, batch: list[Keyed]) -> set[int]:
        """The keys of `batch` that begin a request, forgotten here (a batch requeued loses them: its
        requests then run as one, as before)."""
        found = {key for key, _ in batch if key in self._firsts}
        self._firsts -= found
        return found

    def drop(self, keys: set[int]) -> None:
        self._firsts -= keys
        for rank, queue in list(self._queues.items()):
            kept = [item for item in queue if item[0] not in keys]
            if kept:
                self._queues[rank] = deque(kept)
            else:
                del self._queues[rank]

    def best(self) -> tuple[int, bool] | None:
        """The most urgent order waiting (common.wire.order: the lowest), None when nothing waits."""
        return min(self._queues) if self._queues else None

    def take(self, max_tokens: int, max_size: int) -> list[Keyed]:
        """A batch: the most urgent inputs first, then the next rank's (common.wire.order: priority, then
        behind) while the budget lasts."""
        batch: list[Keyed] = []
        for rank in sorted(self._queues):
            queue = self._queues[rank]
            before = len(batch)
            take_batch(queue, max_tokens, max_size, batch)
            if not queue:
                del self._queues[rank]
            if len(batch) == before or len(batch) == max_size or queue:
                break  # the budget is spent: lower priorities wait for the next batch
        return batch


def split_by_tokens(batch: list[Keyed], budget: int = GROUP_TOKENS) -> list[list[Keyed]]:
    """For packed models, which pay for real tokens only: groups of near-equal size within the token
    budget (an input longer than the budget runs alone), oldest first (length does not matter, so
    neither does order).

    Groups stream back one by one, so the HTTP process renders while the engine computes.
    """
    total = sum(n_tokens(item) for item in batch)
    target = total / max(1, -(-total // budget))  # ceil(total / budget) groups of equal share
    groups: list[list[Keyed]] = []
    seen = 0
    in_group = 0
    for item in batch:
        length = n_tokens(item)
        if not groups or (in_group and (seen + length / 2 > target * len(groups) or in_group + length > budget)):
            groups.append([])
            in_group = 0
        groups[-1].append(item)
        seen += length
        in_group += length
    return groups


def split_by_request(run: list[Keyed], firsts: set[int]) -> list[list[Keyed]]:
    """`run` cut before each request of CUT_BEFORE_TOKENS or more that the inputs before it since the
    last cut weigh at most half of (`firsts`: the keys that begin a request; an input whose key is not there
    belongs to the request before it)."""
    requests: list[list[Keyed]] = []
    for item in run:
        if not requests or item[0] in firsts:
            requests.append([])
        requests[-1].append(item)
    parts: list[list[Keyed]] = []
    before = 0  # tokens in the part being filled
    for request in requests:
        size = sum(n_tokens(item) for item in request)
        if not parts or (size >= CUT_BEFORE_TOKENS and 2 * before <= size):
            parts.append([])
            before = 0
        parts[-1].extend(request)
        before += size
    return parts


def split_by_urgency(batch: list[Keyed]) -> list[list[Keyed]]:
    """The batch's urgent inputs (priority 0 or lower) and its bulk ones, apart, and of each those
    `behind` apart (Pending.take orders a batch so): urgent inputs run in groups of their own, not behind
    bulk tokens, while clients that give every request its own priority still get full groups."""

    def kind(tokens: Tokens) -> tuple[bool, bool]:
        return tokens.priority > 0, tokens.behind

    runs: list[list[Keyed]] = []
    for item in batch:
        if not runs or kind(runs[-1][0][1]) != kind(item[1]):
            runs.append([])
        runs[-1].append(item)
    return runs


def split_packed(
    batch: list[Keyed], bulk_tokens: int = GROUP_TOKENS, firsts: set[int] | None = None
) -> list[list[Keyed]]:
    """split_by_tokens over each priority's run, an interactive run cut before a big request after small
    ones (split_by_request, with `firsts`: a latency matter; bulk runs keep their groups full); bulk runs
    (priority above 0) in `bulk_tokens` groups, interactive ones in INTERACTIVE_GROUP_TOKENS (GROUP_TOKENS
    for those behind)."""
    groups: list[list[Keyed]] = []
    for run in split_by_urgency(batch):
        first = run[0][1]
        bulk = first.priority > 0
        budget = bulk_tokens if bulk else GROUP_TOKENS if first.behind else INTERACTIVE_GROUP_TOKENS
        for part in [run] if bulk else split_by_request(run, firsts or set()):
            groups += split_by_tokens(part, budget)
    return groups


def split_by_length(batch: list[Keyed], call_overhead: float = DEFAULT_CALL_OVERHEAD_TOKENS) -> list[list[Keyed]]:
    """For padded models: sort by length, then cut into the sub-batches that cost least to run.

    A forward pass costs about `call_overhead + longest x count` tokens, so one padded batch wastes
    work on padding and many tiny ones waste it on per-call overhead; the optimal contiguous
    partition of the sorted lengths is a small O(n^2) dynamic programme.
    """
    ordered = sorted(batch, key=n_tokens)
    n = len(ordered)
    lengths = [n_tokens(item) for item in ordered]
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j items
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[j - 1]  # sorted: the last item of a group is its longest
        for i in range(j):
            cost = best[i] + call_overhead + longest * (j - i)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups: list[list[Keyed]] = []
    j = n
    while j > 0:
        groups.append(ordered[cut[j] : j])
        j = cut[j]
    return groups[::-1]
