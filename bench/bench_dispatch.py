"""Benchmark: signed job dispatch round trips through a real mosquitto vs. raw aiomqtt messages.

Dispatch: a coordinator (this process) publishes ``--jobs`` signed JobAssignments on
``aitbc/v1/jobs/{provider}``, round robin over ``--providers`` simulated providers (all in one
child process, each with its own MqttBus). Each provider verifies the job (and that the
coordinator sent it) and answers with a signed JobResult on ``aitbc/v1/results/{training}``,
which the coordinator verifies. jobs/s = jobs / (first publish .. last verified result).

Raw baseline, same run: plain aiomqtt, unsigned, QoS 1, one publisher and one subscriber
client in this process, the same number of messages of the size of one signed assignment.
raw msgs/s = messages / (first publish .. last message received).

A round trip is two messages (job + result), so ``ratio = 2 * jobs_per_s / raw_msgs_per_s``:
the share of the raw one-way message rate the signed request/response path achieves.

    python bench/bench_dispatch.py [--jobs 1000] [--providers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import tempfile
import time
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

import aiomqtt
from eth_account import Account
from eth_account.signers.local import LocalAccount

from aitbc_agent_sdk.chain._registry import EvidenceDomain, sign_result
from aitbc_agent_sdk.devnet._mosquitto import start_broker
from aitbc_agent_sdk.devnet._service import stop
from aitbc_agent_sdk.messaging import SignedChannel, topics
from aitbc_agent_sdk.messaging._envelope import EnvelopeSigner, EnvelopeVerifier
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.records import JobAssignment, JobConfig, JobResult, ModelSpec

from quick import parse_args

HOST = "127.0.0.1"
TRAINING = "tr_bench0000000000"
CID = "QmYwAPJzv5CZsnA625s3Xf2nemtYgPpHdWEz79ojWnPbdG"
# Where the providers' result signatures count (any chain and registry: nothing checks them here).
DOMAIN = EvidenceDomain(chain_id=31337, registry="0x" + "11" * 20)


def assignment(i: int, worker: str) -> JobAssignment:
    return JobAssignment(
        job_id=f"job_{i:08d}", training_id=TRAINING, round=1, worker_id=worker, contract_id=f"ct_{i % 97:06d}",
        shard_cid=CID, shard_bytes=1 << 20, weights_cid=CID, weights_bytes=1 << 20, model=ModelSpec(name="mlp", input_shape=(64,), num_classes=10),
        config=JobConfig(batch_size=32, learning_rate=0.01, epochs=2), seed=i,
    )


# -- providers (child process) -----------------------------------------------------------------

async def provider(port: int, key: str, coordinator: str, ready: asyncio.Event) -> None:
    account: LocalAccount = Account.from_key(key)
    async with MqttBus(HOST, port, client_id=f"bench-provider-{account.address}", persistent=False) as bus:
        channel = SignedChannel(bus, account)
        async with channel.subscribe(topics.jobs(account.address), JobAssignment) as jobs:
            ready.set()
            async for job in jobs:
                if job.sender != coordinator:  # the role check the real provider does
                    continue
                a = job.message
                # The real provider signs every result as slashing evidence: that cost belongs in the round trip.
                signature = "0x" + sign_result(account, DOMAIN, bytes(32), a.round, CID).hex()
                await channel.publish(topics.results(a.training_id), JobResult(
                    job_id=a.job_id, training_id=a.training_id, worker_id=account.address, round=a.round,
                    checkpoint_cid=CID, samples=100, loss=0.5, train_seconds=0.01, signature=signature))


def providers_main(port: int, keys: list[str], coordinator: str, ready: MpEvent) -> None:
    async def run() -> None:
        events = [asyncio.Event() for _ in keys]
        tasks = [asyncio.create_task(provider(port, k, coordinator, e)) for k, e in zip(keys, events)]
        await asyncio.gather(*(e.wait() for e in events))
        ready.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())


# -- coordinator and baseline (this process) ---------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """user+system CPU seconds of another process (the broker), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def dispatch(port: int, coordinator: LocalAccount, workers: list[str], n: int) -> float:
    async with MqttBus(HOST, port, client_id="bench-coordinator", persistent=False, queue_size=4096) as bus:
        channel = SignedChannel(bus, coordinator)
        async with channel.subscribe(topics.results(TRAINING), JobResult) as results:
            jobs = [assignment(i, workers[i % len(workers)]) for i in range(n)]
            start = time.perf_counter()

            async def send(mine: list[JobAssignment]) -> None:
                for job in mine:
                    await channel.publish(topics.jobs(job.worker_id), job)

            # One sender per worker, as a coordinator hands out a round: publishes overlap.
            sender = asyncio.gather(*(send(jobs[w::len(workers)]) for w in range(len(workers))))
            done: set[str] = set()
            async for result in results:
                if result.sender == result.message.worker_id:
                    done.add(result.message.job_id)
                if len(done) == n:
                    break
            elapsed = time.perf_counter() - start
            await sender
    return elapsed


