"""MqttBus against a real mosquitto (and one test against the amqtt fallback)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator

import aiomqtt
import pytest
from eth_account import Account

from aitbc_agent_sdk.devnet._mosquitto import start_amqtt
from aitbc_agent_sdk.devnet._service import ServiceProcess, free_port, stop, wait_for_port
from aitbc_agent_sdk.errors import MessagingError
from aitbc_agent_sdk.messaging import Bus, BusMessage, SignedChannel, topics
from aitbc_agent_sdk.messaging._envelope import EnvelopeSigner
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.records import ContractProposal, ContractReply

HOST = "127.0.0.1"


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def next_message(messages: AsyncIterator[BusMessage], timeout: float = 5.0) -> BusMessage:
    return await asyncio.wait_for(anext(messages), timeout)


async def nothing_within(messages: AsyncIterator[BusMessage], seconds: float = 0.3) -> bool:
    try:
        await asyncio.wait_for(anext(messages), seconds)
    except TimeoutError:
        return True
    return False


def bus(service: ServiceProcess | int, name: str, **kwargs: object) -> MqttBus:
    port = service if isinstance(service, int) else service.port
    return MqttBus(HOST, port, client_id=uid(name), **kwargs)  # type: ignore[arg-type]


async def test_pub_sub_with_wildcards(mosquitto):
    root = uid("t")
    async with bus(mosquitto, "pub") as pub, bus(mosquitto, "sub") as sub:
        assert isinstance(pub, Bus)
        async with sub.subscribe(f"{root}/jobs/+") as jobs, sub.subscribe(f"{root}/#") as everything:
            await pub.publish(f"{root}/jobs/alice", b"1")
            await pub.publish(f"{root}/other/x", b"2")
            assert await next_message(jobs) == BusMessage(f"{root}/jobs/alice", b"1", retained=False)
            assert await nothing_within(jobs)
            assert [(await next_message(everything)).payload for _ in range(2)] == [b"1", b"2"]


async def test_retained_and_cleared(mosquitto):
    topic = f"{uid('t')}/offers/a"
    async with bus(mosquitto, "pub") as pub, bus(mosquitto, "sub") as sub:
        await pub.publish(topic, b"offer", retain=True)
        async with sub.subscribe(topic) as offers:
            assert await next_message(offers) == BusMessage(topic, b"offer", retained=True)
            await pub.publish(topic, b"live")  # an established subscription sees retained=False
            assert await next_message(offers) == BusMessage(topic, b"live", retained=False)
        await pub.publish(topic, b"", retain=True)
        async with sub.subscribe(topic) as offers:
            assert await nothing_within(offers)


async def test_concurrent_subscriptions_on_one_connection(mosquitto):
    root = uid("t")
    async with bus(mosquitto, "pub") as pub, bus(mosquitto, "coord") as coord:
        async def collect(topic_filter: str, n: int, ready: asyncio.Event) -> list[bytes]:
            async with coord.subscribe(topic_filter) as messages:
                ready.set()
                return [(await next_message(messages)).payload for _ in range(n)]

        readies = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.create_task(collect(f, 20, r)) for f, r in zip(
            [f"{root}/progress/+", f"{root}/results", f"{root}/progress/#"], readies)]
        await asyncio.gather(*(r.wait() for r in readies))
        for i in range(20):
            await pub.publish(f"{root}/progress/{i % 3}", b"p%d" % i)
            await pub.publish(f"{root}/results", b"r%d" % i)
        progress, results, progress_all = await asyncio.gather(*tasks)
        assert progress == progress_all == [b"p%d" % i for i in range(20)]
        assert results == [b"r%d" % i for i in range(20)]

        # Two contexts on one filter: leaving one keeps the broker subscription for the other.
        async with coord.subscribe(f"{root}/same") as first:
            async with coord.subscribe(f"{root}/same") as second:
                await pub.publish(f"{root}/same", b"both")
                assert (await next_message(first)).payload == (await next_message(second)).payload == b"both"
            await pub.publish(f"{root}/same", b"still")
            assert (await next_message(first)).payload == b"still"


async def test_persistent_session_gets_messages_sent_while_away(mosquitto):
    topic = f"{uid('t')}/jobs/provider"
    client_id = uid("provider")
    async with contextlib.AsyncExitStack() as stack:
        away = await stack.enter_async_context(MqttBus(HOST, mosquitto.port, client_id=client_id))
        await stack.enter_async_context(away.subscribe(topic))
        # Closing the bus with the subscription open keeps it in the broker's session.
        await away.aclose()
    async with bus(mosquitto, "coord") as coord:
        await coord.publish(topic, b"job-1")
        await coord.publish(topic, b"job-2")
    async with MqttBus(HOST, mosquitto.port, client_id=client_id) as back:
        async with back.subscribe(topic) as jobs:
            assert [(await next_message(jobs)).payload for _ in range(2)] == [b"job-1", b"job-2"]


class CuttableProxy:
    """TCP proxy to the broker that can drop its connections and stop listening (a network outage)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._conns: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CuttableProxy:
        await self.restore()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._handle, HOST, self.port)

    def cut(self) -> None:
        if self._server is not None:
            self._server.close()  # refuse new connections, like an unreachable host
            self._server = None
        for writer in list(self._conns):
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        self._conns |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            writer.transport.abort()
            up_writer.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._conns -= {writer, up_writer}


