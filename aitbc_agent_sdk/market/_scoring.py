"""Pure, vectorised worker scoring. A strategy maps workers to scores; no I/O here."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import ConfigError
from ..records import Offer, Worker

# Relative training performance in 0..1. The four RTX values are the seed scenario's own
# table; the data-centre parts saturate the scale.
GPU_PERFORMANCE: Mapping[str, float] = {
    "H200": 1.0, "H100": 1.0, "A100": 1.0, "RTX4090": 1.0, "L40S": 0.95,
    "RTX3090": 0.85, "A10": 0.75, "RTX3080": 0.75, "RTX3070": 0.65, "L4": 0.6, "T4": 0.4,
}
UNKNOWN_GPU = 0.5  # the seed's default for a GPU it has no figure for
CPU_ONLY = 0.1
# A flagged offer's score is multiplied by this: the default weights give every other offer at least
# 0.4 * CPU_ONLY = 0.04, a flagged one at most 1.0 * FLAGGED_FACTOR. rank_workers puts them last anyway.
FLAGGED_FACTOR = 1e-3


def gpu_key(name: str) -> str:
    """'NVIDIA GeForce RTX 3090' -> 'RTX3090'; 'NVIDIA H200' -> 'H200'."""
    compact = re.sub(r"[^A-Z0-9]", "", name.upper())
    for key in sorted(GPU_PERFORMANCE, key=len, reverse=True):
        if key in compact:
            return key
    return compact


def gpu_performance(gpu_type: str, table: Mapping[str, float] = GPU_PERFORMANCE) -> float:
    if gpu_type.lower() == "cpu":
        return CPU_ONLY
    return table.get(gpu_key(gpu_type), UNKNOWN_GPU)


def meets_min_gpu(gpu_type: str, min_gpu: str | None, table: Mapping[str, float] = GPU_PERFORMANCE) -> bool:
    if min_gpu is None or min_gpu.lower() == "cpu":
        return True
    key = gpu_key(min_gpu)
    if key not in table:
        raise ConfigError(f"unknown GPU {min_gpu!r}; known: {', '.join(sorted(table))}, or 'cpu'")
    return gpu_performance(gpu_type, table) >= table[key]


class ScoringStrategy(Protocol):
    def score(self, workers: Sequence[Worker]) -> np.ndarray:
        """One score per worker, higher is better."""
        ...


def weighted_scores(perf: np.ndarray, price: np.ndarray, reputation: np.ndarray,
                    availability: np.ndarray, weights: tuple[float, float, float, float],
                    stake: np.ndarray | None = None) -> np.ndarray:
    """The seed's linear score over normalised factors.

    Price is scored relative to the cheapest offer (cheapest = 1), because the seed's
    ``1 / (price + 1)`` is meaningless once prices are in wei. Reputation only counts in
    full behind a bond: it is scaled by ``0.5 + 0.5 * stake / largest stake``, so an
    unbonded provider keeps half its reputation credit (when nobody is bonded, nobody is
    discounted).
    """
    w_gpu, w_price, w_rep, w_avail = weights
    cheapest = price.min() if price.size else 0.0
    price_score = np.where(price > 0, cheapest / np.maximum(price, 1e-300), 1.0)
    backing = np.ones_like(reputation)
    if stake is not None and stake.size and stake.max() > 0:
        backing = 0.5 + 0.5 * stake / stake.max()
    return w_gpu * perf + w_price * price_score + w_rep * (reputation / 5.0) * backing + w_avail * availability


@dataclass(frozen=True)
class WeightedScore:
    """Default strategy: GPU performance 0.4, price 0.3, reputation 0.2, availability 0.1."""

    gpu: float = 0.4
    price: float = 0.3
    reputation: float = 0.2
    availability: float = 0.1
    gpu_table: Mapping[str, float] = field(default_factory=lambda: dict(GPU_PERFORMANCE))

    def score(self, workers: Sequence[Worker]) -> np.ndarray:
        perf = np.array([gpu_performance(w.gpu_type, self.gpu_table) for w in workers], dtype=float)
        price = np.array([float(w.price) for w in workers], dtype=float)
        rep = np.array([w.reputation for w in workers], dtype=float)
        avail = np.array([w.availability for w in workers], dtype=float)
        stake = np.array([float(w.stake_wei) for w in workers], dtype=float)
        scores = weighted_scores(perf, price, rep, avail, (self.gpu, self.price, self.reputation, self.availability),
                                 stake)
        return demote_flagged(scores, np.array([w.flagged for w in workers], dtype=bool))


def demote_flagged(scores: np.ndarray, flagged: np.ndarray) -> np.ndarray:
    """Scores with those of offers the hardware challenge flagged multiplied by ``FLAGGED_FACTOR``."""
    return np.where(flagged, scores * FLAGGED_FACTOR, scores)


def rank_workers(workers: Sequence[Worker], scores: np.ndarray, count: int) -> list[Worker]:
    """Top ``count`` by score, offers the hardware challenge flagged after all others whatever the strategy
    scored; ties go to the cheaper offer, then the lower address (deterministic)."""
    order = sorted(range(len(workers)), key=lambda i: (workers[i].flagged, -scores[i], workers[i].price,
                                                       workers[i].worker_id))
    return [workers[i] for i in order[:count]]


# A round's worth of value is never taken to be less than this, so trainings of a few wei
# (a sybil paying itself) earn no reputation even in a pool of near-free offers.
MIN_REPUTATION_UNIT_WEI = 10**12


def reputation_unit(prices_wei: Sequence[int]) -> int:
    """What one job's worth of value is in a pool: the median asking price per round, floored."""
    median = int(np.median(np.asarray(prices_wei, dtype=float))) if len(prices_wei) else 0
    return max(median, MIN_REPUTATION_UNIT_WEI)


def reputation_from_earnings(earned_wei: int, failed: int, slashes: int, unit_wei: int) -> float:
    """0..5 from value paid, not from a count of trainings: one good job per whole ``unit_wei`` earned.

    The same Beta(1,1) prior as :func:`reputation_from_history`: a provider never paid scores
    2.5 however many 1-wei trainings it was "paid" for (whole units, so not even a hair above).
    """
    good = earned_wei // unit_wei if unit_wei > 0 else 0
    bad = failed + 2 * slashes
    return 5.0 * (good + 1) / (good + bad + 2)


def rate_worker(offer: Offer, *, completed: int, failed: int, slashes: int, stake_wei: int, earned_wei: int,
                unit_wei: int) -> Worker:
    """A discovered provider with its reputation from value paid (``unit_wei`` is one job's worth)."""
    return Worker(worker_id=offer.provider, offer=offer, jobs_completed=completed, jobs_failed=failed,
                  slashes=slashes, stake_wei=stake_wei, earned_wei=earned_wei,
                  reputation=reputation_from_earnings(earned_wei, failed, slashes, unit_wei))


def reputation_from_history(completed: int, failed: int, slashes: int = 0) -> float:
    """0..5 from observed jobs, with a Beta(1,1) prior: a provider never seen scores 2.5.

    A slash is a proven, signed fault, so it weighs as much as two failed jobs.
    """
    bad = failed + 2 * slashes
    return 5.0 * (completed + 1) / (completed + bad + 2)
