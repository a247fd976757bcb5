"""BatchRunner — the Batch API's jobs, run one after another in the HTTP process, each line through its
route's own prepare and render (server/core/internal.py) at bulk priority, so interactive requests
go first (admission keeps them their reserve; engines take more urgent inputs between groups).

A job runs in groups of lines, WARMPOOL_BATCH_CONCURRENCY lines at once, the next group's lines
starting as the last of one's run (no gap at each group's end): a group's answers are written and
committed together (store.append), in input order. A job the server stopped (a restart, a
crash) is resumed at the next start from its last committed group. A folder that cannot be written
fails the job with the reason; the server serves on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import time
from pathlib import Path
from typing import Any

import structlog

from server.batches import lines
from server.batches.endpoints import ENDPOINTS, Endpoint
from server.batches.progress import RunningJob
from server.batches.space import NoRoom
from server.batches.states import StateError
from server.batches.store import BatchStore, Owner, Progress
from server.core.internal import Answer, answer_body
from server.core.services import Services
from server.http.errors import APIError, ClientDisconnected, response_for
from server.tenants.guard import pass_for

log = structlog.get_logger("warmpool.batches")

Ran = tuple[bytes, bytes, int, int, int] | None  # a group's output and error lines, counts, tokens; None: cancelled

BATCH_PRIORITY = 1000  # bulk: above 0, so interactive requests (0, or their own priority) go first
GROUP_PER_LINE_AT_ONCE = 4  # a group is this many times the lines run at once: one fsync per group
GROUPS_AHEAD = 2  # groups running at once: the next one's lines start as the last of one's run
SWEEP_S = 600.0  # how often files and jobs past WARMPOOL_BATCH_RETENTION are looked for
RETRY_MAX_S = 1.0  # a line refused for a full server (429) or no engine (503) is tried again, backing off to this
# A line up to this long is prepared and rendered on the loop, as gRPC's short messages are
# (server/grpc/calls.py): less CPU than the two executor hops around it. The HTTP process took 0.15
# of 2 Zen 5 cores during a job instead of 0.21, the engines the rest: 1.03x the lines/s. Never while
# a model that reads images serves: an image is fetched and decoded off the loop (prepare_in_time).
LOOP_LINE_BYTES = 1024


class BatchRunner:
    def __init__(self, svc: Services) -> None:
        settings = svc.settings
        self.svc = svc
        self.store = BatchStore(Path(settings.batch_dir), settings.batch_retention, settings.batch_max_bytes)
        self.concurrency = settings.batch_concurrency
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stops: dict[str, asyncio.Future[None]] = {}  # running job -> done when it is to stop
        self.running: RunningJob | None = None  # the job whose lines run now

    def progress(self) -> dict[str, Any] | None:
        """The running job's progress (None when none runs): /status and /health/startup show it."""
        running = self.running
        return None if running is None else running.as_dict()

    def start(self) -> None:
        """Run (and resume) jobs from now on: at the server's start, and at the first batch request."""
        if self._task is None or self._task.done():
            # a context of its own: not the log fields (request id) of the request that started it
            self._task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    def wake(self) -> None:
        self.start()
        self._wake.set()

    def cancel(self, batch_id: str) -> None:
        """The job (moved to cancelling) stops: lines in flight are dropped, its group not written."""
        stop = self._stops.get(batch_id)
        if stop is not None and not stop.done():
            stop.set_result(None)
        self.wake()

    async def stop(self) -> None:
        """The server stops: the running job's uncommitted group is dropped; it resumes at the next start."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        swept = float("-inf")
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            try:
                if loop.time() - swept > SWEEP_S:
                    swept = loop.time()
                    await self.svc.off_loop(self.store.sweep, time.time())
                for batch_id in await self.svc.off_loop(self.store.unfinished):
                    await self._job(batch_id)
            except Exception as exc:  # an unusable folder: the batch routes say so
                log.error("batch_runner_error", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), SWEEP_S)

    async def _job(self, batch_id: str) -> None:
        stop = asyncio.get_running_loop().create_future()
        self._stops[batch_id] = stop
        try:
            await self._drive(batch_id, stop)
        except NoRoom as exc:
            await self._fail(batch_id, exc.code, f"the job's output could not be written: {exc}")
        except OSError as exc:
            await self._fail(batch_id, "batch_dir_unwritable", f"the batch folder could not be written: {exc}")
        finally:
            self._stops.pop(batch_id, None)
            self.running = None
            self._show_progress()

    async def _drive(self, batch_id: str, stop: asyncio.Future[None]) -> None:
        off_loop, store = self.svc.off_loop, self.store
        record = await off_loop(store.batch, batch_id)
        assert record is not None
        if record["status"] == "cancelling":
            await self._cancelled(batch_id)
            return
        if record["status"] == "finalizing":
            await self._completed(batch_id)
            return
        source = store.file_path(record["input_file_id"])
        found = await off_loop(lines.scan, source)
        if record["status"] == "validating":
            counts = {"total": found.total, "completed": 0, "failed": 0}
            record = await off_loop(store.move, batch_id, "in_progress", request_counts=counts)
        endpoint = ENDPOINTS[record["endpoint"]]
        whose = await off_loop(store.owner, batch_id)
        progress = await off_loop(store.reopen, batch_id)
        log.info("batch_running", batch=batch_id, line=progress.next_line, total=found.total)
        failed_before = record["request_counts"]["failed"]
        running = self.running = RunningJob(batch_id, found.total, progress.next_line, failed_before)
        self._show_progress()
        # across groups: the next one's lines fill what one frees; within the permits bulk work may take
        # (a smaller server's lines would only be refused and retried)
        at_once = asyncio.Semaphore(min(self.concurrency, self.svc.admission.bulk_capacity))
        ahead: collections.deque[tuple[asyncio.Future[Ran], int, int]] = collections.deque()  # (its run, offset, lines)
        read_line, read_offset = progress.next_line, progress.in_offset
        try:
            while not stop.done():
                # the next group starts while this one's last lines run and it is written: no gap between groups
                while len(ahead) < GROUPS_AHEAD and read_line < found.total:
                    if time.time() > record["expires_at"]:
                        await self._expired(batch_id)  # groups not written are dropped
                        return
                    group, read_offset = await off_loop(lines.read_group, source, read_offset, self.group_size)
                    run = self._group(record["endpoint"], endpoint, group, read_line, found, whose, stop, at_once)
                    ahead.append((asyncio.ensure_future(run), read_offset, len(group)))
                    read_line += len(group)
                if not ahead:
                    break
                task, in_offset, count = ahead.popleft()
                answered = await task
                if answered is None:
                    break  # cancelled: the group's answers are dropped
                output, errors, ok, failed, tokens = answered
                progress = Progress(
                    in_offset,
                    progress.next_line + count,
                    progress.out_offset + len(output),
                    progress.err_offset + len(errors),
                )
                await off_loop(store.append, batch_id, progress, output, errors, ok, failed, tokens)
                self.svc.metrics.batch_lines.labels(state="completed").inc(ok)
                self.svc.metrics.batch_lines.labels(state="failed").inc(failed)
                running.advance(ok, failed)
                self._show_progress()
        finally:
            for task, _, _ in ahead:
                task.cancel()
            await asyncio.gather(*(task for task, _, _ in ahead), return_exceptions=True)
        try:
            await off_loop(store.move, batch_id, "finalizing")
        except StateError:  # cancelled meanwhile
            await self._cancelled(batch_id)
            return
        await self._completed(batch_id)

    def _show_progress(self) -> None:
        """The running job's lines as gauges (0 when none runs); their rate is warmpool_batch_lines_total's."""
        running = self.running
        gauge = self.svc.metrics.batch_running_lines
        gauge.labels(count="total").set(0 if running is None else running.total)
        gauge.labels(count="done").set(0 if running is None else running.done)

    @property
    def group_size(self) -> int:
        return self.concurrency * GROUP_PER_LINE_AT_ONCE

    async def _group(
        self,
        url: str,
        endpoint: Endpoint,
        group: list[bytes],
        first: int,
        found: lines.Scan,
        whose: Owner,
        stop: asyncio.Future[None],
        at_once: asyncio.Semaphore,
    ) -> Ran:
        """The group's output and error lines, their counts and the answered lines' prompt tokens; None if
        the job was cancelled. Its lines run `at_once` at a time, with the next group's."""
        checked = await self.svc.off_loop(
            lambda: [lines.check(raw, first + i, url, found.duplicates) for i, raw in enumerate(group)]
        )

        async def run(line: lines.Line) -> Answer | None:
            if line.error is not None:
                return None
            async with at_once:
                return await self._line(endpoint, line.body, whose, stop)

        try:
            answers = await asyncio.gather(*(run(line) for line in checked))
        except ClientDisconnected:
            return None
        return await self.svc.off_loop(_assembled, checked, answers)

    async def _line(self, endpoint: Endpoint, body: bytes, whose: Owner, stop: asyncio.Future[None]) -> Answer:
        """The route's answer, within the job's tenant's models and quota; a full server, no engine or
        the tenant's quota for now is waited out (the job's lines are bulk)."""
        delay = 0.05
        while True:
            try:
                tenant = pass_for(self.svc.key_source, whose.tenant)  # the keys file as it is now
            except LookupError:
                gone = APIError(
                    403, f"the job's tenant '{whose.tenant}' is no longer in the keys file", code="tenant_gone"
                )
                return Answer(gone.status, bytes(response_for(gone).body))
            images = any(model.folder.vision is not None for model in self.svc.models.values())
            short = len(body) <= LOOP_LINE_BYTES and not images
            answer = await answer_body(
                self.svc, endpoint.prepare, endpoint.render, body, BATCH_PRIORITY, stop, tenant, short
            )
            if not answer.transient:
                return answer
            await asyncio.wait([stop], timeout=delay)
            if stop.done():
                raise ClientDisconnected()
            delay = min(delay * 2, RETRY_MAX_S)

    async def _completed(self, batch_id: str) -> None:
        files = await self.svc.off_loop(self.store.publish, batch_id)
        record = await self.svc.off_loop(self.store.move, batch_id, "completed", **files)
        log.info("batch_completed", batch=batch_id, **record["request_counts"])

    async def _cancelled(self, batch_id: str) -> None:
        files = await self.svc.off_loop(self.store.publish, batch_id)
        await self.svc.off_loop(self.store.move, batch_id, "cancelled", **files)
        log.info("batch_cancelled", batch=batch_id)

    async def _expired(self, batch_id: str) -> None:
        files = await self.svc.off_loop(self.store.publish, batch_id)
        await self.svc.off_loop(self.store.move, batch_id, "expired", **files)
        log.info("batch_expired", batch=batch_id)

    async def _fail(self, batch_id: str, code: str, reason: str) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": reason}]}
        log.error("batch_failed", batch=batch_id, reason=reason)
        try:
            await self.svc.off_loop(self.store.move, batch_id, "failed", errors=errors)
        except Exception as exc:  # the database itself is out of reach: logged, the server serves on
            log.error("batch_state_unwritable", batch=batch_id, error=repr(exc))


def _assembled(checked: list[lines.Line], answers: list[Answer | None]) -> tuple[bytes, bytes, int, int, int]:
    """Output lines (answered 2xx) and error lines (refused, or never sent), in input order, and the
    output lines' prompt tokens (the job's usage)."""
    output: list[bytes] = []
    errors: list[bytes] = []
    tokens = 0
    for line, answer in zip(checked, answers, strict=True):
        if answer is None:
            assert line.error is not None
            errors.append(lines.error_line(line.custom_id, *line.error))
            continue
        assert line.custom_id is not None
        answered = 200 <= answer.status < 300
        (output if answered else errors).append(lines.answer_line(line.custom_id, answer.status, answer.body))
        tokens += answer.tokens if answered else 0
    return b"".join(output), b"".join(errors), len(output), len(errors), tokens
