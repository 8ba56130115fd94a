"""Was the work done? Rules over a result's committed trajectory and its update (no I/O).

:mod:`._verification` catches broken and hostile results; these catch missing work:

* a result without a trajectory commitment, or one committing to fewer steps than its job has, is
  missing work (unpaid, not slashable: an honest worker that stopped early committed honestly);
* a commitment naming another job or worker, a trajectory that does not start from the round's
  model or does not end at the checkpoint, or a checkpoint another worker of the round published
  first, contradicts what the worker signed: slashable, since the signed CID's content proves it;
* an update whose norm per committed step is far below the round's median is missing work;
* two updates of a round that are (nearly) the same are both held for a spot check;
* a check that cannot decide (it crashed, the opening is missing, late or not a state the task could
  be in) fails closed: the result is *unverifiable*, unpaid but not slashed, since it proves nothing.

The re-execution that settles a spot check is :mod:`._spot_check`'s.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...records import FaultPolicy, JobConfig, TrajectoryCommitment
from ...tasks._bound_task import BoundTask
from ...proof._trajectory import segment_steps

State = Mapping[str, torch.Tensor]
SKETCH_SIZE = 4096  # coordinates of an update compared between workers of one round
MIN_RELATIVE_UPDATE = 1e-4  # an update this small beside the model is no training at all, whatever the median


@dataclass(frozen=True)
class WorkVerdict:
    problem: str | None
    slashable: bool = False


PASS = WorkVerdict(None)
UNVERIFIABLE = "unverifiable"
REASON_CHARS = 512  # a reason ends up in a signed JobCancel (1,024 characters at most) after a prefix


def bounded(verdict: WorkVerdict) -> WorkVerdict:
    """``verdict`` with its reason cut to :data:`REASON_CHARS` (it may quote a stranger's error text)."""
    if verdict.problem is None or len(verdict.problem) <= REASON_CHARS:
        return verdict
    return WorkVerdict(verdict.problem[:REASON_CHARS], verdict.slashable)


def unverifiable(why: str) -> WorkVerdict:
    """A check that could not decide: the work is not shown, so it is not paid; nothing is proven, so
    nothing is slashed."""
    return WorkVerdict(f"{UNVERIFIABLE}: {why}")


def check_crashed(exc: BaseException) -> WorkVerdict:
    """A check that raised: on the worker's side (a hostile state) or the coordinator's, it is not a pass."""
    return unverifiable(f"the spot check could not run ({type(exc).__name__}: {exc})")


class _Sized:
    """Stands in for a shard whose length is all ``steps_per_epoch`` needs."""

    def __init__(self, samples: int) -> None:
        self._samples = samples

    def __len__(self) -> int:
        return self._samples


def expected_steps(task: BoundTask, samples: int, config: JobConfig, data: Any | None = None) -> int:
    """Optimizer steps the job's loop takes on a shard of ``samples`` (as ``train_task`` counts them)."""
    sized = data if data is not None else _Sized(samples)
    batch = min(config.batch_size, max(samples, 1))
    return config.epochs * task.task.steps_per_epoch(sized, task.params, batch)


def commitment_verdict(commitment: TrajectoryCommitment | None, *, job_id: str, worker: str, steps: int,
                       segments: int, start_hash: str, end_hash: str | None) -> WorkVerdict:
    """What a commitment alone says: ``start_hash`` is the digest of the round's model, ``end_hash`` that
    of the checkpoint's weights when they are exact (whole weights), else None."""
    if commitment is None:
        return WorkVerdict("missing work: the checkpoint commits to no training trajectory")
    if commitment.job_id != job_id or commitment.worker != worker:
        return WorkVerdict(f"a copy: the signed checkpoint commits to job {commitment.job_id} of "
                           f"{commitment.worker}", slashable=True)
    if commitment.steps < steps:
        return WorkVerdict(f"missing work: committed {commitment.steps} of the job's {steps} steps")
    if commitment.steps > steps:
        return WorkVerdict(f"committed {commitment.steps} steps, the job has {steps}")
    if commitment.segment_steps != segment_steps(steps, segments):
        return WorkVerdict(f"committed segments of {commitment.segment_steps} steps, the job's are "
                           f"{segment_steps(steps, segments)}")
    if commitment.model_hashes[0] != start_hash:
        return WorkVerdict("the committed trajectory does not start from the round's model", slashable=True)
    if end_hash is not None and commitment.model_hashes[-1] != end_hash:
        return WorkVerdict("the checkpoint is not the end of its committed trajectory", slashable=True)
    return PASS


# -- the round's lower bound -------------------------------------------------------------------------

def per_step(norm: float, steps: int) -> float:
    return norm / max(steps, 1)


def missing_work(norm: float, steps: int, median_per_step: float, reference_norm: float,
                 policy: FaultPolicy) -> str | None:
    """An update too small for the steps its job took: below ``min_update_ratio`` x the round's median per
    step, or negligible beside the model itself (a copy of the round's model plus noise)."""
    if not norm > MIN_RELATIVE_UPDATE * reference_norm:  # NaN too: a norm that is no number shows no work
        return f"missing work: update norm {norm:.3g} is negligible beside the model's {reference_norm:.3g}"
    if median_per_step > 0 and per_step(norm, steps) < policy.min_update_ratio * median_per_step:
        return (f"missing work: update norm {per_step(norm, steps):.3g} per step is below "
                f"{policy.min_update_ratio:g} x the round median {median_per_step:.3g}")
    return None


def no_improvement(loss: float, start_loss: float) -> str | None:
    """Training on a shard lowers the loss on that shard: a result that does not did no work there."""
    if loss < start_loss:
        return None
    return f"missing work: loss {loss:.4g} on its own shard, no lower than the round's start {start_loss:.4g}"


def median_per_step(results: Sequence[tuple[float, int]]) -> float:
    return statistics.median(per_step(n, s) for n, s in results) if results else 0.0


def state_norm(state: State) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in state.values() if t.is_floating_point()))