async def test_network_outage_reconnects_and_delivers_what_was_sent_meanwhile(mosquitto):
    root = uid("t")
    async with CuttableProxy(mosquitto.port) as proxy, bus(mosquitto, "pub") as pub:
        async with bus(proxy.port, "sub", max_backoff_s=0.2) as sub, sub.subscribe(f"{root}/#") as messages:
            await pub.publish(f"{root}/a", b"before")
            assert (await next_message(messages)).payload == b"before"
            proxy.cut()
            await asyncio.sleep(0.3)
            assert not sub.connected
            await pub.publish(f"{root}/a", b"during")  # queued by the broker for the offline session
            await proxy.restore()
            # At least once: "before" comes again if its PUBACK was still in flight when the link died.
            seen = [(await next_message(messages)).payload]
            while seen[-1] != b"during":
                seen.append((await next_message(messages)).payload)
            assert set(seen) <= {b"before", b"during"}
            assert sub.reconnects == 1
            await sub.publish(f"{root}/b", b"after")  # the reconnected bus publishes, too
            assert (await next_message(messages)).payload == b"after"


async def test_broker_restart_mid_stream(fresh_mosquitto):
    root = uid("t")
    port = fresh_mosquitto.port
    async with bus(port, "sub", max_backoff_s=0.5) as sub, bus(port, "pub", max_backoff_s=0.5) as pub:
        async with sub.subscribe(f"{root}/#") as messages:
            await pub.publish(f"{root}/x", b"one")
            assert (await next_message(messages)).payload == b"one"
            fresh_mosquitto.stop()
            for _ in range(100):  # both clients notice the broker is gone (an event, polled)
                if not sub.connected and not pub.connected:
                    break
                await asyncio.sleep(0.1)
            assert not sub.connected and not pub.connected
            await fresh_mosquitto.start()
            # publish waits for the reconnect instead of failing at once.
            await pub.publish(f"{root}/x", b"two")
            got = await next_message(messages, timeout=10)
            if got.payload == b"one":  # QoS 1 is at least once: unacknowledged when the broker stopped, re-sent
                got = await next_message(messages, timeout=10)
            assert got.payload == b"two"
            assert sub.reconnects == 1 and pub.reconnects == 1


async def test_offline_session_survives_a_broker_restart(fresh_mosquitto):
    topic = f"{uid('t')}/jobs/p"
    client_id = uid("provider")
    async with contextlib.AsyncExitStack() as stack:
        away = await stack.enter_async_context(MqttBus(HOST, fresh_mosquitto.port, client_id=client_id))
        await stack.enter_async_context(away.subscribe(topic))
        await away.aclose()
    async with bus(fresh_mosquitto.port, "coord") as coord:
        await coord.publish(topic, b"queued")
    fresh_mosquitto.stop()  # mosquitto writes its persistence file on SIGTERM
    await fresh_mosquitto.start()
    async with MqttBus(HOST, fresh_mosquitto.port, client_id=client_id) as back, back.subscribe(topic) as jobs:
        assert (await next_message(jobs)).payload == b"queued"


async def test_iterator_raises_when_broker_dies_without_reconnect(fresh_mosquitto):
    async with bus(fresh_mosquitto.port, "sub", reconnect=False) as sub:
        async with sub.subscribe("t/#") as messages:
            fresh_mosquitto.stop()
            with pytest.raises(MessagingError, match="reconnect disabled"):
                await next_message(messages)
        with pytest.raises(MessagingError):
            await sub.publish("t/x", b"x")


async def test_broker_gone_for_good_fails_the_bus(fresh_mosquitto):
    async with bus(fresh_mosquitto.port, "sub", max_backoff_s=0.2, max_outage_s=1.0) as sub:
        async with sub.subscribe("t/#") as messages:
            fresh_mosquitto.stop()
            with pytest.raises(MessagingError, match="unreachable for 1s"):
                await next_message(messages)


