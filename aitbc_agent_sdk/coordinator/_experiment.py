"""A training's rounds, written to the experiment logs its spec lists (``log_to``) as each round is saved.

The figures come from the same state ``monitor`` reads (the training database and the audit log), priced by
the same :meth:`TrainingCost.of`; :func:`round_scalars` turns one round of it into named numbers. The training
record is read once, when the logs open: a round's path reads it no more than it did. A log that fails is
dropped with a warning: an experiment log never ends a training.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ..records import RoundMetrics, TrainingCost, TrainingRecord, id_path
from ..tracking import ExperimentLog, ExperimentRun, open_experiment_log
from ._monitor import pool_events
from ._training_db import TrainingDatabase

log = logging.getLogger(__name__)
WEI_PER_ETH = 10**18


def round_scalars(metrics: RoundMetrics, *, worker_losses: Mapping[str, float], spend_wei: int | None,
                  spent_wei: int | None, checks: Sequence[Mapping[str, Any]], slashes: int) -> dict[str, float]:
    """One round's figures, by tag: the evaluation, each worker's training loss, bytes, time, spend (ETH),
    and the verification so far (``checks``: every ``spot_check`` audit entry's fields until now; a round's
    checks may end after it is saved, so the totals are what a curve can show truthfully)."""
    scalars: dict[str, float] = {"eval/loss": metrics.loss}
    scalars |= {f"eval/{name}": value for name, value in metrics.metrics.items() if name != "loss"}
    scalars["round/workers"] = metrics.workers
    optional = {"round/seconds": metrics.round_seconds, "round/samples_per_s": metrics.throughput,
                "bytes/sent": metrics.bytes_sent, "bytes/received": metrics.bytes_received,
                "spend/round_eth": None if spend_wei is None else spend_wei / WEI_PER_ETH,
                "spend/total_eth": None if spent_wei is None else spent_wei / WEI_PER_ETH}
    scalars |= {tag: float(value) for tag, value in optional.items() if value is not None}
    scalars |= {f"worker/{worker}/train_loss": loss for worker, loss in sorted(worker_losses.items())}
    passed = sum(1 for c in checks if c.get("passed") is True)
    scalars |= {"verify/spot_checks_total": len(checks), "verify/failed_total": len(checks) - passed,
                "verify/slashed_total": slashes}
    return scalars


def flat_config(record: TrainingRecord) -> dict[str, Any]:
    """The spec as one level of ``section.field`` keys, the hyperparameters an experiment log shows."""
    flat: dict[str, Any] = {"training_id": record.training_id}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif value is not None:
            flat[prefix] = value if isinstance(value, (int, float, str, bool)) else str(value)

    walk("", record.spec.model_dump(mode="json"))
    return flat


class ExperimentRecorder:
    """Writes each newly saved round of one training to its experiment logs (none: does nothing)."""

    def __init__(self, db: TrainingDatabase, audit_dir: Path | None, record: TrainingRecord,
                 logs: Sequence[tuple[str, ExperimentLog]]) -> None:
        self._db, self._audit_dir, self._training_id = db, audit_dir, record.training_id
        self._rounds = record.spec.rounds
        self._logs = list(logs)
        self._logged_through = record.round  # rounds an earlier coordinator process already wrote

    @classmethod
    async def open(cls, db: TrainingDatabase, audit_dir: Path | None, record: TrainingRecord) -> ExperimentRecorder:
        """The training's logs, opened in its directory; without an audit directory there is none to write in."""
        training_id = record.training_id
        logs: list[tuple[str, ExperimentLog]] = []
        if audit_dir is not None:
            run = ExperimentRun(training_id, id_path(audit_dir, training_id), flat_config(record))
            for name in record.spec.log_to:
                try:
                    logs.append((name, await asyncio.to_thread(open_experiment_log, name, run)))
                except Exception as exc:  # a missing library was refused before funding; anything else: go on
                    log.warning("training %s: cannot open the %s experiment log: %s", training_id, name, exc)
        return cls(db, audit_dir, record, logs)

    async def __aenter__(self) -> ExperimentRecorder:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def after_round(self) -> None:
        """Write the rounds saved since the last call; a round whose figures cannot be read (an audit log edited
        under the coordinator, say) is skipped with a warning, as the training goes on."""
        if not self._logs:
            return
        try:
            fresh = [m for m in await self._db.rounds(self._training_id) if m.round > self._logged_through]
            if not fresh:
                return
            events = await asyncio.to_thread(pool_events, self._audit_dir, self._training_id, ("receipt_sent",))
            cost = await self._cost(fresh[-1].round, events)
            written = [(m.round, await self._scalars(m, cost, events)) for m in fresh]
        except Exception as exc:
            log.warning("training %s: a round's figures could not be read for the experiment logs: %s",
                        self._training_id, exc)
            return
        for round_, scalars in written:
            await self._each("write round", lambda target, s=scalars, r=round_: target.log(r, s))
            self._logged_through = round_

    async def close(self) -> None:
        await self._each("close", lambda target: target.close())
        self._logs = []

    async def _cost(self, rounds_done: int, events: list[dict[str, Any]]) -> TrainingCost:
        escrow = await self._db.escrow(self._training_id)
        payments = await self._db.payments(self._training_id)
        return TrainingCost.of(rounds_done=rounds_done, rounds=self._rounds, finished=False,
                               deposit_wei=escrow.deposited_wei if escrow else None,
                               payments=[(p.worker_id, p.amount_wei) for p in payments],
                               receipts=[e for e in events if e["event"] == "receipt_sent"])

    async def _scalars(self, metrics: RoundMetrics, cost: TrainingCost,
                       events: list[dict[str, Any]]) -> dict[str, float]:
        losses: dict[str, float] = {}
        for job in await self._db.jobs(self._training_id, metrics.round):
            progress = await self._db.progress(job.job_id)
            if progress is not None and progress.loss is not None:
                losses[job.worker_id] = progress.loss  # a reassigned slot's later job wins
        spend = next((s.wei for s in cost.per_round_wei if s.round == metrics.round), None)
        return round_scalars(metrics, worker_losses=losses, spend_wei=spend, spent_wei=cost.spent_wei,
                             checks=[e for e in events if e["event"] == "spot_check"],
                             slashes=sum(1 for e in events if e["event"] == "slashed"))

    async def _each(self, what: str, call: Any) -> None:
        for name, target in list(self._logs):
            try:
                await asyncio.to_thread(call, target)
            except Exception as exc:
                log.warning("training %s: the %s experiment log failed to %s, and is dropped: %s",
                            self._training_id, name, what, exc)
                self._logs.remove((name, target))
