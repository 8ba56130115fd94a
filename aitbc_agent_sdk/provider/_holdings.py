"""What a provider holds for each training, and the sweep that lets go of a training the chain shows closed.

Kept task state, delivered results and boundary states, the content pinned for it, used job ids and
funded contracts all live as long as their training is open on chain, keyed by its on-chain identity:
only that training's own close (its coordinator's refund, or anyone's after the deadline) drops them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from ..errors import AitbcError
from ._book import ContractBook
from ._kept import KeptResults
from ._owners import JobIdLedger, TrainingOwner
from ._pins import TrainingPins
from ._tasks import ProviderTasks

__all__ = ["CHAIN_READ_S", "TrainingHoldings"]

CHAIN_READ_S = 10.0  # one chain read of the sweep


@dataclass(frozen=True)
class TrainingHoldings:
    tasks: ProviderTasks
    kept: KeptResults
    job_ids: JobIdLedger
    contracts: ContractBook
    pins: TrainingPins

    def owners(self) -> set[TrainingOwner]:
        return self.tasks.owners() | self.kept.owners() | self.pins.owners() | {
            TrainingOwner(c.coordinator, c.training_id) for _, c in self.contracts.funded()}

    async def sweep(self, closed: Callable[[TrainingOwner], Awaitable[bool]],
                    busy: Collection[TrainingOwner] = ()) -> list[TrainingOwner]:
        """Drop everything of each training ``closed`` says is closed (not the ``busy`` ones, with a job
        queued or running); a read that fails or times out leaves it for the next sweep. The dropped."""
        dropped = []
        for owner in self.owners() - set(busy):
            try:
                async with asyncio.timeout(CHAIN_READ_S):
                    if not await closed(owner):
                        continue
            except (AitbcError, TimeoutError, OSError):
                continue
            await self.forget(owner)
            dropped.append(owner)
        return dropped

    async def forget(self, owner: TrainingOwner) -> None:
        await self.tasks.forget_training(owner)
        await self.kept.forget_training(owner)
        await self.pins.forget_training(owner)
        self.job_ids.forget(owner.hex)
        for key, contract in self.contracts.funded():
            if TrainingOwner(contract.coordinator, contract.training_id) == owner:
                self.contracts.remove(key)
