"""Per-training listener: persists progress and results as they arrive and hands results on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import NotFoundError
from ..messaging import SignedChannel, Verified, topics
from ..records import CheckpointRef, JobResult, Progress, TrajectoryOpening, VerifyReport
from ._training_db import TrainingDatabase

log = logging.getLogger(__name__)

Observer = Callable[[object], None]


class TrainingListener:
    def __init__(self, channel: SignedChannel, db: TrainingDatabase, training_id: str,
                 observer: Observer | None = None) -> None:
        self._channel = channel
        self._db = db
        self.training_id = training_id
        self._observer = observer
        # Results and failures in arrival order, for a round loop that folds them in as they come.
        self.results: asyncio.Queue[CheckpointRef | Progress] = asyncio.Queue()
        self.latest: dict[str, Progress] = {}  # job id -> its latest progress
        self.last_heard: dict[str, float] = {}  # worker -> monotonic time of its latest message here
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped: Counter[str] = Counter()  # messages that failed while handled, by "stream: error"
        self._openings: dict[str, asyncio.Future[TrajectoryOpening]] = {}  # job id -> a spot check waiting
        # request id -> (the verifier hired, a verification waiting for its report)
        self._reports: dict[str, tuple[str, asyncio.Future[VerifyReport]]] = {}

    async def start(self) -> None:
        ready = [asyncio.Event() for _ in range(4)]
        self._tasks = [asyncio.create_task(self._progress(ready[0])), asyncio.create_task(self._results(ready[1])),
                       asyncio.create_task(self._opened(ready[2])), asyncio.create_task(self._verified(ready[3]))]
        await asyncio.gather(*(e.wait() for e in ready))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _notify(self, event: object) -> None:
        if self._observer is not None:
            self._observer(event)

    def expect_opening(self, job_id: str) -> asyncio.Future[TrajectoryOpening]:
        """A future for the job's next trajectory opening (made before the challenge goes out)."""
        self.forget_opening(job_id)
        waiting: asyncio.Future[TrajectoryOpening] = asyncio.get_running_loop().create_future()
        self._openings[job_id] = waiting
        return waiting

    def forget_opening(self, job_id: str) -> None:
        waiting = self._openings.pop(job_id, None)
        if waiting is not None and not waiting.done():
            waiting.cancel()

    def expect_report(self, request_id: str, verifier: str) -> asyncio.Future[VerifyReport]:
        """A future for the report of verification ``request_id`` from ``verifier`` (made before it is asked)."""
        self.forget_report(request_id)
        waiting: asyncio.Future[VerifyReport] = asyncio.get_running_loop().create_future()
        self._reports[request_id] = (verifier, waiting)
        return waiting

    def forget_report(self, request_id: str) -> None:
        _, waiting = self._reports.pop(request_id, ("", None))
        if waiting is not None and not waiting.done():
            waiting.cancel()

    async def _verified(self, ready: asyncio.Event) -> None:
        async with self._channel.subscribe(topics.verified(self.training_id), VerifyReport) as stream:
            ready.set()
            async for verified in stream:
                await self._each("verifications", self._on_report, verified)

    async def _on_report(self, verified: Verified[VerifyReport]) -> None:
        """Only the report a verification waits for, signed by the verifier it hired, is handed on."""
        report = verified.message
        verifier, waiting = self._reports.get(report.request_id, ("", None))
        if (waiting is None or waiting.done() or verified.sender != verifier or report.verifier_id != verifier
                or report.training_id != self.training_id):
            log.warning("verification report %s from %s ignored", report.request_id, verified.sender)
            return
        self.last_heard[verifier] = time.monotonic()
        del self._reports[report.request_id]
        waiting.set_result(report)

    async def _sender_owns_job(self, sender: str, message: Progress | JobResult | TrajectoryOpening) -> bool:
        try:
            job = await self._db.job(message.job_id)
        except NotFoundError:
            return False
        return (sender == message.worker_id == job.worker_id and job.training_id == message.training_id
                == self.training_id and job.round == message.round)

    async def _each(self, stream: str, handle: Callable[[Verified[Any]], Awaitable[None]],
                    verified: Verified[Any]) -> None:
        """One message's failure is logged, counted and dropped: the listener keeps listening."""
        try:
            await handle(verified)
        except Exception as exc:
            self.dropped[f"{stream}: {type(exc).__name__}"] += 1
            log.warning("%s from %s dropped: %s", stream, verified.sender, exc)

    async def _progress(self, ready: asyncio.Event) -> None:
        async with self._channel.subscribe(topics.all_progress(self.training_id), Progress) as stream:
            ready.set()
            async for verified in stream:
                await self._each("progress", self._on_progress, verified)

    async def _on_progress(self, verified: Verified[Progress]) -> None:
        progress = verified.message
        if not await self._sender_owns_job(verified.sender, progress):
            log.warning("progress for %s from %s ignored", progress.job_id, verified.sender)
            return
        self.latest[progress.job_id] = progress
        self.last_heard[progress.worker_id] = time.monotonic()
        await self._db.save_progress(progress)
        self._notify(progress)
        if progress.status == "failed":
            await self.results.put(progress)

    async def _results(self, ready: asyncio.Event) -> None:
        async with self._channel.subscribe(topics.results(self.training_id), JobResult) as stream:
            ready.set()
            async for verified in stream:
                await self._each("results", self._on_result, verified)

    async def _opened(self, ready: asyncio.Event) -> None:
        async with self._channel.subscribe(topics.openings(self.training_id), TrajectoryOpening) as stream:
            ready.set()
            async for verified in stream:
                await self._each("openings", self._on_opening, verified)

    async def _on_opening(self, verified: Verified[TrajectoryOpening]) -> None:
        """Only an opening a spot check waits for, from the job's own worker, is handed on."""
        opening = verified.message
        waiting = self._openings.get(opening.job_id)
        if waiting is None or waiting.done() or not await self._sender_owns_job(verified.sender, opening):
            log.warning("trajectory opening for %s from %s ignored", opening.job_id, verified.sender)
            return
        self.last_heard[opening.worker_id] = time.monotonic()
        del self._openings[opening.job_id]
        waiting.set_result(opening)

    async def _on_result(self, verified: Verified[JobResult]) -> None:
        result = verified.message
        if not await self._sender_owns_job(verified.sender, result):
            log.warning("result for %s from %s ignored", result.job_id, verified.sender)
            return
        if (found := await self._db.checkpoint(result.job_id)) is not None and found[1] != "received":
            log.warning("result for %s, already %s, ignored", result.job_id, found[1])
            return  # a verdict stands: a re-sent result must not reopen it
        ref = CheckpointRef(
            checkpoint_id=result.checkpoint_cid, cid=result.checkpoint_cid, job_id=result.job_id,
            worker_id=result.worker_id, training_id=result.training_id, round=result.round,
            samples=result.samples, loss=result.loss, train_seconds=result.train_seconds,
            signature=result.signature, task_state=result.task_state)
        self.last_heard[result.worker_id] = time.monotonic()
        self._notify(result)
        await self._db.save_checkpoint(ref, "received")
        await self.results.put(ref)
