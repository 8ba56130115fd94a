"""The elastic pool: planning rules (pure), then hiring, releasing and rebalancing on the embedded stack."""

import json

import pytest
import torch

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.chain import training_key
from aitbc_agent_sdk.audit import read_log
from aitbc_agent_sdk.coordinator.round._elastic import (
    count, needs_rebalance, plan_shares, reassign, scaling_decision, take_tail,
)
from aitbc_agent_sdk.coordinator._service import audit_path
from aitbc_agent_sdk.records import ElasticPolicy, SampleRange
from aitbc_agent_sdk._stack import join_embedded_market
from aitbc_agent_sdk.wire._checkpoint import decode_state
from scripts.chaos.byzantine import QuarterSpeedProvider

POLICY = ElasticPolicy(target_samples_per_s=100.0, min_workers=2, max_workers=4, window_rounds=2)


def test_scaling_follows_the_seeds_thresholds_over_the_window():
    assert scaling_decision([60.0, 65.0], 3, POLICY) == "hire"  # both below 70
    assert scaling_decision([60.0, 75.0], 3, POLICY) is None  # one round recovered
    assert scaling_decision([140.0, 131.0], 3, POLICY) == "release"
    assert scaling_decision([140.0, 131.0], 2, POLICY) is None  # already at the minimum
    assert scaling_decision([10.0, 10.0], 4, POLICY) is None  # already at the maximum
    assert scaling_decision([10.0], 3, POLICY) is None  # the window is not full yet


def test_a_round_far_slower_than_the_median_asks_for_a_rebalance():
    assert needs_rebalance({"a": 1.0, "b": 1.1, "c": 1.7}, POLICY)  # median 1.1, limit 1.65
    assert not needs_rebalance({"a": 1.0, "b": 1.1, "c": 1.6}, POLICY)
    assert not needs_rebalance({"a": 9.0}, POLICY)


def test_shares_shrink_for_slow_workers_and_joiners_get_the_mean():
    policy = ElasticPolicy(target_samples_per_s=1.0, rebalance_ratio=1.5, min_shard_samples=10)
    current = {"a": 300, "b": 300, "slow": 300}
    shares = plan_shares(current, {"a": 1.0, "b": 1.0, "slow": 3.0}, [], [], policy)
    assert sum(shares.values()) == 900
    assert shares["slow"] == 100  # a third: what it trains in the median time
    assert shares["a"] == shares["b"] == 400
    grown = plan_shares(current, {"a": 1.0, "b": 1.0, "slow": 1.1}, ["new"], [], policy)
    assert grown == {"a": 225, "b": 225, "slow": 225, "new": 225}
    shrunk = plan_shares(current, {"a": 1.0, "b": 1.0, "slow": 1.0}, [], ["slow"], policy)
    assert shrunk == {"a": 450, "b": 450}
    # never below a third of the mean, however slow
    assert plan_shares(current, {"a": 1.0, "b": 1.0, "slow": 100.0}, [], [], policy)["slow"] == 100
    with pytest.raises(ValueError):
        plan_shares({"a": 15}, {}, ["b"], [], policy)  # two workers cannot both get the floor of 10


def test_moves_are_exact_sample_ranges_and_nothing_is_lost_or_doubled():
    r = SampleRange
    holdings = {"slow": [r(shard=0, start=0, end=100)], "fast": [r(shard=1, start=0, end=100)],
                "leaving": [r(shard=2, start=0, end=50)]}
    targets = {"slow": 40, "fast": 160, "new": 50}
    new, moves = reassign(holdings, targets)
    assert {w: count(x) for w, x in new.items()} == targets
    assert "leaving" not in new
    seen = sorted((x.shard, i) for ranges in new.values() for x in ranges for i in range(x.start, x.end))
    assert seen == sorted([(0, i) for i in range(100)] + [(1, i) for i in range(100)] + [(2, i) for i in range(50)])
    assert new["slow"] == [r(shard=0, start=0, end=40)]  # it keeps the head of its own shard
    assert {(a, b) for a, b, _ in moves} <= {("slow", "fast"), ("slow", "new"), ("leaving", "fast"),
                                             ("leaving", "new")}
    kept, taken = take_tail([r(shard=0, start=0, end=10), r(shard=1, start=0, end=5)], 7)
    assert kept == [r(shard=0, start=0, end=8)] and taken == [r(shard=0, start=8, end=10), r(shard=1, start=0, end=5)]


def spec(policy: ElasticPolicy, workers: int, rounds: int = 3) -> TrainingSpec:
    return TrainingSpec(model_type="mlp", target_workers=workers, rounds=rounds, seed=5, elastic=policy,
                        job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))


