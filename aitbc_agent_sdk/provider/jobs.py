"""A provider job's records and files: what training it produced, its progress record, its inputs on disk."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..limits import TEXT_MAX_LENGTH
from ..models import JobAssignment, Progress
from .process import SHARD_FILE, WEIGHTS_FILE

__all__ = ["EpochReporter", "TrainOutcome", "job_progress", "write_file", "write_inputs"]

EpochReporter = Callable[[dict[str, Any]], Awaitable[None]]
"""Called with each ``epoch`` event of the training process; reports progress on the bus."""


@dataclass(frozen=True)
class TrainOutcome:
    """What training a job produced: the checkpoint file and the numbers the result reports."""

    checkpoint: Path
    samples: int
    loss: float
    seconds: float


def job_progress(job: JobAssignment, worker: str, status: str, *, epoch: int = 0, loss: float | None = None,
                 samples_per_s: float | None = None, error: str | None = None) -> Progress:
    """The progress record of ``job`` on ``worker``; non-finite numbers are left out, errors cut to size."""
    percent = 100.0 if status == "complete" else 100.0 * epoch / job.config.epochs
    return Progress(
        job_id=job.job_id, training_id=job.training_id, worker_id=worker, round=job.round,
        status=status, epoch=epoch, epochs=job.config.epochs, progress=percent, loss=_finite(loss),
        samples_per_s=_finite(samples_per_s), error=error[:TEXT_MAX_LENGTH] if error else error)


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_inputs(job_dir: Path, shard: bytes, weights: bytes) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / SHARD_FILE).write_bytes(shard)
    (job_dir / WEIGHTS_FILE).write_bytes(weights)
