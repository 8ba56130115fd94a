"""Benchmark: coordinator CPU for verifying 1,000 providers' signed heartbeats at 1 Hz each.

A child process simulates ``--providers`` providers, each publishing a signed Heartbeat on
``aitbc/v1/heartbeat/{provider}`` once a second (``--connections`` plain aiomqtt
connections, QoS 1). Signing 1,000 messages/s would eat most of a core on the publisher side, so the
envelopes are signed before the stream starts; the coordinator side is the real code path.

The coordinator (this process, which does nothing else meanwhile) runs three phases over
the same stream, each measured for ``--seconds`` after a 1 s warm-up, CPU from
``time.process_time()`` (user + system of this process):
  verify   SignedChannel over MqttBus: verify every envelope, check the signer is the
           provider it names, record its last-seen time (what the coordinator does)
  receive  MqttBus only: receive and record last-seen by topic, no verification (baseline)
  raw      plain aiomqtt, receive and count (the bus's own overhead)
Only the first phase needs fresh envelopes; the others reuse them.

    python bench/bench_heartbeats.py [--providers 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import tempfile
import time
from collections.abc import Awaitable, Callable
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

import aiomqtt
from eth_account import Account

from aitbc_agent_sdk.devnet._mosquitto import start_broker
from aitbc_agent_sdk.devnet._service import stop
from aitbc_agent_sdk.messaging import SignedChannel, topics
from aitbc_agent_sdk.messaging._envelope import EnvelopeSigner
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.records import Heartbeat

from quick import parse_args

HOST = "127.0.0.1"
SLOT_S = 0.01  # the stream is sent in 10 ms slots, so the rate is smooth


# -- the providers (child process) -------------------------------------------------------------

def presign(providers: int, seconds: int) -> list[tuple[str, bytes]]:
    signers = [EnvelopeSigner(Account.create()) for _ in range(providers)]
    pool = []
    for _ in range(seconds):
        for signer in signers:
            topic = topics.heartbeat(signer.address)
            pool.append((topic, signer.seal(topic, Heartbeat(provider=signer.address, sent_at=time.time(),
                                                              busy_jobs=0))))
    return pool


async def stream(port: int, pool: list[tuple[str, bytes]], rate: int, connections: int, stopped: MpEvent) -> None:
    # Plain aiomqtt on this side: the publisher's own overhead should not starve the coordinator.
    per_slot = max(1, round(rate * SLOT_S))
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(aiomqtt.Client(HOST, port, identifier=f"bench-hb-pub-{i}"))
                   for i in range(connections)]
        loop = asyncio.get_running_loop()
        next_slot, i = loop.time(), 0
        while not stopped.is_set():
            batch = [pool[(i + k) % len(pool)] for k in range(per_slot)]
            await asyncio.gather(*(clients[(i + k) % connections].publish(t, p, qos=1)
                                   for k, (t, p) in enumerate(batch)))
            i += per_slot
            next_slot += SLOT_S
            await asyncio.sleep(max(0.0, next_slot - loop.time()))


def providers_main(port: int, providers: int, seconds: int, connections: int,
                   ready: MpEvent, stopped: MpEvent) -> None:
    pool = presign(providers, seconds)
    ready.set()
    asyncio.run(stream(port, pool, providers, connections, stopped))


# -- the coordinator (this process) ------------------------------------------------------------

async def measure(seconds: float, receive: Callable[[Callable[[], bool]], Awaitable[int]]) -> dict[str, float]:
    """Run ``receive`` for warm-up + ``seconds``; it returns how many messages it handled."""
    loop = asyncio.get_running_loop()
    marks: dict[str, float] = {}

    def measuring() -> bool:
        # Called per message: start the clocks after the warm-up, stop after ``seconds``.
        now = loop.time()
        if "t0" not in marks and now >= warmup_end:
            marks.update(t0=now, cpu0=time.process_time(), n0=count[0])
        if "t0" in marks and now >= marks["t0"] + seconds:
            marks.update(t1=now, cpu1=time.process_time(), n1=count[0])
            return False
        count[0] += 1
        return True

    count = [0]
    warmup_end = loop.time() + 1.0
    await receive(measuring)
    wall, cpu = marks["t1"] - marks["t0"], marks["cpu1"] - marks["cpu0"]
    n = marks["n1"] - marks["n0"]
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 3), "cpu_percent": round(100 * cpu / wall, 1),
            "msgs_per_s": round(n / wall, 1), "cpu_us_per_msg": round(1e6 * cpu / max(n, 1), 1)}


async def verify_phase(port: int, go_on: Callable[[], bool]) -> int:
    last_seen: dict[str, float] = {}
    async with MqttBus(HOST, port, client_id="bench-hb-coordinator", persistent=False, queue_size=4096) as bus:
        channel = SignedChannel(bus, Account.create())
        async with channel.subscribe(topics.HEARTBEATS, Heartbeat) as heartbeats:
            async for hb in heartbeats:
                if hb.sender == hb.message.provider:  # only the provider itself vouches for its liveness
                    last_seen[hb.sender] = time.time()
                if not go_on():
                    break
        assert not channel.verifier.dropped, channel.verifier.dropped
    return len(last_seen)


async def receive_phase(port: int, go_on: Callable[[], bool]) -> int:
    last_seen: dict[str, float] = {}
    async with MqttBus(HOST, port, client_id="bench-hb-receiver", persistent=False, queue_size=4096) as bus:
        async with bus.subscribe(topics.HEARTBEATS) as messages:
            async for message in messages:
                last_seen[message.topic] = time.time()
                if not go_on():
                    break
    return len(last_seen)


async def raw_phase(port: int, go_on: Callable[[], bool]) -> int:
    async with aiomqtt.Client(HOST, port, identifier="bench-hb-raw") as client:
        await client.subscribe(topics.HEARTBEATS, qos=1)
        async for _ in client.messages:
            if not go_on():
                break
    return 0


async def main_async(args: argparse.Namespace, port: int) -> dict[str, object]:
    ctx = mp.get_context("spawn")
    ready, stopped = ctx.Event(), ctx.Event()
    child = ctx.Process(target=providers_main, daemon=True,
                        args=(port, args.providers, args.seconds + 3, args.connections, ready, stopped))
    child.start()
    try:
        if not await asyncio.to_thread(ready.wait, 600):
            raise RuntimeError("heartbeat publisher did not start")
        phases = {}
        for name, phase in (("verify", verify_phase), ("receive", receive_phase), ("raw", raw_phase)):
            phases[name] = await measure(args.seconds, lambda go_on, phase=phase: phase(port, go_on))
    finally:
        stopped.set()
        child.join(15)
        if child.is_alive():
            child.terminate()
    return {
        "bench": "heartbeats", "providers": args.providers, "rate_per_s": args.providers, **phases,
        "verify_cost_us_per_msg": round(phases["verify"]["cpu_us_per_msg"] - phases["receive"]["cpu_us_per_msg"], 1),
        "cpu_ratio_verify_vs_receive": round(phases["verify"]["cpu_s"] / max(phases["receive"]["cpu_s"], 1e-9), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--connections", type=int, default=8)
    args = parse_args(parser, providers=100, seconds=1, connections=2)
    with tempfile.TemporaryDirectory() as tmp:
        broker = asyncio.run(start_broker(Path(tmp)))
        try:
            print(json.dumps(asyncio.run(main_async(args, broker.port))))
        finally:
            stop(broker)


if __name__ == "__main__":
    main()