async def assert_round_is_the_sample_weighted_average(agent: Agent, tid: str, round_: int) -> None:
    """Hand computation: sum(n_i * w_i) / sum(n_i), n_i the samples in the shard each worker was sent."""
    db, store = agent.coordinator.db, agent.stack.store
    accepted = [c for c in await db.checkpoints(tid, "accepted") if c.round == round_]
    shard_size = {s.cid: s.samples for s in await db.shards(tid)}
    sizes = [shard_size[(await db.job(c.job_id)).shard_cid] for c in accepted]
    states = [decode_state(await store.cat(c.cid)) for c in accepted]
    model = decode_state(await store.cat(next(r for r in await db.rounds(tid) if r.round == round_).model_cid))
    for key, tensor in model.items():
        if tensor.is_floating_point():
            expected = sum(n * s[key].double() for n, s in zip(sizes, states)) / sum(sizes)
            assert torch.allclose(tensor.double(), expected, atol=1e-6), key
    return sizes


def audit(agent: Agent, tid: str) -> list:
    return read_log(audit_path(agent.config.home / "trainings", tid))


async def test_a_slow_pool_hires_and_moves_data_off_the_throttled_worker(aitbc_home):
    policy = ElasticPolicy(target_samples_per_s=1e6, min_workers=2, max_workers=4, window_rounds=1)
    async with Agent(AgentConfig(home=aitbc_home, providers=3)) as agent:
        slow = await join_embedded_market(agent.stack, aitbc_home, 9 * 10**15, factory=QuarterSpeedProvider)
        async with slow:
            report = await agent.run_distributed_training(spec(policy, workers=2))
        assert report.status == TrainingPhase.COMPLETE and report.final_accuracy > 0.9
        log = audit(agent, report.training_id)
        added = [e for e in log if e.event == "worker_added"]
        assert len(added) == 2  # one per round boundary, up to the maximum of 4
        assert added[0].fields["throughput"] < 0.7 * added[0].fields["target"]
        rebalanced = [e for e in log if e.event == "rebalanced"]
        manifest = await agent.coordinator.manifest(report.training_id)
        total = sum(s.samples for s in manifest.shards)
        assert rebalanced and all(sum(e.fields["shares"].values()) == total for e in rebalanced)
        contract = next(c for c in await agent.get_all_workers(report.training_id) if c.worker_id == slow.address)
        first = manifest.shards[contract.shard_index].samples
        shares = [e.fields["shares"][slow.address] for e in rebalanced]
        assert shares[-1] < first and shares == sorted(shares, reverse=True)  # the throttled worker's share shrank
        # the moves are published by CID: exact sample ranges, every sample held exactly once
        plan = json.loads(await agent.stack.store.cat(rebalanced[-1].fields["plan_cid"]))
        held = sorted((r["shard"], i) for share in plan["shares"].values() for r in share["ranges"]
                      for i in range(r["start"], r["end"]))
        assert held == sorted((s.index, i) for s in manifest.shards for i in range(s.samples))
        rounds = await agent.coordinator.db.rounds(report.training_id)
        assert [r.workers for r in rounds] == [2, 3, 4]
        sizes = await assert_round_is_the_sample_weighted_average(agent, report.training_id, 2)  # one joined
        assert len(sizes) == 3 and len(set(sizes)) > 1 and sum(sizes) == total
        state = await agent.stack.escrow.training(training_key(agent.stack.account.address, report.training_id))
        assert state.deposited == state.paid + state.refunded + (await agent.stack.escrow.held(training_key(agent.stack.account.address, report.training_id))).amount
        slots = [e for e in await agent.stack.escrow.events(training_key(agent.stack.account.address, report.training_id)) if e.name == "SlotOpened"]
        assert len(slots) == 4


async def test_a_fast_pool_releases_its_slowest_worker_after_paying_it(aitbc_home):
    policy = ElasticPolicy(target_samples_per_s=1.0, min_workers=2, max_workers=4, window_rounds=1)
    async with Agent(AgentConfig(home=aitbc_home, providers=2)) as agent:
        slow = await join_embedded_market(agent.stack, aitbc_home, 9 * 10**15, factory=QuarterSpeedProvider)
        async with slow:
            report = await agent.run_distributed_training(spec(policy, workers=3, rounds=3))
        assert report.status == TrainingPhase.COMPLETE
        released = [e for e in audit(agent, report.training_id) if e.event == "worker_released"]
        assert [e.fields["worker"] for e in released] == [slow.address]  # the slowest, once: then at the minimum
        assert released[0].fields["paid_wei"] == 9 * 10**15  # its one accepted round, paid at release
        rounds = await agent.coordinator.db.rounds(report.training_id)
        assert [r.workers for r in rounds] == [3, 2, 2]
        sizes = await assert_round_is_the_sample_weighted_average(agent, report.training_id, 2)  # one left
        manifest = await agent.coordinator.manifest(report.training_id)
        assert len(sizes) == 2 and sum(sizes) == sum(s.samples for s in manifest.shards)
        by_address = {w.address: w for w in report.workers}
        assert by_address[slow.address].role == "released" and by_address[slow.address].paid_wei == 9 * 10**15
        state = await agent.stack.escrow.training(training_key(agent.stack.account.address, report.training_id))
        # The released worker's slot is still active: its unpaid two rounds are held for its receipts.
        held = await agent.stack.escrow.held(training_key(agent.stack.account.address, report.training_id))
        assert state.deposited == state.paid + state.refunded + held.amount and held.amount == 2 * 9 * 10**15
