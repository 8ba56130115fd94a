"""Provider liveness as the coordinator sees it: heartbeats as they arrive, pings on demand."""

from __future__ import annotations

import asyncio
import time

from ...errors import MessagingError
from ...messaging import SignedChannel, topics
from ...records import Heartbeat, Ping, Pong, new_id


class LivenessWatch:
    """``async with LivenessWatch(channel) as watch``: ``watch.last_seen[provider]`` is monotonic time."""

    def __init__(self, channel: SignedChannel) -> None:
        self._channel = channel
        self.last_seen: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LivenessWatch:
        ready = asyncio.Event()
        self._task = asyncio.create_task(self._listen(ready))
        await ready.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _listen(self, ready: asyncio.Event) -> None:
        async with self._channel.subscribe(topics.HEARTBEATS, Heartbeat) as beats:
            ready.set()
            async for verified in beats:
                if verified.sender == verified.message.provider:
                    self.last_seen[verified.sender] = time.monotonic()

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