async def test_publish_times_out_without_broker(fresh_mosquitto):
    with pytest.raises(MessagingError, match="cannot connect"):
        async with bus(free_port(), "nobody", timeout=0.5):
            pass
    async with bus(fresh_mosquitto.port, "pub", timeout=0.5) as pub:
        fresh_mosquitto.stop()
        with pytest.raises(MessagingError, match="no acknowledgement .* within 0.5s"):
            await pub.publish("t/x", b"x")


async def test_bad_topics_and_reopen_are_refused(mosquitto):
    b = bus(mosquitto, "x")
    async with b:
        with pytest.raises(MessagingError, match="wildcard"):
            await b.publish("a/+", b"x")
        with pytest.raises(MessagingError, match="invalid"):
            async with b.subscribe("a/#/b"):
                pass
    with pytest.raises(MessagingError, match="reopened"):
        async with b:
            pass


async def test_signed_channel_over_mqtt(mosquitto):
    coordinator_key, provider_key, mallory = Account.create(), Account.create(), Account.create()
    prefix = uid("c")
    async with bus(mosquitto, "coord") as coord_bus, bus(mosquitto, "prov") as prov_bus:
        coordinator = SignedChannel(coord_bus, coordinator_key)
        provider = SignedChannel(prov_bus, provider_key)
        proposal_topic = topics.negotiate(provider.address)
        reply_topic = topics.negotiate_reply(coordinator.address, prefix)

        async def serve_one() -> None:
            async with provider.subscribe(proposal_topic, ContractProposal) as proposals:
                ready.set()
                proposal = await anext(proposals)
                await provider.publish(topics.negotiate_reply(proposal.message.coordinator, prefix),
                                       ContractReply(contract_id=proposal.message.contract_id, accepted=True))

        ready = asyncio.Event()
        server = asyncio.create_task(serve_one())
        await ready.wait()
        reply = await coordinator.request(
            proposal_topic, ContractProposal(contract_id=prefix, training_id="tr", coordinator=coordinator.address,
                                             price_wei=10, rounds=2),
            reply_topic, ContractReply, timeout=5, expected_sender=provider.address)
        assert reply == ContractReply(contract_id=prefix, accepted=True)
        await server

        # A forged reply (signed by mallory, claiming to be the provider) is dropped and counted.
        forged = json.loads(EnvelopeSigner(mallory).seal(reply_topic, ContractReply(contract_id=prefix, accepted=False)))
        forged["sender"] = provider.address
        async with coordinator.subscribe(reply_topic, ContractReply) as replies:
            async with aiomqtt.Client(HOST, mosquitto.port, identifier=uid("raw")) as raw:
                await raw.publish(reply_topic, json.dumps(forged).encode(), qos=1)
            await provider.publish(reply_topic, ContractReply(contract_id=prefix, accepted=True, reason="real"))
            genuine = await asyncio.wait_for(anext(replies), 5)
        assert genuine.sender == provider.address and genuine.message.reason == "real"
        assert coordinator.verifier.dropped["forged"] == 1


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                    found.add(address)
    return found


async def test_amqtt_fallback_pub_sub_retained_and_sessions(tmp_path):
    service = start_amqtt(tmp_path)
    try:
        await wait_for_port(service, 30)
        assert listening_addresses(service.port) == {"0100007F"}  # 127.0.0.1 only, never 0.0.0.0
        root = uid("t")
        async with bus(service, "pub") as pub, bus(service, "sub") as sub:
            await pub.publish(f"{root}/offer", b"retained", retain=True)
            async with sub.subscribe(f"{root}/+") as messages:
                assert await next_message(messages) == BusMessage(f"{root}/offer", b"retained", retained=True)
                await pub.publish(f"{root}/job", b"live")
                assert await next_message(messages) == BusMessage(f"{root}/job", b"live", retained=False)

        client_id = uid("provider")
        async with contextlib.AsyncExitStack() as stack:
            away = await stack.enter_async_context(MqttBus(HOST, service.port, client_id=client_id))
            await stack.enter_async_context(away.subscribe(f"{root}/jobs"))
            await away.aclose()
        async with bus(service, "coord") as coord:
            await coord.publish(f"{root}/jobs", b"queued")
        async with MqttBus(HOST, service.port, client_id=client_id) as back, back.subscribe(f"{root}/jobs") as jobs:
            # amqtt flags messages queued for an offline session as retained; mosquitto does not.
            assert (await next_message(jobs)).payload == b"queued"
    finally:
        stop(service)
