"""Attacks on the broker (#13, item 13), played against mosquitto configured as the devnet runs it:
a password file, an ACL, a message size limit, and TLS with a generated CA for ``--host``.

Before the fix the devnet broker allowed anonymous clients, every client could publish
anywhere, client ids were the predictable ``provider-{address}``, and there was no size limit
and no TLS setting: a stranger took over the provider's session and received 30 of its 30 jobs,
and an empty retained publish erased its offer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from eth_account import Account

from aitbc_agent_sdk.errors import MessagingError
from aitbc_agent_sdk.messaging import BusMessage, SignedChannel, topics
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.messaging._settings import connect_bus
from aitbc_agent_sdk.records import Hardware, Offer

JOBS = 30


async def take(messages: AsyncIterator[BusMessage], count: int, timeout: float = 20.0) -> list[BusMessage]:
    got: list[BusMessage] = []
    async with asyncio.timeout(timeout):
        async for message in messages:
            got.append(message)
            if len(got) == count:
                return got
    return got


async def test_a_stranger_with_the_providers_client_id_gets_none_of_its_jobs(secured_broker):
    provider, coordinator, stranger = Account.create(), Account.create(), Account.create()
    broker = secured_broker((provider.address, coordinator.address, stranger.address))
    settings = broker.settings()
    jobs_topic = topics.jobs(provider.address)
    # The provider daemon's session, opened as the daemon opens it (stack.open_bus).
    async with connect_bus(settings, f"provider-{provider.address}", identity=provider.address) as bus, \
            bus.subscribe(jobs_topic) as jobs:
        # The stranger has an account of its own and uses the provider's (old, predictable) client id,
        # reconnecting whenever it is kicked off; it subscribes to nothing: it wants the session's queue.
        thief = MqttBus("127.0.0.1", broker.port, client_id=f"provider-{provider.address}", persistent=True,
                        username=stranger.address, password=broker.auth.password(stranger.address))
        async with thief, connect_bus(settings, "coord-t1", identity=coordinator.address) as coord:
            for i in range(JOBS):
                await coord.publish(jobs_topic, f"job-{i}".encode())
            got = await take(jobs, JOBS)
            assert [m.payload for m in got] == [f"job-{i}".encode() for i in range(JOBS)]
            assert not thief._held and thief.dropped == 0, "the stranger received messages of the provider's session"
        assert bus.reconnects == 0, "the stranger knocked the provider off"


def offer_of(account) -> Offer:
    return Offer(provider=account.address, price_wei=10**16,
                 hardware=Hardware(cpu_model="test", cpu_cores=1, ram_bytes=1 << 30))


async def test_a_strangers_empty_retained_publish_leaves_the_providers_offer(secured_broker):
    provider, stranger = Account.create(), Account.create()
    broker = secured_broker((provider.address, stranger.address))
    settings = broker.settings()
    offer_topic = topics.offer(provider.address)
    async with connect_bus(settings, "p", identity=provider.address, persistent=False) as bus:
        await SignedChannel(bus, provider).publish(offer_topic, offer_of(provider), retain=True)
    async with connect_bus(settings, "s", identity=stranger.address, persistent=False) as bus:
        await bus.publish(offer_topic, b"", retain=True)  # the broker acknowledges, and must ignore it
        await SignedChannel(bus, stranger).publish(offer_topic, offer_of(stranger), retain=True)
        await bus.publish(topics.heartbeat(provider.address), b"forged", retain=True)
    async with connect_bus(settings, "reader", persistent=False) as bus:  # the observer account
        async with SignedChannel(bus, Account.create()).subscribe(topics.OFFERS, Offer) as offers:
            async with asyncio.timeout(10):
                first = await anext(offers)
    assert first.sender == provider.address and first.message.provider == provider.address


async def test_an_anonymous_client_or_a_wrong_password_is_refused(secured_broker):
    broker = secured_broker(("alice",))
    started = time.monotonic()
    with pytest.raises(MessagingError, match="refused"):
        async with connect_bus(broker.settings(accounts_dir=None), "anon", persistent=False):
            pass
    with pytest.raises(MessagingError, match="refused"):
        async with MqttBus("127.0.0.1", broker.port, client_id="x", persistent=False, username="alice",
                           password="guess"):
            pass
    assert time.monotonic() - started < 8, "a refusal should fail at once, not after retrying"


async def test_a_message_over_the_size_limit_is_dropped_on_publish_and_on_receipt(secured_broker):
    sender, receiver = Account.create(), Account.create()
    broker = secured_broker((sender.address, receiver.address), max_message_bytes=16 * 1024)
    topic = topics.results("t-size")
    big = b"x" * (broker.max_message_bytes + 1)
    async with connect_bus(broker.settings(), "r", identity=receiver.address, persistent=False) as bus_r, \
            bus_r.subscribe(topic) as inbox:
        async with connect_bus(broker.settings(), "s", identity=sender.address, persistent=False) as bus_s:
            with pytest.raises(MessagingError, match="limit"):
                await bus_s.publish(topic, big)  # the client refuses to send it
        # A client that would send it: the broker drops it.
        async with MqttBus("127.0.0.1", broker.port, client_id="big-sender", persistent=False,
                           username=sender.address, password=broker.auth.password(sender.address),
                           max_message_bytes=1 << 24) as raw:
            await raw.publish(topic, big)
            await raw.publish(topic, b"after")
        assert [m.payload for m in await take(inbox, 1)] == [b"after"]
    # A broker with a looser limit than the receiver's: the receiver drops it (and acknowledges it).
    async with connect_bus(broker.settings(max_message_bytes=2048), "r2", identity=receiver.address,
                           persistent=False) as small, small.subscribe(topic) as inbox:
        async with connect_bus(broker.settings(), "s2", identity=sender.address, persistent=False) as bus_s:
            await bus_s.publish(topic, b"y" * 4096)
            await bus_s.publish(topic, b"small")
        assert [m.payload for m in await take(inbox, 1)] == [b"small"]
        assert small.oversized == 1


async def test_the_host_brokers_tls_admits_clients_with_its_ca_and_no_others(secured_broker):
    alice = Account.create()
    broker = secured_broker((alice.address,), tls=True)
    topic = topics.heartbeat(alice.address)
    async with connect_bus(broker.settings(), "a", identity=alice.address, persistent=False) as bus, \
            bus.subscribe(topic) as inbox:
        await bus.publish(topic, b"over tls")
        assert [m.payload for m in await take(inbox, 1)] == [b"over tls"]
    with pytest.raises(MessagingError, match="CERTIFICATE_VERIFY_FAILED"):  # the system's CAs only
        async with connect_bus(broker.settings(ca_pem=None), "b", identity=alice.address, persistent=False):
            pass
    with pytest.raises(MessagingError):  # no TLS at all
        async with connect_bus(broker.settings(tls=False, ca_pem=None), "c", identity=alice.address,
                               persistent=False, timeout=3):
            pass
