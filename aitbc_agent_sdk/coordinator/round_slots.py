"""A round's shard slots, and asking a worker to re-send a checkpoint the coordinator could not fetch."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..errors import AitbcError
from ..messaging import topics
from ..models import CheckpointRef, FaultPolicy, JobAssignment, ResendRequest, Shard, WorkerContract
from ..models.base import clipped
from .logbook import AuditSink
from .service import Coordinator
from .verification import Inspection

log = logging.getLogger(__name__)


@dataclass
class ShardSlot:
    shard: Shard
    contract: WorkerContract  # the holder's: the worker whose escrow slot pays for this shard
    jobs: dict[str, JobAssignment] = field(default_factory=dict)  # live jobs on the shard
    sent_at: dict[str, float] = field(default_factory=dict)
    winner: Inspection | None = None
    winner_ref: CheckpointRef | None = None
    finished_s: float | None = None  # how long the winning job took
    judged: bool = False  # the winner also passed the round's norm check and its spot check
    verifying: bool = False  # the winner passed the norm check; its spot check runs
    short: str | None = None  # missing work found by the norm: rejected after its spot check says if it lied
    straggling: bool = False  # a spare runs a speculative copy of the holder's job
    reported: bool = False  # the holder was reported as a straggler
    market_tried: bool = False  # a spare for its copy was looked for on the market

    @property
    def holder(self) -> str:
        return self.contract.worker_id

    def job_of(self, worker: str) -> JobAssignment | None:
        return next((j for j in self.jobs.values() if j.worker_id == worker), None)


class Resends:
    """Mixed into :class:`~.rounds.RoundRunner`: one signed request to re-send, then a deadline."""

    c: Coordinator
    tid: str
    round: int
    policy: FaultPolicy
    audit: AuditSink
    resends: dict[str, tuple[float, CheckpointRef, Inspection]]  # job -> (deadline, result, verdict)
    asked: set[str]  # jobs already asked once to re-send

    def _slot_of(self, job_id: str) -> ShardSlot | None:
        raise NotImplementedError

    async def _reject(self, slot: ShardSlot, ref: CheckpointRef, inspection: Inspection) -> None:
        raise NotImplementedError

    async def _ask_resend(self, ref: CheckpointRef, inspection: Inspection) -> None:
        """One signed request to upload the checkpoint again before the work is reassigned."""
        assert inspection.problem is not None
        self.asked.add(ref.job_id)
        self.resends[ref.job_id] = (time.monotonic() + self.policy.resend_timeout_s, ref, inspection)
        await self.c.db.save_strike(self.tid, ref.worker_id, ref.job_id, inspection.problem)
        await self.audit.append("resend_requested", worker=ref.worker_id, job_id=ref.job_id, cid=ref.cid,
                                round=self.round, reason=inspection.problem, deadline_s=self.policy.resend_timeout_s)
        try:
            await self.c.channel.publish(topics.resend(ref.worker_id), ResendRequest(
                job_id=ref.job_id, training_id=self.tid, cid=ref.cid, reason=clipped(inspection.problem),
                deadline_s=self.policy.resend_timeout_s))
        except AitbcError as exc:
            log.warning("resend request for %s not sent: %s", ref.job_id, exc)

    async def _check_resends(self) -> None:
        now = time.monotonic()
        for job_id, (deadline, ref, inspection) in list(self.resends.items()):
            slot = self._slot_of(job_id)
            if slot is None or slot.winner is not None:
                del self.resends[job_id]
            elif now > deadline:
                del self.resends[job_id]
                late = Inspection(ref.job_id, ref.worker_id, ref.cid, f"{inspection.problem}, and not re-sent within "
                                  f"{self.policy.resend_timeout_s:g}s", fetched=False)
                await self._reject(slot, ref, late)
