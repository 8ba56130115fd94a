"""Provider liveness as the coordinator sees it: its workers' heartbeats as they arrive, pings on demand.

Only a provider running a job heartbeats, so a coordinator listens to its own workers' topics, one
subscription each, never to the whole market's (docs/scale.md, "Liveness").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from ...errors import MessagingError
from ...messaging import SignedChannel, topics
from ...records import Heartbeat, Ping, Pong, new_id

log = logging.getLogger(__name__)


class LivenessWatch:
    """``async with LivenessWatch(channel) as watch``; ``await watch.follow(workers)`` listens to those
    workers' heartbeats, and ``watch.last_seen[provider]`` is the monotonic time of the latest."""

    def __init__(self, channel: SignedChannel) -> None:
        self._channel = channel
        self.last_seen: dict[str, float] = {}
        self._followed: dict[str, asyncio.Task[None]] = {}

    async def __aenter__(self) -> LivenessWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = list(self._followed.values())
        self._followed.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def followed(self) -> frozenset[str]:
        return frozenset(self._followed)

    async def follow(self, workers: Iterable[str]) -> None:
        """Listen to exactly ``workers``: new ones are subscribed (returns once the broker has them), the
        others are let go. A subscription that failed is tried again on the next call."""
        wanted = set(workers)
        for provider in [p for p, task in self._followed.items() if p not in wanted or task.done()]:
            self._followed.pop(provider).cancel()
        ready = []
        for provider in wanted - set(self._followed):
            subscribed = asyncio.Event()
            self._followed[provider] = asyncio.create_task(self._listen(provider, subscribed))
            ready.append(subscribed.wait())
        await asyncio.gather(*ready)

    async def _listen(self, provider: str, subscribed: asyncio.Event) -> None:
        try:
            async with self._channel.subscribe(topics.heartbeat(provider), Heartbeat) as beats:
                subscribed.set()
                async for verified in beats:
                    if verified.sender == provider == verified.message.provider:
                        self.last_seen[provider] = time.monotonic()
        except MessagingError as exc:  # the bus is failing: pings and results still decide
            log.warning("heartbeats of %s: %s", provider, exc)
        finally:
            subscribed.set()

    async def ping(self, provider: str, timeout: float) -> bool:
        """True when ``provider`` answers a signed ping within ``timeout`` seconds."""
        if not await ping(self._channel, provider, timeout):
            return False
        self.last_seen[provider] = time.monotonic()
        return True


async def ping(channel: SignedChannel, provider: str, timeout: float) -> bool:
    """Send ``provider`` a signed ping; True when its signed pong comes back within ``timeout``."""
    nonce = new_id("ping")
    try:
        await channel.request(topics.ping(provider), Ping(nonce=nonce, sent_at=time.time()),
                              topics.pong(channel.address, nonce), Pong, timeout=timeout, expected_sender=provider)
    except MessagingError:
        return False
    return True
