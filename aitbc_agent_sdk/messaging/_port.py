"""The message-bus port: publish bytes to a topic, subscribe with MQTT wildcards."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True, weakref_slot=True)  # a channel remembers deliveries it checked, weakly
class BusMessage:
    topic: str
    payload: bytes
    retained: bool = False


@dataclass(frozen=True, slots=True)
class LastWill:
    """What the broker publishes for a client whose connection dies without a goodbye
    (by default: an empty retained message, which clears the retained state on ``topic``)."""

    topic: str
    payload: bytes = b""
    retain: bool = True


@runtime_checkable
class Bus(Protocol):
    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        ...

    def subscribe(self, topic_filter: str) -> AbstractAsyncContextManager[AsyncIterator[BusMessage]]:
        """``async with bus.subscribe("a/+/b") as messages: async for m in messages``.

        The iterator raises MessagingError when the connection is lost instead of hanging.
        """
        ...


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching: ``+`` is one level, ``#`` is the rest (including none)."""
    f_parts = topic_filter.split("/")
    t_parts = topic.split("/")
    for i, part in enumerate(f_parts):
        if part == "#":
            return True
        if i >= len(t_parts):
            return False
        if part != "+" and part != t_parts[i]:
            return False
    return len(f_parts) == len(t_parts)
