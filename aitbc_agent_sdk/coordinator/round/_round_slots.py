"""A round's shard slots: each shard's jobs, and the phase its result is in, with the moves between phases.

A slot WAITING has no result yet: the holder's job trains (and perhaps a spare's speculative copy).
The first result that passes its own checks makes it RECEIVED; once the round's median norm is
known and the result passes the norm check, its spot check runs (CHECKING) or, with nothing left to
check, it is ACCEPTED. A result rejected by either check sends the slot back to WAITING: the shard
trains again (a rejection and a reassignment are moves, not places a slot rests in). The round ends
when every slot is ACCEPTED; aggregation then folds each one (FOLDED).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from ...errors import PhaseError
from ...records import CheckpointRef, JobAssignment, Shard, WorkerContract
from ..checks._verification import Inspection


class SlotPhase(StrEnum):
    WAITING = "waiting"
    RECEIVED = "received"
    CHECKING = "checking"
    ACCEPTED = "accepted"
    FOLDED = "folded"


S = SlotPhase
SLOT_MOVES: Mapping[SlotPhase, frozenset[SlotPhase]] = {
    S.WAITING: frozenset({S.RECEIVED}),
    S.RECEIVED: frozenset({S.CHECKING, S.ACCEPTED, S.WAITING}),
    S.CHECKING: frozenset({S.ACCEPTED, S.WAITING}),
    S.ACCEPTED: frozenset({S.FOLDED}),
    S.FOLDED: frozenset(),
}


def slot_move(current: SlotPhase, target: SlotPhase) -> SlotPhase:
    """``target``, or PhaseError when a slot may not move there from ``current`` (a bug in the round loop)."""
    if target not in SLOT_MOVES[current]:
        allowed = ", ".join(sorted(p.value for p in SLOT_MOVES[current])) or "none"
        raise PhaseError(f"a shard slot cannot move from {current.value} to {target.value}; allowed: {allowed}")
    return target


@dataclass
class ShardSlot:
    shard: Shard
    contract: WorkerContract  # the holder's: the worker whose escrow slot pays for this shard
    jobs: dict[str, JobAssignment] = field(default_factory=dict)  # live jobs on the shard
    sent_at: dict[str, float] = field(default_factory=dict)
    phase: SlotPhase = SlotPhase.WAITING  # moved only by the methods below
    winner: Inspection | None = None  # the result past WAITING (None while WAITING)
    winner_ref: CheckpointRef | None = None
    finished_s: float | None = None  # how long the winning job took (kept if it is rejected later: it delivered)
    short: str | None = None  # missing work found by the norm: rejected after its spot check says if it lied
    # Not phases: both are about helping a slow holder while WAITING, and outlive a rejected result.
    reported: bool = False  # the holder was reported as a straggler (once per holder)
    market_tried: bool = False  # a spare for its copy was looked for on the market (once per slot and round)

    @property
    def holder(self) -> str:
        return self.contract.worker_id

    @property
    def waiting(self) -> bool:
        return self.phase is SlotPhase.WAITING

    @property
    def straggling(self) -> bool:
        """A spare runs a speculative copy of the holder's job: the one job on the shard not the holder's."""
        return any(j.worker_id != self.holder for j in self.jobs.values())

    def job_of(self, worker: str) -> JobAssignment | None:
        return next((j for j in self.jobs.values() if j.worker_id == worker), None)

    # -- the moves ---------------------------------------------------------------------------
    def receive(self, inspection: Inspection, ref: CheckpointRef, took_s: float) -> None:
        """A result passed its own checks: it wins the shard, until a round-level check says otherwise."""
        self.phase = slot_move(self.phase, S.RECEIVED)
        self.winner, self.winner_ref, self.finished_s = inspection, ref, took_s

    def start_check(self) -> None:
        self.phase = slot_move(self.phase, S.CHECKING)

    def accept(self) -> None:
        self.phase = slot_move(self.phase, S.ACCEPTED)

    def reject(self) -> CheckpointRef:
        """The winner failed a round-level check: forget it (and its job); returns it, to be rejected."""
        self.phase = slot_move(self.phase, S.WAITING)
        ref = self.winner_ref
        assert ref is not None
        self.winner = self.winner_ref = None
        self.jobs.pop(ref.job_id, None)
        return ref

    def mark_folded(self) -> CheckpointRef:
        self.phase = slot_move(self.phase, S.FOLDED)
        assert self.winner_ref is not None
        return self.winner_ref
