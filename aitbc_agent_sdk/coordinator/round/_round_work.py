"""The round's checks that work was done: commitments on arrival, the lower bound and copies once the
round's median is known, then spot checks running beside the round loop."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import TrainingError
from ...records import JobAssignment, Shard, TrajectoryCommitment
from ...data._shard_files import drawn_samples
from ...proof._trajectory import read_commitment, tensor_digest
from ..data._inputs import RoundInputs
from ..data._datasets import DatasetStore
from ..checks._spot_check import SpotCheck, SpotChecker
from ..checks._verification import validation_loss
from ..checks._work_checks import (
    PASS, WorkVerdict, bounded, check_crashed, commitment_verdict, expected_steps, median_per_step, missing_work,
    near_copies, sketch_positions, state_norm, unverifiable, update_sketch,
)

log = logging.getLogger(__name__)
State = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Work:
    """What a result committed to, and its update's fingerprint for finding copies."""

    commitment: TrajectoryCommitment | None
    steps: int  # the job's steps, as the coordinator counts them
    sketch: torch.Tensor


class RoundWork:
    def __init__(self, inputs: RoundInputs, *, data: DatasetStore, checker: SpotChecker) -> None:
        self.data = data
        self.inputs = inputs
        self.policy = inputs.policy
        self.checker = checker
        self.found: dict[str, Work] = {}  # job id -> its work
        self.checks: dict[int, asyncio.Task[SpotCheck]] = {}  # shard index -> its winner's spot check
        self.median_per_step: float | None = None
        self._own: dict[str, tuple[Any, float]] = {}  # shard CID -> (a sample of it, the round model's loss there)
        reference = inputs.baseline.reference
        self.start_hash = tensor_digest(reference)
        self.reference_norm = state_norm(reference)
        # Drawn per round and kept from workers: a copy cannot dodge coordinates it does not know.
        self.positions = sketch_positions(reference, secrets.randbits(31))

    async def own_shard(self, shard: Shard) -> tuple[Any, float]:
        """A sample of the worker's own shard and the round model's loss on it: on label-skewed shards the
        global validation loss of an honest result can rise, its loss on its own data cannot."""
        if shard.cid not in self._own:
            base = self.inputs.baseline
            sample = drawn_samples(await self.data.load(shard.cid), self.policy.val_samples, base.seed)
            start = await asyncio.to_thread(validation_loss, self.inputs.model, base.reference, sample, base.checker)
            self._own[shard.cid] = (sample, start)
        return self._own[shard.cid]

    def inspect(self, job: JobAssignment, shard: Shard, blob: bytes, state: State) -> WorkVerdict:
        """The commitment's own checks (run in a thread: hashes the weights when they are whole)."""
        sketch = update_sketch(state, self.inputs.baseline.reference, self.positions)
        try:
            commitment, malformed = read_commitment(blob), None
        except TrainingError as exc:
            commitment, malformed = None, exc
        steps = self._steps(job, shard, commitment)
        self.found[job.job_id] = Work(commitment, steps, sketch)
        if malformed is not None:
            return WorkVerdict(f"malformed trajectory commitment: {malformed}")
        end_hash = tensor_digest(state) if job.update_encoding == "weights" else None
        return commitment_verdict(commitment, job_id=job.job_id, worker=job.worker_id, steps=steps,
                                  segments=job.config.segments, start_hash=self.start_hash, end_hash=end_hash)

    def _steps(self, job: JobAssignment, shard: Shard, commitment: TrajectoryCommitment | None) -> int:
        """The job's steps, counted from the shard's size; for a task that needs the data itself to count
        them, the commitment's own count (the spot check's replay counts them on the data)."""
        try:
            return expected_steps(self.inputs.task, shard.samples, job.config)
        except Exception:
            log.warning("steps of job %s not counted from the shard's size", job.job_id)
            return commitment.steps if commitment is not None else 1

    def lower_bound(self, job_id: str, norm: float) -> str | None:
        """Missing work by the update's size, once :meth:`set_median` saw the whole round."""
        work = self.found.get(job_id)
        if work is None:  # never inspected: nothing shows its work
            return "missing work: the result's commitment was never inspected"
        if self.median_per_step is None:
            return None
        return missing_work(norm, work.steps, self.median_per_step, self.reference_norm, self.policy)

    def set_median(self, results: Mapping[str, float]) -> None:
        """``results``: job id -> update norm of every shard's first winner."""
        self.median_per_step = median_per_step([(n, self.found[j].steps) for j, n in results.items()
                                                if j in self.found])

    def held(self, job_ids: list[str]) -> set[str]:
        """Results whose update (nearly) equals another result's of this round: both get a closer check."""
        sketches = {j: self.found[j].sketch for j in job_ids if j in self.found}
        return near_copies(sketches, self.policy.near_copy_distance)

    # -- spot checks beside the loop -------------------------------------------------------------
    def start_check(self, index: int, job: JobAssignment | None, shard: Shard, held: bool) -> WorkVerdict | None:
        """Start the winner's spot check: None when one runs, else the verdict now: a pass when checks are off,
        unverifiable when there is nothing to check (no job, no commitment), which fails closed."""
        if self.policy.spot_checks == 0:
            return PASS
        work = self.found.get(job.job_id) if job is not None else None
        if job is None or work is None or work.commitment is None:
            return unverifiable("the spot check could not start: no job or no committed trajectory to check")
        checks = min(2 * self.policy.spot_checks if held else self.policy.spot_checks, 16)
        self.checks[index] = asyncio.create_task(self.checker.check(job, shard, work.commitment, checks))
        return None

    def finished(self) -> list[tuple[int, WorkVerdict]]:
        """Spot checks that ended since the last call, with their verdicts (:func:`ended_check`)."""
        done = []
        for index, task in list(self.checks.items()):
            if task.done():
                del self.checks[index]
                done.append((index, ended_check(task)))
        return done

    def cancel(self, index: int) -> None:
        task = self.checks.pop(index, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        for task in self.checks.values():
            task.cancel()
        await asyncio.gather(*self.checks.values(), return_exceptions=True)
        self.checks.clear()


def ended_check(task: asyncio.Task[SpotCheck]) -> WorkVerdict:
    """The verdict of a spot check that ended. One that raised (the checker turns its own errors into
    verdicts, so this is a bug) or was cancelled proves nothing against the worker and shows no work
    either: it fails closed, unverifiable (unpaid, not slashed), and never crashes the round."""
    if task.cancelled():
        return unverifiable("the spot check was cancelled")
    if (exc := task.exception()) is not None:
        log.error("a spot check could not run; its result is unverifiable", exc_info=exc)
        return bounded(check_crashed(exc))
    return task.result().verdict
