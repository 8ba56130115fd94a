"""The pure rules that say whether a result's work was done (coordinator/work_checks.py)."""

from __future__ import annotations

import random

import pytest
import torch

from aitbc_agent_sdk.coordinator.checks._work_checks import (
    commitment_verdict, missing_work, near_copies, pick_segments, reexecution_verdict, sketch_positions,
    state_norm, update_sketch,
)
from aitbc_agent_sdk.proof._trajectory import segment_steps
from aitbc_agent_sdk.records import FaultPolicy, TrajectoryCommitment

WORKER = "0x" + "11" * 20
OTHER = "0x" + "22" * 20


def _hash(i: int) -> str:
    return f"{i:064x}"


def commitment(steps: int = 24, segments: int = 8, job_id: str = "job-1", worker: str = WORKER,
               start: str | None = None, end: str | None = None) -> TrajectoryCommitment:
    k = segment_steps(steps, segments)
    n = -(-steps // k)
    models = [start or _hash(0), *(_hash(100 + i) for i in range(1, n)), end or _hash(999)]
    return TrajectoryCommitment(job_id=job_id, worker=worker, steps=steps, segment_steps=k, device="cpu",
                                model_hashes=models, state_hashes=[_hash(200 + i) for i in range(n + 1)],
                                batch_hashes=[_hash(300 + i) for i in range(n)])


def verdict(c: TrajectoryCommitment | None, **over):
    args = dict(job_id="job-1", worker=WORKER, steps=24, segments=8, start_hash=_hash(0), end_hash=_hash(999))
    args.update(over)
    return commitment_verdict(c, **args)


def test_an_honest_commitment_passes():
    assert verdict(commitment()).problem is None
    assert verdict(commitment(), end_hash=None).problem is None  # an encoded update: no end link to check


def test_no_commitment_or_fewer_steps_is_missing_work_and_not_slashable():
    none = verdict(None)
    assert none.problem is not None and "missing work" in none.problem and not none.slashable
    half = verdict(commitment(steps=12), steps=24)
    assert "committed 12 of the job's 24 steps" in half.problem and not half.slashable


@pytest.mark.parametrize("bad", [dict(job_id="job-2"), dict(worker=OTHER)])
def test_a_commitment_to_someone_elses_job_is_a_slashable_copy(bad):
    found = verdict(commitment(**bad))
    assert found.problem.startswith("a copy") and found.slashable


def test_a_trajectory_that_does_not_join_the_round_model_or_the_checkpoint_is_slashable():
    assert verdict(commitment(start=_hash(5))).slashable
    found = verdict(commitment(end=_hash(6)))
    assert "not the end" in found.problem and found.slashable


def test_segments_other_than_the_jobs_are_refused():
    wrong = commitment().model_copy(update={"segment_steps": 4})
    assert "segments of 4" in verdict(wrong).problem


def test_commitment_record_refuses_inconsistent_lengths():
    good = commitment().model_dump()
    good["batch_hashes"] = good["batch_hashes"][:-1]
    with pytest.raises(ValueError):
        TrajectoryCommitment.model_validate(good)


def test_lower_bound_rejects_noise_and_a_tenth_of_the_work_but_not_an_uneven_shard():
    policy = FaultPolicy()
    median = 6.4 / 24
    assert missing_work(9.8e-5, 24, median, 30.0, policy) is not None  # the round's model plus noise
    assert missing_work(0.5, 24, median, 30.0, policy) is not None  # ~8 % of a typical update
    # A shard a quarter the size takes a quarter of the steps: its norm per step is ordinary.
    assert missing_work(1.6, 6, median, 30.0, policy) is None
    assert missing_work(6.4, 24, median, 30.0, policy) is None
    assert missing_work(0.01, 24, 0.0, 30.0, policy) is None  # one worker: only the floor applies
    assert missing_work(0.01, 24, 0.0, 1e6, policy) is not None
    assert missing_work(float("nan"), 24, median, 30.0, policy) is not None  # no number shows no work


def test_near_copies_find_the_pair_and_only_it():
    reference = {"w": torch.zeros(50, 40), "b": torch.zeros(40), "step": torch.zeros((), dtype=torch.long)}
    positions = sketch_positions(reference, seed=3, size=512)
    assert sum(p.numel() for p in positions.values()) == 512
    gen = torch.Generator().manual_seed(0)
    honest = [{k: torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in reference.items()}
              for _ in range(3)]
    copy = {k: v + 1e-6 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
            for k, v in honest[1].items()}
    sketches = {i: update_sketch(s, reference, positions) for i, s in enumerate([*honest, copy])}
    assert near_copies(sketches, 1e-3) == {1, 3}
    assert near_copies({i: sketches[i] for i in range(3)}, 1e-3) == set()
    assert state_norm({"a": torch.tensor([3.0, 4.0])}) == pytest.approx(5.0)


def test_segments_are_distinct_sorted_and_spread():
    rng = random.Random(1)
    picks = [pick_segments(64, 5, rng) for _ in range(400)]
    assert all(len(set(p)) == 5 and list(p) == sorted(p) for p in picks)
    seen = {s for p in picks for s in p}
    assert seen == set(range(64))  # every segment can be drawn
    assert pick_segments(3, 5, rng) == (0, 1, 2)


def test_reexecution_verdicts():
    assert reexecution_verdict(2, exact=True, reexecuted_hash="a", committed_hash="a", distance=None,
                               tolerance=0.05).problem is None
    bad = reexecution_verdict(2, exact=True, reexecuted_hash="a", committed_hash="b", distance=None, tolerance=0.05)
    assert "segment 2" in bad.problem and bad.slashable
    assert reexecution_verdict(1, exact=False, reexecuted_hash="a", committed_hash="b", distance=0.01,
                               tolerance=0.05).problem is None
    assert reexecution_verdict(1, exact=False, reexecuted_hash="a", committed_hash="b", distance=0.9,
                               tolerance=0.05).slashable
