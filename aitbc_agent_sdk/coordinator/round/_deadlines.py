"""How long a job and a round may take (pure): sized by the work a job carries and the provider's speed.

A job's work is the sample passes it trains (its shard's samples x local epochs). A provider
with delivered rounds in this training is held to its own measured times; one without them
(round 1, a spare, a replacement) is given the time the work takes at the policy's assumed
speed, never less than ``first_round_deadline_s``. The round timeout, unless fixed, is a
multiple of the longest deadline a job of the round could get, so a big job never fails its
training merely for being big.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...records import FaultPolicy
from ._health import adaptive_deadline


def job_work(samples: int, epochs: int) -> int:
    """Sample passes one job trains: each of its shard's samples once per local epoch."""
    return samples * epochs


def first_job_deadline(work: int, policy: FaultPolicy) -> float:
    """Seconds for a job on a provider without history: its work at the assumed speed, with slack."""
    expected_s = work / policy.assumed_samples_per_s
    return max(policy.first_round_deadline_s, policy.deadline_factor * expected_s)


def job_deadline(work: int, history_s: Sequence[float], policy: FaultPolicy) -> float:
    """Seconds a provider gets for a job of ``work`` sample passes, given its past round times here.

    History wins once there is some: it is the coordinator's own measure of that provider on
    this training's jobs (a provider's self-reported speed is not trusted to extend it).
    """
    if not history_s:
        return first_job_deadline(work, policy)
    return adaptive_deadline(history_s, policy)


def round_timeout(jobs: Iterable[tuple[int, Sequence[float]]], policy: FaultPolicy) -> float:
    """Seconds a whole round may run before the training fails; ``jobs`` is (work, history) per slot.

    Each slot may need its holder's deadline and then a copy on a spare with no history, so the
    longest of both, over the slots, times ``round_timeout_factor``, at least ``min_round_timeout_s``.
    """
    if policy.round_timeout_s is not None:
        return policy.round_timeout_s
    longest = max((max(job_deadline(work, history, policy), first_job_deadline(work, policy))
                   for work, history in jobs), default=policy.first_round_deadline_s)
    return max(policy.min_round_timeout_s, policy.round_timeout_factor * longest)
