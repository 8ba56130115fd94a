"""What a provider pinned in its content store for each training, unpinned once the chain shows it closed.

A provider adds its results' checkpoints, the boundary states a spot check opens (a gigabyte each at
GPT-2 size) and, as a verifier, the end states it re-executed. Its coordinator fetches them while the
training is open; pinned for ever they would fill the provider's disk. They are unpinned when the
training's sweep drops it; the node's garbage collection then frees the blocks (kubo's ``--enable-gc``,
or ``ipfs repo gc``). Keyed by the training's on-chain identity: a CID another open training also
pinned (the same bytes) stays pinned.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import AitbcError
from ..storage import ContentStore
from ._owners import TrainingOwner

__all__ = ["TrainingPins"]

log = logging.getLogger(__name__)


class TrainingPins:
    def __init__(self, store: ContentStore) -> None:
        self.store = store
        self._pinned: dict[TrainingOwner, set[str]] = {}

    async def add(self, owner: TrainingOwner, data: bytes | Path) -> str:
        """Add and pin ``data`` for ``owner``'s training; its CID."""
        cid = await self.store.add(data)
        self._pinned.setdefault(owner, set()).add(cid)
        return cid

    def owners(self) -> set[TrainingOwner]:
        return set(self._pinned)

    def pinned(self, owner: TrainingOwner) -> frozenset[str]:
        return frozenset(self._pinned.get(owner, ()))

    async def forget_training(self, owner: TrainingOwner) -> None:
        """Unpin what ``owner``'s training alone pinned; a failed unpin is logged (the node's own pin list
        still names it), never raised into the sweep."""
        held = self._pinned.pop(owner, set())
        shared = set().union(*self._pinned.values()) if self._pinned else set()
        for cid in sorted(held - shared):
            try:
                await self.store.unpin(cid)
            except AitbcError as exc:
                log.warning("could not unpin %s of closed training %s: %s", cid, owner.training_id, exc)
