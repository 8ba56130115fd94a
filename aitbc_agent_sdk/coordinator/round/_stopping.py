"""Stopping a training the user (or a signal) ended: the open round's jobs cancelled, the accepted work paid, the
rest refunded, the training marked failed. ``stop``, Ctrl-C on ``run`` and a cancelled ``run_training`` share it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...records import TrainingPhase

if TYPE_CHECKING:
    from .._service import Coordinator

STOPPED_REASON = "stopped by the user"


async def wind_down(coordinator: Coordinator, training_id: str) -> tuple[int, int, str | None]:
    """Cancel the open round's jobs, settle what was earned, mark the training failed."""
    from ._reassign import reassigner_for  # the chain and bus clients: only when a training stops

    reassign = reassigner_for(coordinator, training_id)
    record = await coordinator.db.training(training_id)
    await reassign.audit.append("training_stopped", round=record.round, phase=record.phase.value)
    paid = refunded = 0
    tx = None
    if await coordinator.db.escrow(training_id) is not None:
        await reassign.reconcile()  # a crash mid-replacement: the chain decides
        for job in await coordinator.db.jobs(training_id, record.round + 1):
            if await coordinator.db.checkpoint(job.job_id) is None:
                await reassign.cancel_job(job.worker_id, job.job_id, STOPPED_REASON)
        state = await coordinator.escrow.state(training_id)
        if state.exists and not state.closed:
            settlement = await coordinator.money.settle(training_id)
            paid, refunded, tx = settlement.escrow.paid_wei, settlement.refund_wei, settlement.refund_tx
    await reassign.audit.append("training_failed", reason=STOPPED_REASON)
    await coordinator.update_phase(training_id, TrainingPhase.FAILED)
    return paid, refunded, tx
