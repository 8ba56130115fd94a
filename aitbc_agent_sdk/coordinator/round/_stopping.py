"""Stopping a training the user (or a signal) ended: the open round's jobs cancelled, the accepted work paid, the
rest refunded, the training marked failed. ``stop``, Ctrl-C on ``run`` and a cancelled ``run_training`` share it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ...records import TrainingPhase, TrainingRecord

if TYPE_CHECKING:  # `stop` reads STOPPED_REASON without importing the chain and bus clients
    from ..money._money import EscrowSteps
    from ..money._settlement import EscrowAccount
    from .._training_db import TrainingDatabase
    from ._reassign import Reassigner

STOPPED_REASON = "stopped by the user"


async def settle_stopped(training_id: str, *, db: TrainingDatabase, escrow: EscrowAccount, money: EscrowSteps,
                         reassign: Reassigner, update_phase: Callable[[str, TrainingPhase], Awaitable[TrainingRecord]]
                         ) -> tuple[int, int, str | None]:
    """Cancel the open round's jobs, settle what was earned, mark the training failed: (paid, refunded, tx)."""
    record = await db.training(training_id)
    await reassign.audit.append("training_stopped", round=record.round, phase=record.phase.value)
    paid = refunded = 0
    tx = None
    if await db.escrow(training_id) is not None:
        await reassign.reconcile()  # a crash mid-replacement: the chain decides
        for job in await db.jobs(training_id, record.round + 1):
            if await db.checkpoint(job.job_id) is None:
                await reassign.cancel_job(job.worker_id, job.job_id, STOPPED_REASON)
        state = await escrow.state(training_id)
        if state.exists and not state.closed:
            settlement = await money.settle(training_id)
            paid, refunded, tx = settlement.escrow.paid_wei, settlement.refund_wei, settlement.refund_tx
    await reassign.audit.append("training_failed", reason=STOPPED_REASON)
    await update_phase(training_id, TrainingPhase.FAILED)
    return paid, refunded, tx
