"""A dispute narrowed to one step: refereed delegation, as Gensyn's Verde describes it. Pure, no I/O.

A worker and a verifier trained the same segment from the same opened start and disagree on its end. Each
traces the state hashes after chosen steps of it; the first traced step where they differ follows one
they agree on. At most ``limit`` hashes a round, a segment of ``k`` steps narrows to a single step in
``ceil(log_limit(k))`` rounds (one, for every segment up to ``limit`` steps). The referee then trains that
one step from the agreed state: whichever side's hash it does not reach is wrong. One honest side is
enough: the honest trace is the true one, so at the first step the sides differ, the step from the agreed
(true) state lands on the honest side's hash.

Each side is held to its earlier word: the last point of a round is the interval's disputed step, where
both already gave a hash (the worker's commitment, the verifier's signed report), and a trace that
changes it there is replaced by it. A side cannot close the dispute by changing its story.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Disputed:
    """Steps into the segment: both sides say the state after ``agreed`` steps hashes to ``agreed_hash``
    (0: the opened start), and differ on the state after ``disputed``."""

    agreed: int
    agreed_hash: str
    disputed: int
    worker_hash: str
    verifier_hash: str

    def __post_init__(self) -> None:
        if not 0 <= self.agreed < self.disputed or self.worker_hash == self.verifier_hash:
            raise ValueError(f"not a dispute: steps {self.agreed} to {self.disputed}, hashes "
                             f"{self.worker_hash[:8]} and {self.verifier_hash[:8]}")

    @property
    def narrowed(self) -> bool:
        """One step apart: the referee trains it."""
        return self.disputed - self.agreed == 1


class Wrong(StrEnum):
    """Whom the referee's one step shows wrong."""

    WORKER = "worker"
    VERIFIER = "verifier"
    BOTH = "both"


def trace_points(dispute: Disputed, limit: int) -> tuple[int, ...]:
    """The steps to trace next: every step after the agreed one up to the disputed one, or ``limit`` of
    them evenly spread, the last being the disputed step."""
    if limit < 1:
        raise ValueError(f"limit {limit} below 1")
    span = dispute.disputed - dispute.agreed
    if span <= limit:
        return tuple(range(dispute.agreed + 1, dispute.disputed + 1))
    return tuple(dispute.agreed + -(-span * (i + 1) // limit) for i in range(limit))  # integer ceilings


def narrow(dispute: Disputed, points: Sequence[int], worker_trace: Sequence[str],
           verifier_trace: Sequence[str]) -> Disputed:
    """The dispute after one round of traces over ``points`` (:func:`trace_points`): between the last point
    both sides' hashes agree on and the first where they differ."""
    if not points or points[-1] != dispute.disputed or not len(points) == len(worker_trace) == len(verifier_trace):
        raise ValueError(f"{len(worker_trace)} and {len(verifier_trace)} hashes over {len(points)} points "
                         f"ending at {points[-1] if points else None}, not at step {dispute.disputed}")
    worker, verifier = list(worker_trace), list(verifier_trace)
    worker[-1], verifier[-1] = dispute.worker_hash, dispute.verifier_hash  # each held to its earlier word
    agreed, agreed_hash = dispute.agreed, dispute.agreed_hash
    for point, ours, theirs in zip(points, worker, verifier):
        if ours != theirs:
            return Disputed(agreed, agreed_hash, point, ours, theirs)
        agreed, agreed_hash = point, ours
    raise AssertionError("the disputed step's hashes differ")  # a Disputed's own invariant


def step_verdict(dispute: Disputed, replayed_hash: str) -> Wrong:
    """Whom the referee's replay of the one disputed step (from the agreed state) shows wrong."""
    if not dispute.narrowed:
        raise ValueError(f"steps {dispute.agreed} to {dispute.disputed}: not yet one step")
    if replayed_hash == dispute.worker_hash:
        return Wrong.VERIFIER
    if replayed_hash == dispute.verifier_hash:
        return Wrong.WORKER
    return Wrong.BOTH

