"""Asking a worker to re-send a checkpoint the coordinator could not fetch: one signed request per job, then
a deadline."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from ...errors import AitbcError
from ...messaging import SignedChannel, topics
from ...records import CheckpointRef, ResendRequest
from ...records._base import clipped
from .._logbook import AuditSink
from .._training_db import TrainingDatabase
from ..checks._verification import Inspection

log = logging.getLogger(__name__)


class ResendRequests:
    """One round's requests to re-send. Which jobs still wait for a result is the round's to say
    (:meth:`overdue` asks); rejecting a result that came too late is the round's too."""

    def __init__(self, *, training_id: str, round: int, timeout_s: float, channel: SignedChannel,
                 db: TrainingDatabase, audit: AuditSink) -> None:
        self.training_id = training_id
        self.round = round
        self.timeout_s = timeout_s
        self._channel, self._db, self._audit = channel, db, audit
        self._open: dict[str, tuple[float, CheckpointRef, Inspection]] = {}  # job -> (deadline, result, verdict)
        self._asked: set[str] = set()  # jobs asked once already: a second failure is rejected, not asked again

    def may_ask(self, job_id: str) -> bool:
        return job_id not in self._asked

    def answered(self, job_id: str) -> None:
        """A result of ``job_id`` arrived: no deadline runs on it any more, whatever it holds."""
        self._open.pop(job_id, None)

    async def ask(self, ref: CheckpointRef, inspection: Inspection) -> None:
        """One signed request to upload the checkpoint again before the work is reassigned."""
        assert inspection.problem is not None
        self._asked.add(ref.job_id)
        self._open[ref.job_id] = (time.monotonic() + self.timeout_s, ref, inspection)
        await self._db.save_strike(self.training_id, ref.worker_id, ref.job_id, inspection.problem)
        await self._audit.append("resend_requested", worker=ref.worker_id, job_id=ref.job_id, cid=ref.cid,
                                 round=self.round, reason=inspection.problem, deadline_s=self.timeout_s)
        try:
            await self._channel.publish(topics.resend(ref.worker_id), ResendRequest(
                job_id=ref.job_id, training_id=self.training_id, cid=ref.cid, reason=clipped(inspection.problem),
                deadline_s=self.timeout_s))
        except AitbcError as exc:
            log.warning("resend request for %s not sent: %s", ref.job_id, exc)

    def overdue(self, now: float, waiting: Callable[[str], bool]) -> Iterator[tuple[CheckpointRef, Inspection]]:
        """Requests past their deadline, each with the verdict to reject its result with. A job that no longer
        ``waiting`` for a result (dropped, or its shard has one) is forgotten. Lazy: the round may reject
        one before ``waiting`` is asked about the next."""
        for job_id, (deadline, ref, inspection) in list(self._open.items()):
            if not waiting(job_id):
                self._open.pop(job_id, None)
            elif now > deadline:
                self._open.pop(job_id, None)
                yield ref, Inspection(ref.job_id, ref.worker_id, ref.cid, f"{inspection.problem}, and not re-sent "
                                      f"within {self.timeout_s:g}s", fetched=False)
