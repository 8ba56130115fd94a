"""A provider job's records and files: what training it produced, its progress record, its inputs on disk."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from ..limits import TEXT_MAX_LENGTH
from ..messaging import Verified
from ..records import ContractProposal, JobAssignment, Progress
from ._owners import TrainingOwner
from ._process import SHARD_FILE, WEIGHTS_FILE

__all__ = ["ActiveJob", "EpochReporter", "HeldJob", "Server", "TrainOutcome", "job_progress", "write_file", "write_inputs"]

EpochReporter = Callable[[dict[str, Any]], Awaitable[None]]
"""Called with each ``epoch`` event of the training process; reports progress on the bus."""


@dataclass(frozen=True)
class TrainOutcome:
    """What training a job produced: the checkpoint file and the numbers the result reports."""

    checkpoint: Path
    samples: int
    loss: float
    seconds: float
    task_state: Literal["fresh", "resumed"] | None = None  # a keep_state task: whether it resumed its state


def job_progress(job: JobAssignment, worker: str, status: str, *, epoch: int = 0, loss: float | None = None,
                 samples_per_s: float | None = None, error: str | None = None,
                 gpu_memory_bytes: int | None = None, gpu_utilization_percent: float | None = None) -> Progress:
    """The progress record of ``job`` on ``worker``; non-finite numbers are left out, errors cut to size."""
    percent = 100.0 if status == "complete" else 100.0 * epoch / job.config.epochs
    return Progress(
        job_id=job.job_id, training_id=job.training_id, worker_id=worker, round=job.round,
        status=status, epoch=epoch, epochs=job.config.epochs, progress=percent, loss=_finite(loss),
        samples_per_s=_finite(samples_per_s), error=error[:TEXT_MAX_LENGTH] if error else error,
        gpu_memory_bytes=gpu_memory_bytes, gpu_utilization_percent=_finite(gpu_utilization_percent))


def epoch_fields(event: dict[str, Any]) -> dict[str, Any]:
    """The progress fields of one ``epoch`` event from the training process (its GPU figures when it has a GPU)."""
    fields = {"epoch": int(event["epoch"]), "loss": float(event["loss"]),
              "samples_per_s": float(event["samples_per_s"])}
    for name, kind in (("gpu_memory_bytes", int), ("gpu_utilization_percent", float)):
        if isinstance(event.get(name), (int, float)):
            fields[name] = kind(event[name])
    return fields


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_inputs(job_dir: Path, shard: bytes, weights: bytes) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / SHARD_FILE).write_bytes(shard)
    (job_dir / WEIGHTS_FILE).write_bytes(weights)


@dataclass(frozen=True)
class HeldJob:
    """A job this provider took: the job and the training's on-chain identity and contract it runs under."""

    job: JobAssignment
    owner: TrainingOwner
    contract: ContractProposal

    @property
    def key(self) -> tuple[str, str]:
        """What the provider keys a job by: (on-chain training key, job id)."""
        return self.owner.hex, self.job.job_id


@dataclass(frozen=True)
class ActiveJob:
    held: HeldJob
    task: asyncio.Task[None]

    @property
    def job(self) -> JobAssignment:
        return self.held.job


class Server(NamedTuple):
    """One serving loop: the topic it reads (under this provider's address), its record and its handler."""

    name: str
    topic: Callable[[str], str]
    record: type
    handle: Callable[[Verified[Any]], Awaitable[None] | None]
