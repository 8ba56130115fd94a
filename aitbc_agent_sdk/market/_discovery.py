"""Discovery: read the providers' retained, signed offers from the bus, and keep only bonded providers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING

from ..messaging import topics
from ..records import Offer, Worker

if TYPE_CHECKING:
    from ..messaging import SignedChannel

log = logging.getLogger(__name__)

# An identity costs nothing, so a bond is what makes a sybil pay (docs/threat-model.md, "Stake before
# strangers' work"): ten times the registry's own floor (MIN_STAKE, 0.001 ETH), one round's price on the devnet.
DEFAULT_MIN_STAKE_WEI = 10**16


async def collect_offers(channel: SignedChannel, *, timeout: float = 2.0, quiet: float = 0.2) -> list[Offer]:
    """Gather offers until none arrived for ``quiet`` seconds, or ``timeout`` passed.

    Retained offers arrive at once on subscribe; the quiet period catches stragglers.
    An offer counts only when the envelope's signer is the provider it names.
    """
    offers: dict[str, Offer] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with channel.subscribe(topics.OFFERS, Offer) as stream:
        iterator = aiter(stream)
        while (remaining := deadline - loop.time()) > 0:
            try:
                verified = await asyncio.wait_for(anext(iterator), min(quiet, remaining))
            except TimeoutError:
                break
            if verified.sender != verified.message.provider:
                log.warning("offer for %s signed by %s dropped", verified.message.provider, verified.sender)
                continue
            offers[verified.message.provider] = verified.message
    return sorted(offers.values(), key=lambda o: o.provider)


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