async def raw(port: int, n: int, size: int) -> float:
    payload = b"x" * size
    async with aiomqtt.Client(HOST, port, identifier="bench-raw-sub") as sub, \
            aiomqtt.Client(HOST, port, identifier="bench-raw-pub") as pub:
        await sub.subscribe("bench/raw", qos=1)
        start = time.perf_counter()

        async def send() -> None:
            for _ in range(n):
                await pub.publish("bench/raw", payload, qos=1)

        sender = asyncio.create_task(send())
        received = 0
        async for _ in sub.messages:
            received += 1
            if received == n:
                break
        elapsed = time.perf_counter() - start
        await sender
    return elapsed


def crypto_costs(coordinator: LocalAccount, worker: str, repeat: int = 200) -> tuple[float, float]:
    """Seconds per seal and per verify of one assignment, to explain the ratio."""
    signer, verifier = EnvelopeSigner(coordinator), EnvelopeVerifier()
    topic, job = topics.jobs(worker), assignment(0, worker)
    start = time.perf_counter()
    sealed = [signer.seal(topic, job) for _ in range(repeat)]
    seal_s = (time.perf_counter() - start) / repeat
    start = time.perf_counter()
    for raw_msg in sealed:
        verifier.open(topic, raw_msg, JobAssignment)
    return seal_s, (time.perf_counter() - start) / repeat


async def main_async(args: argparse.Namespace, port: int, broker_pid: int) -> dict[str, object]:
    coordinator = Account.create()
    keys = [Account.create() for _ in range(args.providers)]
    workers = [k.address for k in keys]
    size = len(EnvelopeSigner(coordinator).seal(topics.jobs(workers[0]), assignment(0, workers[0])))

    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=providers_main, args=(port, [k.key.hex() for k in keys], coordinator.address, ready),
                        daemon=True)
    child.start()
    try:
        if not await asyncio.to_thread(ready.wait, 60):
            raise RuntimeError("providers did not start")
        await dispatch(port, coordinator, workers, min(args.jobs, 50))  # warm-up
        cpu0, child0, broker0 = time.process_time(), cpu_seconds(child.pid), cpu_seconds(broker_pid)
        dispatch_s = await dispatch(port, coordinator, workers, args.jobs)
        cpu = {"coordinator": time.process_time() - cpu0, "providers": cpu_seconds(child.pid) - child0,
               "broker": cpu_seconds(broker_pid) - broker0}
    finally:
        child.terminate()
        child.join(10)
    await raw(port, min(args.jobs, 50), size)  # warm-up
    raw_s = await raw(port, args.jobs, size)
    seal_s, verify_s = crypto_costs(coordinator, workers[0])

    jobs_per_s = args.jobs / dispatch_s
    raw_per_s = args.jobs / raw_s
    return {
        "bench": "dispatch", "jobs": args.jobs, "providers": args.providers, "message_bytes": size,
        "dispatch_s": round(dispatch_s, 3), "jobs_per_s": round(jobs_per_s, 1),
        "raw_s": round(raw_s, 3), "raw_msgs_per_s": round(raw_per_s, 1),
        "ratio_2x_jobs_per_raw_msgs": round(2 * jobs_per_s / raw_per_s, 3),
        "dispatch_cpu_s": {k: round(v, 2) for k, v in cpu.items()}, "cpus": os.cpu_count(),
        "seal_ms": round(seal_s * 1e3, 3), "verify_ms": round(verify_s * 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--providers", type=int, default=4)
    args = parse_args(parser, jobs=100, providers=2)
    with tempfile.TemporaryDirectory() as tmp:
        broker = asyncio.run(start_broker(Path(tmp)))
        try:
            print(json.dumps(asyncio.run(main_async(args, broker.port, broker.pid))))
        finally:
            stop(broker)


if __name__ == "__main__":
    main()
