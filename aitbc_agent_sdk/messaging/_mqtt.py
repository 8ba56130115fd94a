"""The MQTT adapter for the Bus port (aiomqtt 2.x, MQTT 3.1.1, QoS 1 everywhere).

- One aiomqtt connection per ``MqttBus``. A supervisor task owns it: it connects,
  re-subscribes, runs the dispatcher, and reconnects with backoff when the broker goes away.
- The dispatcher reads ``client.messages`` and routes each message to the bounded queue of
  every open subscription whose filter matches it. A message is PUBACKed only once it is
  queued (manual ack), so a full queue holds the broker back (its in-flight window, 20
  messages on mosquitto) instead of dropping a message the broker already counts as delivered.
- Persistent sessions use MQTT 3.1.1 ``clean_session=False`` with a stable ``client_id``
  rather than MQTT 5 clean-start + session expiry, because the amqtt fallback broker only
  speaks 3.1.1. Mosquitto keeps such a session (its subscriptions and the QoS 1 messages
  queued for it) until the client unsubscribes, and across restarts when persistence is on.
- Leaving a ``subscribe()`` context unsubscribes at the broker (unless another open context
  uses the same filter). Closing the bus, crashing, or losing the network does not: the
  session keeps queueing, and the next connection with the same ``client_id`` gets the
  messages sent meanwhile. Messages that arrive before the matching ``subscribe()`` is
  opened again are held (up to ``queue_size``) and handed to it when it opens.
- Delivery is at least once: a publish retried across a reconnect, or a message that was
  queued but not yet acknowledged when the connection dropped, can arrive twice. Signed
  envelopes drop the second copy as a replay.
- A ``LastWill`` is published by the broker for the client when its connection dies without a
  DISCONNECT (a crash, a lost network, a keepalive that lapsed). A provider's will clears its
  retained offer, so the market forgets a dead provider without anyone heartbeating.
- Strangers share the broker: ``username``/``password`` and a TLS ``ssl.SSLContext`` log in,
  a payload over ``max_message_bytes`` is refused on publish and dropped (and acknowledged)
  on receipt, and the held buffer is bounded in messages and in bytes.
  ``BusSettings`` (messaging/_settings.py) builds all of this from a profile: ``connect_bus``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import ssl
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import TypeVar

import aiomqtt
from aiomqtt.exceptions import MqttConnectError

from ..errors import BrokerUnreachableError, ConfigError, MessagingError
from ._envelope import EnvelopeVerifier
from ._filters import FilterIndex, RecentFilters, is_wildcard
from ._mqtt_queue import Subscription as _Subscription
from ._port import BusMessage, LastWill, topic_matches

T = TypeVar("T")
log = logging.getLogger(__name__)

_MIN_BACKOFF_S = 0.1
_HELD_MAX_BYTES = 16 << 20  # messages held for a subscription not yet (re)opened, at most
WITHDRAWN_FILTERS = 4096  # of each kind: a late arrival on one forgotten is held, within the bounds above


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class _Connection:
    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class MqttBus:
    """``async with MqttBus(host, port, client_id=...) as bus``: the Bus port over one MQTT connection.

    ``timeout`` bounds every call (connect, publish, subscribe, unsubscribe), outages included:
    a publish during an outage waits for the reconnect rather than failing at once.
    With ``reconnect=False``, or once the broker has been unreachable for ``max_outage_s``,
    the bus fails: open subscription iterators raise MessagingError and so does publish.
    """

    def __init__(self, host: str, port: int = 1883, *, client_id: str, persistent: bool = True,
                 keepalive: int = 30, timeout: float = 10.0, queue_size: int = 1024,
                 reconnect: bool = True, max_backoff_s: float = 5.0, max_outage_s: float = 60.0,
                 username: str | None = None, password: str | None = None, tls: ssl.SSLContext | None = None,
                 max_message_bytes: int = 1 << 20, will: LastWill | None = None,
                 verifier_factory: Callable[[str], EnvelopeVerifier] | None = None, name: str | None = None) -> None:
        if not client_id:
            raise ConfigError("MqttBus needs a stable, non-empty client_id (it names the persistent session)")
        if timeout <= 0 or queue_size < 1 or max_backoff_s < _MIN_BACKOFF_S or max_outage_s <= 0:
            raise ConfigError("MqttBus: timeout, queue_size, max_backoff_s and max_outage_s must be positive")
        if max_message_bytes < 1:
            raise ConfigError("MqttBus: max_message_bytes must be positive")
        self.host, self.port, self.client_id = host, port, client_id
        self.name = name or client_id  # for logs and errors: a session's id itself is a secret
        self.username = username
        self._password = password
        self._tls = tls
        self.max_message_bytes = max_message_bytes
        if will is not None and (not will.topic or is_wildcard(will.topic)):
            raise ConfigError(f"MqttBus: a last will needs a plain topic, not {will.topic!r}")
        self._will = will
        self.oversized = 0  # received payloads over max_message_bytes, dropped
        self._verifier_factory = verifier_factory
        self.persistent = persistent
        self.timeout = timeout
        self.reconnects = 0  # successful reconnects after the first connection
        self.dropped = 0  # messages no open subscription wanted (see _route)
        self._keepalive = keepalive
        self._queue_size = queue_size
        self._reconnect = reconnect
        self._max_backoff_s = max_backoff_s
        self._max_outage_s = max_outage_s
        self._state = _State.NEW
        self._error: MessagingError | None = None
        self._conn: _Connection | None = None
        self._changed = asyncio.Event()  # set whenever a connection comes up or the bus fails
        self._subs: FilterIndex[_Subscription] = FilterIndex()
        self._refs: Counter[str] = Counter()  # open contexts per filter
        # Filters this bus left, the latest few thousand: late arrivals on them are dropped, not held.
        self._withdrawn = RecentFilters(WITHDRAWN_FILTERS)
        self._unsubscribe_later: set[str] = set()  # unsubscribes that failed during an outage
        self._held: deque[BusMessage] = deque()  # arrivals for filters not (yet) subscribed again
        self._held_bytes = 0
        self._sub_lock = asyncio.Lock()
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def make_verifier(self, address: str) -> EnvelopeVerifier:
        """The verifier a SignedChannel for ``address`` uses on this bus (see SignedChannel)."""
        return self._verifier_factory(address) if self._verifier_factory is not None else EnvelopeVerifier()

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> MqttBus:
        if self._state is not _State.NEW:
            raise MessagingError("an MqttBus cannot be reopened; create a new one (same client_id, same session)")
        self._state = _State.OPEN
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.create_task(self._supervise(first), name=f"mqtt-bus:{self.name}")
        try:
            await first
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Disconnect. Open subscriptions stay in the broker's session; their iterators raise."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._fail(MessagingError(f"MQTT bus {self.name} closed"))
        if self._supervisor is not None:
            self._supervisor.cancel()
            # wait() rather than await: the supervisor's CancelledError must not look like ours.
            await asyncio.wait((self._supervisor,))

    # -- the Bus port ------------------------------------------------------------------------

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if not topic or "+" in topic or "#" in topic:
            raise MessagingError(f"cannot publish to a wildcard or empty topic: {topic!r}")
        if len(payload) > self.max_message_bytes:
            raise MessagingError(f"cannot publish {len(payload)} bytes to {topic}:"
                                 f" the limit is {self.max_message_bytes}")
        await self._call(f"publish to {topic}",
                         lambda client, left: client.publish(topic, payload, qos=1, retain=retain, timeout=left))

    @asynccontextmanager
    async def subscribe(self, topic_filter: str) -> AsyncIterator[AsyncIterator[BusMessage]]:
        _check_filter(topic_filter)
        self._check_usable()
        sub = _Subscription(topic_filter, self._queue_size)
        async with self._sub_lock:
            # Route before the SUBACK: retained messages follow it immediately.
            self._subs.add(topic_filter, sub)
            held = self._take_held(topic_filter)
            sub.adopt(held)
            try:
                await self._call(f"subscribe to {topic_filter}",
                                 lambda client, left: client.subscribe(topic_filter, qos=1, timeout=left))
            except BaseException:
                self._subs.remove(topic_filter, sub)
                self._held.extendleft(reversed(held))
                self._held_bytes += sum(len(m.payload) for m in held)
                raise
            self._refs[topic_filter] += 1
            self._withdrawn.discard(topic_filter)
            self._unsubscribe_later.discard(topic_filter)
        try:
            yield sub.messages()
        finally:
            sub.close()
            self._subs.remove(topic_filter, sub)
            await self._release(topic_filter)

    # -- internals ---------------------------------------------------------------------------

    async def _release(self, topic_filter: str) -> None:
        async with self._sub_lock:
            self._refs[topic_filter] -= 1
            if self._refs[topic_filter] > 0:
                return
            del self._refs[topic_filter]
            if self._state is not _State.OPEN or self._error is not None:
                return  # closing or failed: the session keeps the subscription on purpose
            self._withdrawn.add(topic_filter)
            try:
                await self._call(f"unsubscribe from {topic_filter}",
                                 lambda client, left: client.unsubscribe(topic_filter, timeout=left))
            except MessagingError as exc:
                # Cleanup must not mask the context's own outcome; retry on the next connection.
                log.warning("%s; will unsubscribe after reconnecting", exc)
                self._unsubscribe_later.add(topic_filter)

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._state is not _State.OPEN:
            raise MessagingError(f"MQTT bus {self.name} is not open (use `async with MqttBus(...)`)")

    async def _call(self, what: str, op: Callable[[aiomqtt.Client, float], Awaitable[T]]) -> T:
        """One acknowledged broker call within ``timeout``, waiting through outages and retrying."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        cause: BaseException | None = None
        while (left := deadline - loop.time()) > 0:
            self._check_usable()
            conn = self._conn
            if conn is None:
                self._changed.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
                continue
            call = asyncio.ensure_future(op(conn.client, left))
            try:
                # aiomqtt does not fail pending calls on disconnect, so race the call against it.
                await asyncio.wait((call, conn.lost), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not call.done():
                    call.cancel()
            if call.done() and not call.cancelled():
                try:
                    return call.result()
                except aiomqtt.MqttError as exc:
                    cause = exc
                    # Usually the connection is dying under us: give the supervisor a moment.
                    await asyncio.wait((conn.lost,), timeout=min(0.2, max(deadline - loop.time(), 0)))
                except ValueError as exc:  # paho's verdict on the topic or payload: retrying cannot help
                    raise MessagingError(f"{what}: {exc}") from exc
        self._check_usable()
        state = "connected" if self.connected else "disconnected"
        raise MessagingError(f"{what}: no acknowledgement from the MQTT broker at {self.host}:{self.port}"
                             f" within {self.timeout:g}s ({state})") from cause

    def _client(self) -> aiomqtt.Client:
        client = aiomqtt.Client(
            self.host, self.port, identifier=self.client_id, protocol=aiomqtt.ProtocolVersion.V311,
            clean_session=not self.persistent, keepalive=self._keepalive, timeout=self.timeout,
            username=self.username, password=self._password, tls_context=self._tls,
            will=aiomqtt.Will(self._will.topic, self._will.payload, qos=1, retain=self._will.retain)
            if self._will is not None else None,
            # paho leaves Nagle on: a PUBACK followed by a PUBLISH would then wait for a delayed ACK.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )
        # aiomqtt 2.x has no switch for manual acknowledgement; paho's client does (see module doc).
        client._client.manual_ack_set(True)  # noqa: SLF001
        return client

    async def _supervise(self, first: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        backoff = _MIN_BACKOFF_S
        down_since = loop.time()
        cause: BaseException | None = None
        try:
            while True:
                client = self._client()
                try:
                    async with client:
                        conn = _Connection(client)
                        await self._resume(client)
                        if first.done():
                            self.reconnects += 1
                            log.info("MQTT bus %s reconnected to %s:%s", self.name, self.host, self.port)
                        else:
                            first.set_result(None)
                        self._conn = conn
                        self._changed.set()
                        backoff = _MIN_BACKOFF_S
                        try:
                            await self._dispatch(client)
                        finally:
                            self._conn = None
                            conn.lost.set_result(None)
                            down_since = loop.time()
                except aiomqtt.MqttError as exc:
                    cause = exc
                finally:
                    _settle(client)
                if not first.done() and _refused(cause):
                    # Retrying cannot fix a wrong password or an untrusted certificate: say so now.
                    raise MessagingError(f"the MQTT broker at {self.host}:{self.port} refused"
                                         f" {self.username or 'an anonymous client'}: {cause}") from cause
                if not first.done():
                    if loop.time() - down_since >= self.timeout:
                        raise BrokerUnreachableError(f"cannot connect to the MQTT broker at {self.host}:{self.port}"
                                             f" within {self.timeout:g}s: {cause}") from cause
                elif not self._reconnect:
                    raise MessagingError(f"lost the connection to the MQTT broker at {self.host}:{self.port}"
                                         f" (reconnect disabled): {cause}") from cause
                elif loop.time() - down_since >= self._max_outage_s:
                    raise BrokerUnreachableError(f"the MQTT broker at {self.host}:{self.port} stayed unreachable"
                                         f" for {self._max_outage_s:g}s: {cause}") from cause
                log.debug("MQTT bus %s: %s; retrying in %.1fs", self.name, cause, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
        except asyncio.CancelledError:
            if not first.done():
                first.set_exception(MessagingError(f"MQTT bus {self.name} closed while connecting"))
            raise
        except Exception as exc:  # noqa: BLE001 - whatever killed the supervisor must reach the users
            error = exc if isinstance(exc, MessagingError) else MessagingError(f"MQTT bus failed: {exc}")
            if error is not exc:
                error.__cause__ = exc
            self._fail(error)
            if not first.done():
                first.set_exception(error)

    async def _resume(self, client: aiomqtt.Client) -> None:
        """Re-subscribe the open filters (the broker may have lost the session) and finish unsubscribes."""
        for topic_filter in list(self._refs):
            await client.subscribe(topic_filter, qos=1)
        for topic_filter in list(self._unsubscribe_later):
            await client.unsubscribe(topic_filter)
            self._unsubscribe_later.discard(topic_filter)

    async def _dispatch(self, client: aiomqtt.Client) -> None:
        paho = client._client  # noqa: SLF001 - for the manual PUBACK
        async for message in client.messages:
            payload = message.payload if isinstance(message.payload, bytes) else bytes(message.payload or b"")
            if len(payload) > self.max_message_bytes:
                # Acknowledge and forget: a stranger's oversized message must not stall the session.
                self.oversized += 1
                log.warning("MQTT bus %s: dropped %d bytes on %s (limit %d)", self.name, len(payload),
                            message.topic.value, self.max_message_bytes)
            else:
                await self._route(BusMessage(message.topic.value, payload, bool(message.retain)))
            if message.qos > 0:
                paho.ack(message.mid, message.qos)

    async def _route(self, message: BusMessage) -> None:
        targets = self._subs.match(message.topic)
        for sub in targets:
            await sub.put(message)
        if targets:
            return
        if self._withdrawn.matches(message.topic):
            self.dropped += 1  # a late arrival for a filter this bus has left
            return
        # Most likely the session's queue from before this process subscribed: hold it, bounded
        # in count and in bytes (a stranger can flood topics this session still subscribes to).
        while self._held and (len(self._held) >= self._queue_size
                              or self._held_bytes + len(message.payload) > _HELD_MAX_BYTES):
            self._held_bytes -= len(self._held.popleft().payload)
            self.dropped += 1
            log.warning("MQTT bus %s: no subscription for held messages; dropping the oldest", self.name)
        self._held.append(message)
        self._held_bytes += len(message.payload)

    def _take_held(self, topic_filter: str) -> list[BusMessage]:
        taken = [m for m in self._held if topic_matches(topic_filter, m.topic)]
        if taken:
            self._held = deque(m for m in self._held if not topic_matches(topic_filter, m.topic))
            self._held_bytes -= sum(len(m.payload) for m in taken)
        return taken

    def _fail(self, error: MessagingError) -> None:
        if self._error is None:
            self._error = error
        for sub in self._subs:
            sub.fail(error)
        self._changed.set()


def _settle(client: aiomqtt.Client) -> None:
    """Mark aiomqtt's disconnect error as seen. When the link drops while the dispatcher is not
    waiting on ``client.messages`` (busy routing, re-subscribing) nothing else reads it, and
    asyncio would log "Future exception was never retrieved" for every such outage."""
    disconnected = client._disconnected  # noqa: SLF001
    if disconnected.done() and not disconnected.cancelled():
        disconnected.exception()


def _refused(exc: BaseException | None) -> bool:
    """A CONNACK saying bad credentials or not authorised (3.1.1 codes 4, 5; MQTT 5: 134, 135),
    or a TLS handshake that found the broker's certificate untrusted."""
    if isinstance(exc, MqttConnectError):
        return getattr(exc.rc, "value", exc.rc) in (4, 5, 134, 135)
    return exc is not None and "CERTIFICATE_VERIFY_FAILED" in str(exc)


def _check_filter(topic_filter: str) -> None:
    parts = topic_filter.split("/")
    bad = any(("+" in p and p != "+") or ("#" in p and p != "#") for p in parts) or "#" in parts[:-1]
    if not topic_filter or bad:
        raise MessagingError(f"invalid MQTT topic filter: {topic_filter!r}")
