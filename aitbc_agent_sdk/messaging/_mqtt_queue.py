"""One ``MqttBus.subscribe()`` context's bounded queue (see _mqtt.py for the backpressure it gives)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from ..errors import MessagingError
from ._port import BusMessage


class Subscription:
    """A bounded FIFO for one ``subscribe()`` context; it raises once the bus has failed."""

    def __init__(self, topic_filter: str, maxsize: int) -> None:
        self.topic_filter = topic_filter
        self._items: deque[BusMessage] = deque()
        self._maxsize = maxsize
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._error: MessagingError | None = None
        self._closed = False

    async def put(self, message: BusMessage) -> None:
        # Waiting here stalls the dispatcher and therefore the acks: that is the backpressure.
        while len(self._items) >= self._maxsize and not self._closed:
            self._writable.clear()
            await self._writable.wait()
        if not self._closed:
            self._items.append(message)
            self._readable.set()

    def adopt(self, messages: list[BusMessage]) -> None:
        self._items.extend(messages)
        self._readable.set()

    def fail(self, error: MessagingError) -> None:
        self._error = error
        self._readable.set()

    def close(self) -> None:
        self._closed = True
        self._writable.set()

    async def messages(self) -> AsyncIterator[BusMessage]:
        while True:
            # Hand out what was already acknowledged before reporting a failure.
            while self._items:
                message = self._items.popleft()
                self._writable.set()
                yield message
            if self._error is not None:
                raise self._error
            self._readable.clear()
            await self._readable.wait()
