"""The provider's table of accepted contracts: free proposals can never push out paid work.

A proposal costs its sender nothing, so agreeing to one only takes a place in a small pool for
the unfunded, rate-limited per sender and overall. A contract moves to the funded table once the
chain shows its slot funded (checked before its first job); only its training's close on chain
removes it from there. Contracts are keyed by (coordinator, contract id): an id is a string any
coordinator may choose.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from ..records import ContractProposal

__all__ = ["BookLimits", "ContractBook", "ContractKey", "contract_key"]

ContractKey = tuple[str, str]  # (coordinator address in lower case, contract id)


def contract_key(coordinator: str, contract_id: str) -> ContractKey:
    return coordinator.lower(), contract_id


@dataclass(frozen=True)
class BookLimits:
    unfunded: int = 256  # proposals agreed to whose slot the chain has not shown funded yet
    funded: int = 4096  # contracts the chain showed funded; past it a new one is refused, none evicted
    per_sender_per_min: int = 30  # proposals one key may have recorded in a minute
    per_min: int = 600  # proposals recorded in a minute from everybody


class ContractBook:
    """Accepted contracts by (coordinator, contract id), in two pools.

    Unfunded contracts are forgotten least recently used first when their pool is full (see
    ``overflow``); funded ones are never evicted. ``forget`` is told of every contract dropped, so caches keyed by it go too.
    """

    def __init__(self, limits: BookLimits = BookLimits(), *, forget: Callable[[ContractKey], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._forget = forget
        self._clock = clock
        self._unfunded: OrderedDict[ContractKey, ContractProposal] = OrderedDict()
        self._funded: dict[ContractKey, ContractProposal] = {}
        self._recent: deque[tuple[float, str]] = deque()  # (when, sender) of recorded proposals, last minute

    def get(self, key: ContractKey) -> ContractProposal | None:
        if (found := self._funded.get(key)) is not None:
            return found
        if (found := self._unfunded.get(key)) is not None:
            self._unfunded.move_to_end(key)
        return found

    def is_funded(self, key: ContractKey) -> bool:
        return key in self._funded

    def admit(self, proposal: ContractProposal) -> str | None:
        """Record a proposal as unfunded; why it is declined instead (rate limits, an id in use), or None."""
        key = contract_key(proposal.coordinator, proposal.contract_id)
        if key in self._funded:
            same = self._funded[key] == proposal
            return None if same else f"contract {proposal.contract_id} is already funded with other terms"
        now = self._clock()
        while self._recent and self._recent[0][0] <= now - 60.0:
            self._recent.popleft()
        sender = key[0]
        if sum(1 for _, s in self._recent if s == sender) >= self.limits.per_sender_per_min:
            return f"too many proposals from {proposal.coordinator}: at most {self.limits.per_sender_per_min} a minute"
        if len(self._recent) >= self.limits.per_min:
            return f"too many proposals: at most {self.limits.per_min} a minute from everybody"
        self._recent.append((now, sender))
        self._unfunded[key] = proposal
        self._unfunded.move_to_end(key)
        return None

    def overflow(self) -> ContractKey | None:
        """The least recently used unfunded contract while that pool is over its bound: the caller asks
        the chain whether it is funded after all (then ``fund``) before it goes (``remove``)."""
        if len(self._unfunded) <= self.limits.unfunded:
            return None
        return next(iter(self._unfunded))

    async def trim(self, funded_on_chain: Callable[[ContractProposal], Awaitable[bool]]) -> None:
        """Forget the least recently used unfunded contracts past the pool's bound. One the chain shows
        funded after all (its coordinator opened the escrow, no job came yet) moves to the funded table."""
        while (key := self.overflow()) is not None:
            proposal = self._unfunded[key]
            if not await funded_on_chain(proposal) or self.fund(key) is not None:
                self.remove(key)

    def fund(self, key: ContractKey) -> str | None:
        """Move a contract the chain showed funded to the funded table; why not (full, unknown), or None."""
        if key in self._funded:
            return None
        proposal = self._unfunded.get(key)
        if proposal is None:
            return "the contract was forgotten before its slot was funded"
        if len(self._funded) >= self.limits.funded:
            return f"this provider holds {len(self._funded)} funded contracts, its most"
        del self._unfunded[key]
        self._funded[key] = proposal
        return None

    def remove(self, key: ContractKey) -> None:
        if self._funded.pop(key, None) is not None or self._unfunded.pop(key, None) is not None:
            self._forget(key)

    def funded(self) -> Iterator[tuple[ContractKey, ContractProposal]]:
        return iter(list(self._funded.items()))

    def __len__(self) -> int:
        return len(self._funded) + len(self._unfunded)
