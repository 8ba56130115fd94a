"""Discovery: read the providers' retained, signed offers from the bus."""

from __future__ import annotations

import asyncio
import logging

from ..messaging import SignedChannel, topics
from ..models import Offer

log = logging.getLogger(__name__)


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
