"""End to end on the embedded stack: real training in worker processes, real escrow on py-evm."""

import sqlite3

import pytest

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.chain import result_hash, training_key
from aitbc_agent_sdk.records import ShardManifest
from aitbc_agent_sdk.tasks._networks import build_model
from aitbc_agent_sdk.wire._checkpoint import decode_state

async def test_four_workers_five_rounds_train_and_get_paid(aitbc_home):
    events = []
    config = AgentConfig(home=aitbc_home, providers=4)
    async with Agent(config, observer=events.append) as agent:
        w3 = agent.stack.sender.w3
        before = {p.address: await w3.eth.get_balance(p.address) for p in agent.stack.providers}
        spec = TrainingSpec(model_type="mlp", target_workers=4, rounds=5,
                            job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=2))
        report = await agent.run_distributed_training(spec)

        # the model learned, round by round, on held-out data
        assert report.status == TrainingPhase.COMPLETE
        assert [r.round for r in report.rounds] == [1, 2, 3, 4, 5]
        assert report.final_accuracy >= 0.95
        assert report.rounds[-1].accuracy > report.rounds[0].accuracy
        assert report.rounds[-1].loss < report.rounds[0].loss

        # every shard, the test split and every model are content-addressed and verifiable
        store = agent.stack.store
        manifest = ShardManifest.model_validate_json(await store.cat(report.manifest_cid))
        data = agent.coordinator.data  # shards are slices of the dataset's files, read back by range
        dataset = await data.manifest(manifest.dataset_cid)
        for cid in (manifest.test_cid, *(s.cid for s in manifest.shards)):
            (await data.shard(cid)).data.check_within(dataset)
        test_split = await data.load(manifest.test_cid)
        shards = [await data.load(s.cid) for s in manifest.shards]
        assert [len(s) for s in shards] == [s.samples for s in manifest.shards]
        assert sum(len(s) for s in shards) + len(test_split) == 1797  # all of digits, nothing twice
        final = decode_state(await store.cat(report.model_cid))
        model_spec = await agent.coordinator.model_spec(report.training_id)
        assert set(final) == set(build_model(model_spec).state_dict())
        assert all(t.isfinite().all() for t in final.values())
        assert report.rounds[-1].model_cid == report.model_cid

        # the chain agrees with the report, to the wei
        escrow = agent.stack.escrow
        state = await escrow.training(training_key(agent.stack.account.address, report.training_id))
        assert state.closed
        assert state.deposited == report.escrow.deposited_wei == sum(w.price_wei * 5 for w in report.workers)
        held = await escrow.held(training_key(agent.stack.account.address, report.training_id))
        assert state.deposited == state.paid + state.refunded + held.amount
        assert state.paid == sum(w.paid_wei for w in report.workers)
        released = [e for e in await escrow.events(training_key(agent.stack.account.address, report.training_id)) if e.name == "Released"]
        assert len(released) == 4
        accepted = await agent.coordinator.db.checkpoints(report.training_id, "accepted")
        last_cids = {c.worker_id: c.cid for c in accepted if c.round == 5}
        for worker in report.workers:
            assert worker.status == "paid" and worker.rounds_accepted == 5
            assert worker.paid_wei == worker.price_wei * 5
            # providers send no transaction while working, so their balance rises by exactly their pay
            assert await w3.eth.get_balance(worker.address) == before[worker.address] + worker.paid_wei
            event = next(e for e in released if e.args["worker"] == worker.address)
            assert event.args["amount"] == worker.paid_wei
            assert event.args["resultHash"] == result_hash(last_cids[worker.address])
        # all four paid in one transaction
        assert len({w.tx_hash for w in report.workers}) == 1
        # bonded in the registry, and the escrow reported each completed job there
        for worker in report.workers:
            state = await agent.stack.registry.provider(worker.address)
            assert state.registered and state.stake > 0
            assert state.completed == 1 and state.failed == 0 and state.assigned == 0

    # progress streamed while it ran
    from aitbc_agent_sdk.records import Progress
    assert any(isinstance(e, Progress) and e.status == "running" and e.loss is not None for e in events)

    # and it is all in SQLite
    with sqlite3.connect(aitbc_home / "aitbc.db") as db:
        assert db.execute("SELECT phase FROM trainings").fetchall() == [("complete",)]
        assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 20
        assert db.execute("SELECT COUNT(*) FROM rounds").fetchone()[0] == 5
        assert db.execute("SELECT COUNT(*) FROM payments").fetchone()[0] == 4


