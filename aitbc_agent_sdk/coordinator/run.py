"""A whole federated training from one call: validate, hire, fund, run the rounds, pay.

Everything that can be wrong with the request is checked before anything is
written, so a bad start leaves no training in the database and no money on chain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import AitbcError, NotEnoughWorkersError, TrainingError
from ..models import (
    CheckpointRef, JobAssignment, Progress, RoundReport, Settlement, TrainingPhase, TrainingRecord, TrainingReport,
    TrainingSpec, Worker, WorkerReport,
)
from ..training import LabeledData, encode_state, load_dataset, model_spec_for
from .service import Coordinator

log = logging.getLogger(__name__)
P = TrainingPhase


@dataclass(frozen=True)
class RunRequest:
    spec: TrainingSpec
    dataset: str | Path = "digits"
    label_column: str | None = None
    min_gpu: str | None = None
    round_timeout_s: float = 600.0


async def prepare(coordinator: Coordinator, request: RunRequest) -> tuple[LabeledData, list[Worker]]:
    """All the checks that need no writes: data, model, market, money."""
    spec = request.spec
    data = await asyncio.to_thread(load_dataset, request.dataset, label_column=request.label_column)
    model_spec_for(spec.model_type, data)
    found = await coordinator.discover(min_gpu=request.min_gpu, max_price_wei=spec.max_price_wei)
    if len(found) < spec.target_workers:
        raise NotEnoughWorkersError(
            f"asked for {spec.target_workers} workers but only {len(found)} suitable providers answered")
    selected = coordinator.select(found, spec.target_workers)
    await coordinator.ensure_funds(sum(w.price for w in selected) * spec.rounds,
                                   f"{spec.target_workers} workers x {spec.rounds} rounds")
    return data, selected


async def run_training(coordinator: Coordinator, request: RunRequest) -> TrainingReport:
    started = time.perf_counter()
    data, selected = await prepare(coordinator, request)
    record = await coordinator.initialize(request.spec)
    tid = record.training_id
    try:
        await coordinator.attach_data(tid, data)
        await coordinator.create_shards(tid, len(selected))
        await asyncio.gather(*(coordinator.negotiate(w.worker_id, tid, w.price) for w in selected))
        await coordinator.fund_escrow(tid)
    except (AitbcError, asyncio.CancelledError) as exc:
        await fail_training(coordinator, tid, str(exc) or type(exc).__name__)
        raise
    settlement, compute = await drive_training(coordinator, tid, round_timeout_s=request.round_timeout_s)
    return await _report(coordinator, tid, selected, settlement.refund_tx, started, compute)


async def drive_training(coordinator: Coordinator, tid: str, *,
                         round_timeout_s: float = 600.0) -> tuple[Settlement, float]:
    """Run the remaining rounds of a funded training, then pay and refund.

    Returns the settlement and the training compute time (slowest worker per round, summed).
    Used by ``run`` in-process and by the detached coordinator daemon after ``distribute``.
    """
    try:
        record = await coordinator.db.training(tid)
        contracts = await coordinator.db.contracts(tid)
        shards = await coordinator.db.shards(tid)
        if not contracts or len(shards) != len(contracts):
            raise TrainingError(f"training {tid} needs one shard per contracted worker "
                                f"({len(shards)} shards, {len(contracts)} contracts)")
        compute = 0.0
        while record.round < record.spec.rounds:
            await coordinator.update_phase(tid, P.DISTRIBUTING)
            jobs = [await coordinator.send_job(c.worker_id, tid, shard.shard_id, record.spec.job)
                    for c, shard in zip(contracts, shards, strict=True)]
            await coordinator.update_phase(tid, P.TRAINING)
            model_cid, slowest = await _run_round(coordinator, tid, jobs, round_timeout_s)
            compute += slowest
            await coordinator.save_results(tid, model_cid)
            record = await coordinator.db.training(tid)
        settlement = await coordinator.settle(tid)
        await coordinator.update_phase(tid, P.COMPLETE)
        return settlement, compute
    except (AitbcError, asyncio.CancelledError) as exc:
        await fail_training(coordinator, tid, str(exc) or type(exc).__name__)
        raise


async def _run_round(coordinator: Coordinator, tid: str, jobs: list[JobAssignment],
                     timeout: float) -> tuple[str, float]:
    """Fold each worker's checkpoint in as it arrives; returns the new model's CID."""
    listener = await coordinator.listener(tid)
    pending = {j.job_id: j for j in jobs}
    strategy = coordinator.aggregation()
    strategy.begin()
    slowest = 0.0
    aggregating = False
    async with asyncio.timeout(timeout):
        while pending:
            item = await listener.results.get()
            if item.job_id not in pending:
                continue  # a late message from an earlier round
            if isinstance(item, Progress):
                raise TrainingError(f"worker {item.worker_id} failed job {item.job_id}: {item.error}")
            ref: CheckpointRef = await coordinator.collect_checkpoint(item.worker_id, item.job_id)
            if not aggregating:
                await coordinator.update_phase(tid, P.AGGREGATING)
                aggregating = True
            await coordinator.fold(strategy, ref, float(ref.samples))
            slowest = max(slowest, ref.train_seconds)
            del pending[item.job_id]
    model = await asyncio.to_thread(lambda: encode_state(strategy.result()))
    return await coordinator.store.add(model), slowest


async def fail_training(coordinator: Coordinator, tid: str, reason: str = "") -> None:
    """Mark the training failed and refund whatever the escrow still holds for it."""
    try:
        await coordinator.audit(tid, "training_failed", reason=reason)
        await coordinator.update_phase(tid, P.FAILED)
        if (await coordinator.db.escrow(tid)) is not None:
            refunded, tx = await coordinator.escrow.refund(tid)
            await coordinator.audit(tid, "refund", amount_wei=refunded, tx=tx, after="failure")
            await coordinator.db.save_escrow(tid, await coordinator.escrow.summary(tid))
    except AitbcError as exc:  # keep the original error; note the cleanup failure
        log.error("cleanup of failed training %s: %s", tid, exc)


async def _report(coordinator: Coordinator, tid: str, selected: list[Worker], refund_tx: str | None,
                  started: float, compute: float) -> TrainingReport:
    record: TrainingRecord = await coordinator.db.training(tid)
    rounds = await coordinator.db.rounds(tid)
    accepted = await coordinator.db.checkpoints(tid, "accepted")
    payments = await coordinator.db.payments(tid)
    escrow = await coordinator.escrow.summary(tid)
    by_worker = {w.worker_id: w for w in selected}
    workers = []
    for contract in await coordinator.db.contracts(tid):
        mine = [c for c in accepted if c.worker_id == contract.worker_id]
        paid = [p for p in payments if p.worker_id == contract.worker_id]
        workers.append(WorkerReport(
            address=contract.worker_id, samples=max((c.samples for c in mine), default=0),
            rounds_accepted=len({c.round for c in mine}), paid_wei=sum(p.amount_wei for p in paid),
            tx_hash=paid[-1].tx_hash if paid else None, status="paid" if paid else "unpaid",
            price_wei=contract.price_wei, gpu_type=by_worker[contract.worker_id].gpu_type))
    round_reports = tuple(
        RoundReport(round=r.round, accuracy=r.accuracy, loss=r.loss, model_cid=r.model_cid,
                    worker_losses={c.worker_id: c.loss for c in accepted if c.round == r.round})
        for r in rounds)
    assert record.model_cid is not None and record.manifest_cid is not None
    return TrainingReport(
        training_id=tid, status=record.phase, final_accuracy=rounds[-1].accuracy, model_cid=record.model_cid,
        manifest_cid=record.manifest_cid, rounds=round_reports, workers=tuple(workers), escrow=escrow,
        refund_tx=refund_tx, wall_seconds=time.perf_counter() - started, compute_seconds=compute)
