"""In-process bus with MQTT semantics (wildcards, retained messages, bounded queues)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..errors import MessagingError
from ._port import BusMessage, topic_matches

_CLOSED = object()


class _Subscription:
    def __init__(self, topic_filter: str, maxsize: int) -> None:
        self.topic_filter = topic_filter
        self.queue: asyncio.Queue[BusMessage | object] = asyncio.Queue(maxsize)

    async def messages(self) -> AsyncIterator[BusMessage]:
        while True:
            item = await self.queue.get()
            if item is _CLOSED:
                raise MessagingError("in-memory bus closed")
            assert isinstance(item, BusMessage)
            yield item


class InMemoryBus:
    """The embedded bus. Publishing blocks when a subscriber's queue is full (backpressure)."""

    def __init__(self, *, queue_size: int = 1024) -> None:
        self._queue_size = queue_size
        self._subscriptions: list[_Subscription] = []
        self._retained: dict[str, bytes] = {}
        self._closed = False

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if self._closed:
            raise MessagingError("in-memory bus closed")
        if "+" in topic or "#" in topic:
            raise MessagingError(f"cannot publish to a wildcard topic: {topic!r}")
        if retain:
            # MQTT: an empty retained payload clears the retained message.
            if payload:
                self._retained[topic] = payload
            else:
                self._retained.pop(topic, None)
        message = BusMessage(topic, payload, retained=False)
        for sub in list(self._subscriptions):
            if topic_matches(sub.topic_filter, topic):
                await sub.queue.put(message)

    @asynccontextmanager
    async def subscribe(self, topic_filter: str) -> AsyncIterator[AsyncIterator[BusMessage]]:
        if self._closed:
            raise MessagingError("in-memory bus closed")
        sub = _Subscription(topic_filter, self._queue_size)
        for topic, payload in list(self._retained.items()):
            if topic_matches(topic_filter, topic):
                sub.queue.put_nowait(BusMessage(topic, payload, retained=True))
        self._subscriptions.append(sub)
        try:
            yield sub.messages()
        finally:
            self._subscriptions.remove(sub)

    async def close(self) -> None:
        self._closed = True
        for sub in self._subscriptions:
            # Drop pending items so the close marker always fits.
            while not sub.queue.empty():
                sub.queue.get_nowait()
            sub.queue.put_nowait(_CLOSED)
