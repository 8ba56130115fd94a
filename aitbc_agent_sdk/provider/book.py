"""The provider's table of accepted contracts, bounded so a flood of proposals cannot grow it without end."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping

from ..models import ContractProposal


class ContractBook(MutableMapping[str, ContractProposal]):
    """Contracts by id, least recently used first.

    Adding one beyond ``max_size`` forgets contracts idle for ``idle_s`` and then the least
    recently used ones, never one ``pinned`` says is still in use (a job queued, running or
    awaiting a re-send). ``forget`` is told of each contract dropped, so caches keyed by it go too.
    """

    def __init__(self, max_size: int, idle_s: float, *, pinned: Callable[[str], bool],
                 forget: Callable[[str], None] = lambda _: None, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_size = max_size
        self.idle_s = idle_s
        self._pinned = pinned
        self._forget = forget
        self._clock = clock
        self._items: OrderedDict[str, tuple[ContractProposal, float]] = OrderedDict()

    def __getitem__(self, contract_id: str) -> ContractProposal:
        proposal, _ = self._items[contract_id]
        self._items[contract_id] = (proposal, self._clock())  # a job or cancel for it: in use
        self._items.move_to_end(contract_id)
        return proposal

    def __setitem__(self, contract_id: str, proposal: ContractProposal) -> None:
        self._items[contract_id] = (proposal, self._clock())
        self._items.move_to_end(contract_id)
        self._trim()

    def __delitem__(self, contract_id: str) -> None:
        del self._items[contract_id]
        self._forget(contract_id)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def _trim(self) -> None:
        if len(self._items) <= self.max_size:
            return
        cutoff = self._clock() - self.idle_s
        expired = [cid for cid, (_, used) in self._items.items() if used < cutoff and not self._pinned(cid)]
        for cid in expired:
            del self[cid]
        for cid in list(self._items):  # oldest first
            if len(self._items) <= self.max_size:
                break
            if not self._pinned(cid):
                del self[cid]
