"""Per-training listener: persists progress and results as they arrive and hands results on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..errors import NotFoundError
from ..messaging import SignedChannel, topics
from ..models import CheckpointRef, JobResult, Progress
from .store import TrainingStore

log = logging.getLogger(__name__)

Observer = Callable[[object], None]


class TrainingListener:
    def __init__(self, channel: SignedChannel, db: TrainingStore, training_id: str,
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

    async def start(self) -> None:
        ready = [asyncio.Event(), asyncio.Event()]
        self._tasks = [asyncio.create_task(self._progress(ready[0])), asyncio.create_task(self._results(ready[1]))]
        await asyncio.gather(*(e.wait() for e in ready))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _notify(self, event: object) -> None:
        if self._observer is not None:
            self._observer(event)

    async def _sender_owns_job(self, sender: str, job_id: str, worker_id: str) -> bool:
        try:
            job = await self._db.job(job_id)
        except NotFoundError:
            return False
        return sender == worker_id == job.worker_id and job.training_id == self.training_id

    async def _progress(self, ready: asyncio.Event) -> None:
        async with self._channel.subscribe(topics.all_progress(self.training_id), Progress) as stream:
            ready.set()
            async for verified in stream:
                progress = verified.message
                if not await self._sender_owns_job(verified.sender, progress.job_id, progress.worker_id):
                    log.warning("progress for %s from %s ignored", progress.job_id, verified.sender)
                    continue
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
                result = verified.message
                if not await self._sender_owns_job(verified.sender, result.job_id, result.worker_id):
                    log.warning("result for %s from %s ignored", result.job_id, verified.sender)
                    continue
                ref = CheckpointRef(
                    checkpoint_id=result.checkpoint_cid, cid=result.checkpoint_cid, job_id=result.job_id,
                    worker_id=result.worker_id, training_id=result.training_id, round=result.round,
                    samples=result.samples, loss=result.loss, train_seconds=result.train_seconds,
                    signature=result.signature)
                self.last_heard[result.worker_id] = time.monotonic()
                self._notify(result)
                await self._db.save_checkpoint(ref, "received")
                await self.results.put(ref)
