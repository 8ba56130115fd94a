"""Typed, signed publish/subscribe on top of any Bus adapter."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

from eth_account.signers.local import LocalAccount
from pydantic import BaseModel

from ..errors import MessagingError, SignatureError
from ._envelope import EnvelopeSigner, EnvelopeVerifier, Verified
from ._port import Bus, BusMessage

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


class SignedChannel:
    """One agent's view of the bus: everything it sends is signed, everything it reads is verified."""

    def __init__(self, bus: Bus, account: LocalAccount, *, verifier: EnvelopeVerifier | None = None) -> None:
        self._bus = bus
        self._signer = EnvelopeSigner(account)
        # A bus built from BusSettings knows the market's clock-skew window and where its
        # session keeps the nonces it has seen; a bare bus gets the defaults, in memory.
        make = getattr(bus, "make_verifier", None)
        self.verifier = verifier or (make(account.address) if make is not None else EnvelopeVerifier())
        # The bus hands one delivery (one BusMessage object) to every subscription it matches: two trainings
        # following one worker both see its heartbeat. The nonce is checked once per delivery, not per copy.
        # Weakly: a delivery is remembered while some subscription still holds a copy of it.
        self._checked: weakref.WeakValueDictionary[int, BusMessage] = weakref.WeakValueDictionary()

    @property
    def address(self) -> str:
        return self._signer.address

    async def publish(self, topic: str, message: BaseModel, *, retain: bool = False) -> None:
        await self._bus.publish(topic, self._signer.seal(topic, message, retain=retain), retain=retain)

    async def clear_retained(self, topic: str) -> None:
        await self._bus.publish(topic, b"", retain=True)

    @asynccontextmanager
    async def subscribe(self, topic_filter: str, model: type[M]) -> AsyncIterator[AsyncIterator[Verified[M]]]:
        async with self._bus.subscribe(topic_filter) as messages:
            yield self._verified(messages, model)

    @asynccontextmanager
    async def subscribe_states(self, topic_filter: str, model: type[M]
                               ) -> AsyncIterator[AsyncIterator[tuple[str, Verified[M] | None, bool]]]:
        """Retained states as they change: ``(topic, verified, retained)``, with None for a state that was
        cleared (an empty retained message: its owner's goodbye, or its last will). ``retained`` is True for
        the states the broker sent because the subscription was made, False for a change since: the first
        False says the retained burst is in, however busy the topics are."""
        async with self._bus.subscribe(topic_filter) as messages:
            yield self._states(messages, model)

    async def _states(self, messages: AsyncIterator[BusMessage],
                      model: type[M]) -> AsyncIterator[tuple[str, Verified[M] | None, bool]]:
        async for raw in messages:
            if not raw.payload:
                yield raw.topic, None, raw.retained
            elif (verified := self._open(raw, model)) is not None:
                yield raw.topic, verified, raw.retained

    async def _verified(self, messages: AsyncIterator[BusMessage], model: type[M]) -> AsyncIterator[Verified[M]]:
        # A retained state (an offer) is legitimately delivered again to each subscription, and
        # again after a reconnect: accept it once per subscription, while it is fresh. Everything
        # else, retained or not, passes the (persisted) seen-nonce check.
        retained_here: set[tuple[str, int]] = set()
        async for raw in messages:
            if not raw.payload:  # a cleared retained message
                continue
            verified = self._open(raw, model)
            if verified is None:
                continue
            if raw.retained:
                key = (verified.sender, verified.nonce)
                if key in retained_here:
                    continue
                retained_here.add(key)
            yield verified

    def _open(self, raw: BusMessage, model: type[M]) -> Verified[M] | None:
        """The verified message, or None (logged; the verifier counts why)."""
        fanned_out = self._checked.get(id(raw)) is raw
        try:
            verified = self.verifier.open(raw.topic, raw.payload, model, retained=raw.retained,
                                          check_replay=not raw.retained and not fanned_out)
        except SignatureError as exc:
            log.warning("%s", exc)
            return None
        if not fanned_out:
            self._checked[id(raw)] = raw
        return verified

    async def request(self, topic: str, message: BaseModel, reply_topic: str, reply_model: type[M],
                      *, timeout: float, expected_sender: str) -> M:
        """Publish and wait for one verified reply from ``expected_sender`` on ``reply_topic``."""
        async with self.subscribe(reply_topic, reply_model) as replies:
            await self.publish(topic, message)
            try:
                async with asyncio.timeout(timeout):
                    async for reply in replies:
                        if reply.sender == expected_sender:
                            return reply.message
            except TimeoutError as exc:
                raise MessagingError(f"no reply on {reply_topic} within {timeout:.1f}s") from exc
        raise MessagingError(f"subscription to {reply_topic} ended without a reply")
