"""Liveness and straggler rules (pure): who is silent, who is behind, who is past its deadline."""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from ...records import FaultPolicy

K = TypeVar("K", bound=Hashable)


def silent_workers(last_seen: Mapping[str, float], now: float, timeout_s: float) -> list[str]:
    """Workers whose last heartbeat (or any message) is older than ``timeout_s``."""
    return sorted(w for w, seen in last_seen.items() if now - seen > timeout_s)


def progress_stragglers(progress: Mapping[K, float], gap_points: float) -> list[K]:
    """The seed's rule: progress (0..100) more than ``gap_points`` below the average of all."""
    if len(progress) < 2:
        return []
    average = sum(progress.values()) / len(progress)
    return sorted(w for w, p in progress.items() if p < average - gap_points)


def confirmed_stragglers(progress: Mapping[K, float], elapsed_s: Mapping[K, float], finished_s: Sequence[float],
                         policy: FaultPolicy) -> list[K]:
    """The progress rule, confirmed by time, so coarse progress reports do not flag everyone.

    With one-epoch jobs progress jumps from 0 to 100, so right after the first results arrive
    every other job is "behind the average". A job counts only once at least half of the round's
    jobs finished and it has run ``straggler_grace`` times longer than their median, and at least
    ``straggler_min_s``: a busy provider's short job (it verifies for others too) is not copied for lagging
    by a fraction of a second.
    """
    if len(finished_s) * 2 < len(progress) or not finished_s:
        return []
    patience = max(policy.straggler_grace * statistics.median(finished_s), policy.straggler_min_s)
    return [k for k in progress_stragglers(progress, policy.straggler_gap_points) if elapsed_s.get(k, 0.0) > patience]


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile, ``q`` in (0, 1]."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def adaptive_deadline(history_s: Sequence[float], policy: FaultPolicy) -> float:
    """Seconds a provider gets for one round: a multiple of the quantile of its own past rounds."""
    if not history_s:
        return policy.first_round_deadline_s
    return max(policy.min_deadline_s, policy.deadline_factor * quantile(history_s, policy.deadline_quantile))


def past_deadline(started_at: Mapping[str, float], deadlines: Mapping[str, float], now: float) -> list[str]:
    """Jobs (by key) running longer than their deadline."""
    return sorted(k for k, t in started_at.items() if now - t > deadlines[k])
