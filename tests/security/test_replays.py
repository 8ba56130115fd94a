"""Replays (#13, item 14) through a real mosquitto.

Before the fix the seen-nonce set lived in memory, so a restarted verifier accepted a replayed
message; retained deliveries skipped the replay check, so a captured message republished with
the retain flag was accepted again on every (re)subscribe; and the freshness window was a
constant of EnvelopeVerifier that no profile could set.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from eth_account import Account

from aitbc_agent_sdk.messaging import SignedChannel, Verified
from aitbc_agent_sdk.messaging._envelope import EnvelopeSigner
from aitbc_agent_sdk.messaging._settings import BusSettings, connect_bus
from aitbc_agent_sdk.records import Heartbeat


def beat(account, busy: int = 0) -> Heartbeat:
    return Heartbeat(provider=account.address, sent_at=time.time(), busy_jobs=busy)


async def next_of(stream: AsyncIterator[Verified], timeout: float = 10.0) -> Verified:
    async with asyncio.timeout(timeout):
        return await anext(stream)


async def test_a_restarted_verifier_still_rejects_a_replay(mosquitto, tmp_path):
    coordinator, provider = Account.create(), Account.create()
    settings = BusSettings(port=mosquitto.port)
    topic = f"aitbc/v1/results/replay-{time.time_ns()}"
    signer = EnvelopeSigner(provider)
    original = signer.seal(topic, beat(provider, busy=1))

    # The coordinator daemon's session (a stable id, as coord-{training_id}) accepts the original...
    async with connect_bus(settings, "coord-replay", identity=coordinator.address, home=tmp_path) as bus:
        channel = SignedChannel(bus, coordinator)
        async with channel.subscribe(topic, Heartbeat) as results:
            await bus.publish(topic, original)
            assert (await next_of(results)).message.busy_jobs == 1
    # ... then restarts (a new bus, a new verifier), and an attacker replays the captured bytes.
    async with connect_bus(settings, "coord-replay", identity=coordinator.address, home=tmp_path) as bus:
        channel = SignedChannel(bus, coordinator)
        async with channel.subscribe(topic, Heartbeat) as results:
            await bus.publish(topic, original)
            await bus.publish(topic, signer.seal(topic, beat(provider, busy=2)))
            assert (await next_of(results)).message.busy_jobs == 2
        assert channel.verifier.dropped["replayed"] == 1


async def test_a_captured_message_republished_as_retained_is_rejected(mosquitto):
    victim, provider = Account.create(), Account.create()
    topic = f"aitbc/v1/jobs/retained-{time.time_ns()}"
    signer = EnvelopeSigner(provider)
    captured = signer.seal(topic, beat(provider, busy=1))
    async with connect_bus(BusSettings(port=mosquitto.port), f"victim-{time.time_ns()}", persistent=False) as bus:
        channel = SignedChannel(bus, victim)
        async with channel.subscribe(topic, Heartbeat) as jobs:
            await bus.publish(topic, captured)
            assert (await next_of(jobs)).message.busy_jobs == 1
        await bus.publish(topic, captured, retain=True)  # the attacker's retained copy
        for verifier_seen_it in (True, False):
            reader = channel if verifier_seen_it else SignedChannel(bus, Account.create())
            async with reader.subscribe(topic, Heartbeat) as jobs:
                await bus.publish(topic, signer.seal(topic, beat(provider, busy=3)))
                assert (await next_of(jobs)).message.busy_jobs == 3  # the retained copy came first, and went
            assert reader.verifier.dropped["retained_replay"] == 1
        await bus.publish(topic, b"", retain=True)


async def test_a_providers_own_retained_offer_still_reaches_every_new_subscription(mosquitto):
    provider, reader = Account.create(), Account.create()
    topic = f"aitbc/v1/offers/own-{time.time_ns()}"
    async with connect_bus(BusSettings(port=mosquitto.port), f"own-{time.time_ns()}", persistent=False) as bus:
        await SignedChannel(bus, provider).publish(topic, beat(provider, busy=5), retain=True)
        channel = SignedChannel(bus, reader)
        for _ in range(2):
            async with channel.subscribe(topic, Heartbeat) as offers:
                got = await next_of(offers)
                assert got.message.busy_jobs == 5 and got.retained
        await bus.publish(topic, b"", retain=True)
        assert not channel.verifier.dropped


def sealed_at(signer: EnvelopeSigner, topic: str, message: Heartbeat, age_s: float) -> bytes:
    """A message its sender's clock dated ``age_s`` ago (re-signed, so only its age differs)."""
    from eth_account.messages import encode_defunct

    from aitbc_agent_sdk.messaging._envelope import canonical_text

    body = json.loads(signer.seal(topic, message))
    body["sent_at"] = round(body["sent_at"] - age_s, 6)
    text = canonical_text(topic, body["sender"], body["nonce"], body["sent_at"], body["kind"], body["payload"])
    body["signature"] = signer._account.sign_message(encode_defunct(text=text)).signature.hex()  # noqa: SLF001
    return json.dumps(body).encode()


async def test_the_clock_skew_window_setting_decides_what_is_stale(mosquitto):
    provider, reader = Account.create(), Account.create()
    signer = EnvelopeSigner(provider)
    topic = f"aitbc/v1/heartbeat/skew-{time.time_ns()}"
    for window, accepted in ((30.0, [20]), (120.0, [20, 60])):
        settings = BusSettings(port=mosquitto.port, clock_skew_s=window)
        async with connect_bus(settings, f"skew-{time.time_ns()}", persistent=False) as bus:
            channel = SignedChannel(bus, reader)
            async with channel.subscribe(topic, Heartbeat) as beats:
                for age in (20, 60):
                    await bus.publish(topic, sealed_at(signer, topic, beat(provider, busy=age), age))
                await bus.publish(topic, signer.seal(topic, beat(provider, busy=0)))
                got = []
                while not got or got[-1] != 0:
                    got.append((await next_of(beats)).message.busy_jobs)
            assert got[:-1] == accepted, f"window {window}s"
            assert channel.verifier.dropped["stale"] == 2 - len(accepted)


async def test_one_delivery_reaches_every_subscription_of_a_channel_and_a_replay_still_none(mosquitto):
    """Two trainings on one coordinator follow the same worker: both must see each of its heartbeats.
    Before the fix the second subscription's copy of the same delivery was dropped as a replay."""
    coordinator, provider = Account.create(), Account.create()
    topic = f"aitbc/v1/heartbeat/fanned-{time.time_ns()}"
    signer = EnvelopeSigner(provider)
    original = signer.seal(topic, beat(provider, busy=1))
    async with connect_bus(BusSettings(port=mosquitto.port), f"fan-{time.time_ns()}", persistent=False) as bus:
        channel = SignedChannel(bus, coordinator)
        async with channel.subscribe(topic, Heartbeat) as first, channel.subscribe(topic, Heartbeat) as second:
            await bus.publish(topic, original)
            assert (await next_of(first)).message.busy_jobs == 1
            assert (await next_of(second)).message.busy_jobs == 1
            await bus.publish(topic, original)  # the same bytes again: a replay, for every subscription
            await bus.publish(topic, signer.seal(topic, beat(provider, busy=2)))
            assert (await next_of(first)).message.busy_jobs == 2
            assert (await next_of(second)).message.busy_jobs == 2
        assert channel.verifier.dropped["replayed"] == 2