async def test_dirichlet_partition_trains_too(aitbc_home):
    async with Agent(AgentConfig(home=aitbc_home, providers=3)) as agent:
        spec = TrainingSpec(model_type="mlp", target_workers=3, rounds=2, partition="dirichlet",
                            dirichlet_alpha=0.3, job=JobConfig(batch_size=32, learning_rate=3e-3, epochs=1))
        report = await agent.run_distributed_training(spec)
    shards_skewed = report.workers
    assert report.status == TrainingPhase.COMPLETE
    assert len({w.samples for w in shards_skewed}) > 1  # label skew gives unequal shards
    assert report.final_accuracy > 0.5
    assert report.escrow.deposited_wei == report.escrow.paid_wei + report.escrow.refunded_wei + report.escrow.held_wei


@pytest.mark.parametrize("model", ["cnn", "transformer"])
async def test_other_registered_models_run_federated(aitbc_home, model):
    async with Agent(AgentConfig(home=aitbc_home, providers=2)) as agent:
        spec = TrainingSpec(model_type=model, target_workers=2, rounds=1,
                            job=JobConfig(batch_size=32, learning_rate=3e-3, epochs=1))
        report = await agent.run_distributed_training(spec)
    assert report.status == TrainingPhase.COMPLETE
    assert report.final_accuracy > 0.3  # one short round; learning, not chance (0.1)


async def test_a_cancelled_training_pays_its_accepted_rounds_and_refunds_the_rest(aitbc_home):
    """An SDK caller who gives up (a timeout, Ctrl-C under asyncio.run) leaves nothing locked in the escrow."""
    import asyncio

    from aitbc_agent_sdk.coordinator._monitor import snapshot
    from aitbc_agent_sdk.records import RoundMetrics

    first_round = asyncio.Event()
    observer = lambda event: first_round.set() if isinstance(event, RoundMetrics) else None  # noqa: E731
    async with Agent(AgentConfig(home=aitbc_home, providers=2), observer=observer) as agent:
        spec = TrainingSpec(model_type="mlp", target_workers=2, rounds=100,
                            job=JobConfig(batch_size=64, learning_rate=1e-2, epochs=1))
        training = asyncio.create_task(agent.run_distributed_training(spec))
        waiting = asyncio.create_task(first_round.wait())
        await asyncio.wait({training, waiting}, return_when=asyncio.FIRST_COMPLETED)
        assert not training.done(), training.exception()
        training.cancel()
        with pytest.raises(asyncio.CancelledError):
            await training
        (record,) = await agent.coordinator.db.trainings()
        escrow = await agent.coordinator.db.escrow(record.training_id)
        state = await agent.coordinator.escrow.escrow.training(agent.coordinator.escrow.key(record.training_id))
        snap = await snapshot(agent.coordinator.db, record.training_id, audit_dir=aitbc_home / "trainings")
    assert record.phase == TrainingPhase.FAILED and state.closed
    assert snap.failure == "stopped by the user"  # what monitor shows as the reason
    # The first round paid; the other 99 came back, or are held for the workers' receipts' claim window.
    assert escrow.paid_wei > 0 and escrow.refunded_wei + escrow.held_wei > 0
    assert escrow.deposited_wei == escrow.paid_wei + escrow.refunded_wei + escrow.held_wei
