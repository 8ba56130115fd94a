"""Discovery: read the providers' retained, signed offers from the bus, and keep only bonded providers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING

from ..errors import MessagingError
from ..messaging import topics
from ..records import Offer, Worker

if TYPE_CHECKING:
    from ..messaging import SignedChannel, Verified

log = logging.getLogger(__name__)

# An identity costs nothing, so a bond is what makes a sybil pay (docs/threat-model.md, "Stake before
# strangers' work"): ten times the registry's own floor (MIN_STAKE, 0.001 ETH), one round's price on the devnet.
DEFAULT_MIN_STAKE_WEI = 10**16
MAX_READ_S = 120.0  # reading a market's retained offers: about 5 s per 10,000 on a 2-core machine


async def collect_offers(channel: SignedChannel, *, timeout: float = 2.0, quiet: float = 0.2) -> list[Offer]:
    """Gather the retained offers: until the first change since subscribing (every retained one came before
    it), or none arrived for ``quiet`` seconds after the first, or ``timeout`` passed.

    On a market of thousands some offer is refreshed every few milliseconds, so it is never quiet; on a
    small one the quiet period ends the read. It starts with the first offer, not the subscription: on a
    busy machine the first can take longer than ``quiet``. An offer counts only when the envelope's signer
    is the provider it names.
    """
    offers: dict[str, Offer] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with channel.subscribe_states(topics.OFFERS, Offer) as stream:
        iterator = aiter(stream)
        while (remaining := deadline - loop.time()) > 0:
            try:
                topic, verified, retained = await asyncio.wait_for(
                    anext(iterator), min(quiet, remaining) if offers else remaining)
            except TimeoutError:
                break
            if not retained and offers:
                break  # a change since subscribing: the retained burst is in
            if verified is None:
                offers.pop(topic.rsplit("/", 1)[-1], None)
            elif verified.sender != verified.message.provider:
                log.warning("offer for %s signed by %s dropped", verified.message.provider, verified.sender)
            else:
                offers[verified.message.provider] = verified.message
    return sorted(offers.values(), key=lambda o: o.provider)


class OfferBook:
    """The market's current offers, kept by one subscription while a coordinator discovers.

    Every discovery of one coordinator reads the book rather than subscribing anew, so trainings started at
    once share one read of the retained offers, and a later discovery verifies only the offers that changed.
    An offer leaves the book when its provider clears it (its goodbye, or the last will the broker publishes
    when it dies) or when it is older than ``max_age_s``. Nobody asking for ``idle_s`` closes the subscription.
    """

    def __init__(self, channel: SignedChannel, *, quiet: float = 0.2, idle_s: float = 60.0,
                 max_age_s: float = 120.0) -> None:
        self._channel = channel
        self._quiet = quiet
        self._idle_s = idle_s
        self._max_age_s = max_age_s
        self._offers: dict[str, tuple[Offer, float]] = {}  # provider -> (offer, when it was signed)
        self._first = asyncio.Event()  # an offer came
        self._settled = asyncio.Event()  # the retained burst is in
        self._task: asyncio.Task[None] | None = None
        self._last_use = 0.0
        self._last_change = 0.0

    async def offers(self, *, timeout: float) -> list[Offer]:
        """The current offers. The first call waits at most ``timeout`` for a first offer, then for the rest of
        the retained ones however long a large market takes to read (``MAX_READ_S`` at most): a discovery
        that returned half a market would hire from the wrong half."""
        loop = asyncio.get_running_loop()
        self._last_use = loop.time()
        if self._task is None or self._task.done():
            self._offers.clear()
            self._first, self._settled = asyncio.Event(), asyncio.Event()
            self._task = asyncio.create_task(self._follow(), name="offer-book")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first.wait(), timeout)
            await asyncio.wait_for(self._settled.wait(), MAX_READ_S)
        oldest = time.time() - self._max_age_s
        return sorted((offer for offer, signed in self._offers.values() if signed >= oldest),
                      key=lambda o: o.provider)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with self._channel.subscribe_states(topics.OFFERS, Offer) as states:
                reader = asyncio.create_task(self._read(states))
                try:
                    while not reader.done() and loop.time() - self._last_use <= self._idle_s:
                        await asyncio.wait([reader], timeout=self._quiet)
                        if self._offers and loop.time() - self._last_change >= self._quiet:
                            self._settled.set()  # offers came, then none for a while: a small market
                finally:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                if not reader.cancelled() and (error := reader.exception()) is not None:
                    raise error
        except MessagingError as exc:  # the next discovery subscribes again
            log.warning("offer book: %s", exc)

    async def _read(self, states: AsyncIterator[tuple[str, Verified[Offer] | None, bool]]) -> None:
        loop = asyncio.get_running_loop()
        async for topic, verified, retained in states:
            self._take(topic, verified)
            self._last_change = loop.time()
            self._first.set()
            if not retained:  # a change since subscribing: every retained offer came before it
                self._settled.set()

    def _take(self, topic: str, verified: Verified[Offer] | None) -> None:
        provider = topic.rsplit("/", 1)[-1]
        if verified is None:
            self._offers.pop(provider, None)
        elif verified.sender == verified.message.provider == provider:
            self._offers[provider] = (verified.message, verified.sent_at)
        else:
            log.warning("offer for %s on %s signed by %s dropped", verified.message.provider, topic, verified.sender)


def leave_out_held(workers: Sequence[Worker], held_slots: Mapping[str, int], count: int) -> list[Worker]:
    """``workers`` without the providers whose every slot is already held (``held_slots``: provider -> slots
    held), unless that leaves fewer than ``count``: then all of them, and a job queues behind another."""
    unheld = [w for w in workers if held_slots.get(w.worker_id, 0) < w.offer.slots]
    return unheld if len(unheld) >= count else list(workers)


def resolve_min_stake(requested_wei: int | None, network_wei: int | None) -> int:
    """The bond a hire needs: the training's own choice, else the network's, else the default."""
    for choice in (requested_wei, network_wei):
        if choice is not None:
            return choice
    return DEFAULT_MIN_STAKE_WEI


def split_by_stake(workers: Sequence[Worker], min_stake_wei: int) -> tuple[list[Worker], dict[str, int]]:
    """(workers bonded with at least ``min_stake_wei``, {provider: its bond} for the others)."""
    kept = [w for w in workers if w.stake_wei >= min_stake_wei]
    skipped = {w.worker_id: w.stake_wei for w in workers if w.stake_wei < min_stake_wei}
    return kept, skipped


def eth_amount(wei: int) -> str:
    """Wei as exact ETH, without trailing zeros: 0.01, 1, 0."""
    return f"{Decimal(wei).scaleb(-18).normalize():f}"


def stake_skip_text(skipped: int, min_stake_wei: int) -> str:
    """What the user reads about offers left out for their bond: '3 offers skipped: stake below 0.01 ETH'."""
    return f"{skipped} offer{'s' if skipped != 1 else ''} skipped: stake below {eth_amount(min_stake_wei)} ETH"