# -- copies ------------------------------------------------------------------------------------------

def sketch_positions(reference: State, seed: int, size: int = SKETCH_SIZE) -> dict[str, torch.Tensor]:
    """Coordinates of the round's floating tensors to compare updates on: the same for every result."""
    keys = [k for k in sorted(reference) if reference[k].is_floating_point() and reference[k].numel()]
    total = sum(reference[k].numel() for k in keys)
    if not total:
        return {}
    picks = torch.randint(0, total, (min(size, total),), generator=torch.Generator().manual_seed(seed)).sort().values
    positions, offset = {}, 0
    for key in keys:
        n = reference[key].numel()
        mine = picks[(picks >= offset) & (picks < offset + n)] - offset
        if mine.numel():
            positions[key] = mine
        offset += n
    return positions


def update_sketch(state: State, reference: State, positions: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The update at ``positions``, in float64."""
    parts = [(state[k].reshape(-1)[p].double() - reference[k].reshape(-1)[p].double()) for k, p in positions.items()]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def near_copies(sketches: Mapping[Any, torch.Tensor], distance: float) -> set[Any]:
    """Keys whose sketch is within ``distance`` (relative to the larger) of another's: (nearly) one update."""
    held: set[Any] = set()
    keys = list(sketches)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            x, y = sketches[a], sketches[b]
            scale = max(float(x.norm()), float(y.norm()))
            if x.shape == y.shape and scale > 0 and float((x - y).norm()) <= distance * scale:
                held |= {a, b}
    return held


# -- spot checks -------------------------------------------------------------------------------------

def pick_segments(segments: int, checks: int, rng: random.Random) -> tuple[int, ...]:
    """``checks`` distinct segments, drawn after the commitment arrived (``rng``: the OS's, unseeded)."""
    return tuple(sorted(rng.sample(range(segments), min(checks, segments))))


def reexecution_verdict(segment: int, *, exact: bool, reexecuted_hash: str, committed_hash: str,
                        distance: float | None, tolerance: float) -> WorkVerdict:
    """A segment re-executed from its committed start: equal bit for bit (``exact``), or within
    ``tolerance`` of the committed end relative to the segment's own change."""
    if exact:
        if reexecuted_hash == committed_hash:
            return PASS
        return WorkVerdict(f"spot check: segment {segment} re-executed to a different state than committed",
                           slashable=True)
    assert distance is not None
    if distance <= tolerance:
        return PASS
    return WorkVerdict(f"spot check: segment {segment} re-executed {distance:.3g} (relative) from the committed "
                       f"end, above the tolerance {tolerance:g}", slashable=True)
