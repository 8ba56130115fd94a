"""Attack: a hired worker's one bad message aimed at the coordinator. A result with a NaN loss was
stored as ``null`` and every later read of the training's checkpoints raised, so the round and
settlement failed for good; a re-sent result flipped an accepted or rejected verdict back to
``received``; a result naming another training was stored under it. Now the NaN is refused on
receipt, verdicts stand, and the listener keeps listening.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from eth_account import Account

from aitbc_agent_sdk.coordinator._listener import TrainingListener
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.messaging import SignedChannel, topics
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.records import CheckpointRef, JobAssignment, JobConfig, JobResult, ModelSpec, new_id

TID = "training_listener0test"
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
OTHER_CID = "bafkreidgvpkjawlxz6sffxzwgooowe5yt7i6wsyg236mfoks77nywkptdq"
WAIT_S = 60.0


def result(job: JobAssignment, **fields) -> JobResult:
    values = dict(job_id=job.job_id, training_id=TID, worker_id=job.worker_id, round=job.round,
                  checkpoint_cid=CID, samples=10, loss=0.5, train_seconds=1.0, signature="0x" + "11" * 65)
    return JobResult.model_construct(**(values | fields))


async def test_one_poisoned_result_neither_breaks_the_store_nor_stops_the_listener(tmp_path, mosquitto):
    worker = Account.create()
    async with AsyncExitStack() as exits:
        db = await exits.enter_async_context(TrainingDatabase(tmp_path / "coordinator.db"))
        bus = await exits.enter_async_context(MqttBus("127.0.0.1", mosquitto.port, client_id=new_id("coord"),
                                                      persistent=False))
        worker_bus = await exits.enter_async_context(MqttBus("127.0.0.1", mosquitto.port,
                                                             client_id=new_id("worker"), persistent=False))
        jobs = [JobAssignment(job_id=new_id("job"), training_id=TID, round=1, worker_id=worker.address,
                              contract_id=new_id("contract"), shard_cid=CID, weights_cid=CID, shard_bytes=1, weights_bytes=1,
                              model=ModelSpec(name="mlp", input_shape=(4,), num_classes=2), config=JobConfig())
                  for _ in range(3)]
        for job in jobs:
            await db.save_job(job)
        judged = CheckpointRef(checkpoint_id=CID, cid=CID, job_id=jobs[1].job_id, worker_id=worker.address,
                               training_id=TID, round=1, samples=10, loss=0.4)
        await db.save_checkpoint(judged, "accepted")
        listener = TrainingListener(SignedChannel(bus, Account.create()), db, TID)
        await listener.start()
        exits.push_async_callback(listener.stop)
        sender = SignedChannel(worker_bus, worker)
        poisoned = [result(jobs[0], loss=float("nan")),  # NaN is stored as null and never reads back
                    result(jobs[1], checkpoint_cid=OTHER_CID),  # would reopen an accepted verdict
                    result(jobs[0], training_id="training_someone_else"),  # would file under another training
                    result(jobs[0], round=7)]
        for message in poisoned:
            await sender.publish(topics.results(TID), message)
        await sender.publish(topics.results(TID), result(jobs[2]))
        async with asyncio.timeout(WAIT_S):
            ref = await listener.results.get()
        assert ref.job_id == jobs[2].job_id and listener.results.empty()
        stored = {(c.job_id, c.cid) for c in await db.checkpoints(TID, None)}  # raised on the NaN before
        assert stored == {(jobs[1].job_id, CID), (jobs[2].job_id, CID)}
        assert await db.checkpoint(jobs[1].job_id) == (judged, "accepted")
        assert await db.checkpoints("training_someone_else", None) == []


async def test_only_the_hired_verifiers_report_of_this_training_reaches_its_verification(tmp_path, mosquitto):
    """Issue #29: a verification report is attacker input like any other. A stranger's report in the
    verifier's name, a report for another training or for a request nobody made is ignored."""
    from aitbc_agent_sdk.records import VerifyReport

    verifier, stranger = Account.create(), Account.create()
    async with AsyncExitStack() as exits:
        db = await exits.enter_async_context(TrainingDatabase(tmp_path / "coordinator.db"))
        buses = [await exits.enter_async_context(MqttBus("127.0.0.1", mosquitto.port, client_id=new_id(name),
                                                         persistent=False)) for name in ("coord", "v", "s")]
        listener = TrainingListener(SignedChannel(buses[0], Account.create()), db, TID)
        await listener.start()
        exits.push_async_callback(listener.stop)
        waiting = listener.expect_report("v1", verifier.address)

        def report(request_id: str = "v1", **fields) -> VerifyReport:
            values = dict(request_id=request_id, training_id=TID, verifier_id=verifier.address, round=1, segment=0,
                          end_cid=CID, state_hash="a" * 64, model_hash="b" * 64, signature="0x" + "11" * 65)
            return VerifyReport.model_construct(**(values | fields))
        impostor, honest = SignedChannel(buses[2], stranger), SignedChannel(buses[1], verifier)
        await impostor.publish(topics.verified(TID), report(state_hash="c" * 64))  # in the verifier's name
        await honest.publish(topics.verified(TID), report(training_id="training_someone_else"))
        await honest.publish(topics.verified(TID), report("v2"))  # nobody asked
        await honest.publish(topics.verified(TID), report())
        async with asyncio.timeout(WAIT_S):
            got = await waiting
        assert got.state_hash == "a" * 64 and got.training_id == TID
