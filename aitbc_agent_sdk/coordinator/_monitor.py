"""A read-only snapshot of a training from SQLite, for ``monitor`` in any shell at any time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..records import (EscrowSummary, Payment, Progress, RoundMetrics, TrainingCost, TrainingPhase, VerificationSpend,
                       id_path)
from ..audit import AuditEntry, read_log
from ._training_db import TrainingDatabase


POOL_EVENTS = ("worker_added", "worker_released", "rebalanced", "scale_up_refused", "worker_replaced",
               "worker_failed", "result_rejected", "straggler_detected", "speculative_job",
               "resend_requested", "spot_check", "held_for_checking", "hardware_flagged", "slashed", "dispute",
               "verifier_wrong", "verifiers_paid", "training_failed")


class WorkerView(BaseModel):
    worker_id: str
    role: str = "worker"
    round: int
    status: str
    epoch: int
    epochs: int
    progress: float
    loss: float | None
    samples_per_s: float | None
    paid_wei: int


class Snapshot(BaseModel):
    training_id: str
    phase: TrainingPhase
    round: int
    rounds: int
    model_type: str
    workers: list[WorkerView]
    round_metrics: list[RoundMetrics]
    payments: list[Payment]
    escrow: EscrowSummary | None
    target_throughput: float | None = None  # elastic pools: samples/s the pool is sized for
    events: list[dict[str, Any]] = []  # scaling, rebalancing and fault events from the audit log
    verification: VerificationSpend | None = None  # what the spot checks so far cost, apart from training
    failure: str | None = None  # why it failed, from the audit log (a failed training only)
    cost: TrainingCost | None = None  # spent so far (receipts and payments), per round and worker, projected

    @property
    def finished(self) -> bool:
        return self.phase in (TrainingPhase.COMPLETE, TrainingPhase.FAILED)


async def snapshot(db: TrainingDatabase, training_id: str, audit_dir: Path | None = None, *,
                   entries: Sequence[AuditEntry] | None = None) -> Snapshot:
    """The training as ``monitor`` shows it; ``entries``: its audit log when the caller has read it already
    (the dashboard shows the log too, and reads it once), else it is read from ``audit_dir``."""
    record = await db.training(training_id)
    payments = await db.payments(training_id)
    latest: dict[str, Progress] = {}
    jobs = await db.jobs(training_id)
    for job in jobs:  # ordered by round: the last job per worker wins
        progress = await db.progress(job.job_id)
        latest[job.worker_id] = progress or Progress(
            job_id=job.job_id, training_id=training_id, worker_id=job.worker_id, round=job.round,
            status="assigned", epoch=0, epochs=job.config.epochs, progress=0.0)
    logged = _logged(audit_dir, training_id, (*POOL_EVENTS, "receipt_sent"), entries)
    events = [e for e in logged if e["event"] in POOL_EVENTS]
    workers = []
    for contract in await db.contracts(training_id):
        p = latest.get(contract.worker_id)
        workers.append(WorkerView(
            worker_id=contract.worker_id, role=contract.role, round=p.round if p else 0, status=p.status if p else "contracted",
            epoch=p.epoch if p else 0, epochs=record.spec.job.epochs, progress=p.progress if p else 0.0,
            loss=p.loss if p else None, samples_per_s=p.samples_per_s if p else None,
            paid_wei=sum(pay.amount_wei for pay in payments if pay.worker_id == contract.worker_id)))
    escrow = await db.escrow(training_id)
    cost = TrainingCost.of(rounds_done=record.round, rounds=record.spec.rounds,
                           finished=record.phase in (TrainingPhase.COMPLETE, TrainingPhase.FAILED),
                           deposit_wei=escrow.deposited_wei if escrow else None,
                           payments=[(p.worker_id, p.amount_wei) for p in payments],
                           receipts=[e for e in logged if e["event"] == "receipt_sent"])
    return Snapshot(training_id=training_id, phase=record.phase, round=record.round, rounds=record.spec.rounds,
                    model_type=record.spec.model_type, workers=workers, round_metrics=await db.rounds(training_id),
                    payments=payments, escrow=escrow, cost=cost,
                    target_throughput=record.spec.elastic.target_samples_per_s if record.spec.elastic else None,
                    events=events, verification=await _verification(db, training_id, events),
                    failure=_failure(record.phase, events))


def _failure(phase: TrainingPhase, events: list[dict[str, Any]]) -> str | None:
    if phase is not TrainingPhase.FAILED:
        return None
    reasons = [str(e.get("reason") or "no reason recorded") for e in events if e["event"] == "training_failed"]
    return reasons[-1] if reasons else "no reason recorded (no audit log here)"


async def _verification(db: TrainingDatabase, training_id: str, events: list[dict[str, Any]]
                        ) -> VerificationSpend | None:
    """The spot checks so far, priced; the checkpoints are read only when there is a check to price."""
    checks = [e for e in events if e["event"] == "spot_check"]
    if not checks:
        return None
    trained = {c.job_id: c.train_seconds for c in await db.checkpoints(training_id, None)}
    return VerificationSpend.of_checks(checks, trained, [e for e in events if e["event"] == "verifiers_paid"])


def pool_events(audit_dir: Path | None, training_id: str, also: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The audit log's scaling, rebalancing and fault events (and those ``also`` named), oldest first (none
    without a log)."""
    return _logged(audit_dir, training_id, (*POOL_EVENTS, *also))


def _logged(audit_dir: Path | None, training_id: str, kinds: tuple[str, ...],
            entries: Sequence[AuditEntry] | None = None) -> list[dict[str, Any]]:
    """The audit log's events of those kinds, each flat (event, ts, fields), oldest first (none without a log)."""
    if entries is None:
        path = id_path(audit_dir, training_id) / "audit.jsonl" if audit_dir else None
        if path is None or not path.exists():
            return []
        entries = read_log(path)
    return [{"event": e.event, "ts": e.ts, **e.fields} for e in entries if e.event in kinds]
