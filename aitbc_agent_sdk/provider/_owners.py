"""Whose work a provider holds: a training's on-chain identity, never its id string.

A training id is a string any coordinator may pick, and ids are public on the bus. The escrow
makes a training unique as ``keccak(coordinator, salt(id))``, so everything the provider keeps
for a training (its process, kept state, trajectories, delivered results, seen job ids) is keyed
by that key, and a message naming a training is looked up under the key its verified sender owns.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ..chain._escrow import training_key

__all__ = ["MAX_JOB_IDS_PER_TRAINING", "JobIdLedger", "TrainingOwner"]

MAX_JOB_IDS_PER_TRAINING = 4096  # job ids remembered per training: rounds x re-sends of one worker


@dataclass(frozen=True)
class TrainingOwner:
    """A training as the chain knows it: its coordinator and the id that coordinator chose."""

    coordinator: str
    training_id: str
    key: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "coordinator", self.coordinator.lower())
        object.__setattr__(self, "key", training_key(self.coordinator, self.training_id))

    @property
    def hex(self) -> str:
        """The on-chain key as 64 hex digits: a safe directory name and a process's owner tag."""
        return self.key.hex()


class JobIdLedger:
    """Job ids each training has used on this provider: a job id seen before in the same training is refused.

    Bounded per training (the oldest ids are forgotten past :data:`MAX_JOB_IDS_PER_TRAINING`) and
    per provider by the trainings it holds, which ``forget`` drops once the chain shows them closed.
    """

    def __init__(self, per_training: int = MAX_JOB_IDS_PER_TRAINING) -> None:
        self._per_training = per_training
        self._seen: dict[str, OrderedDict[str, None]] = {}

    def claim(self, owner: TrainingOwner, job_id: str) -> bool:
        """Record ``job_id`` for ``owner``; False when that training already used it."""
        seen = self._seen.setdefault(owner.hex, OrderedDict())
        if job_id in seen:
            return False
        seen[job_id] = None
        while len(seen) > self._per_training:
            seen.popitem(last=False)
        return True

    def forget(self, owner_hex: str) -> None:
        self._seen.pop(owner_hex, None)
