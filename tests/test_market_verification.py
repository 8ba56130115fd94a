"""Spot checks re-executed by verifiers hired among the training's workers (issue #29), on the embedded stack.

The lying verifiers are the chaos suite's (scripts/chaos/verifiers.py); their real-process rows, on
mosquitto, anvil and js-ipfs, are in tests/test_chaos.py.
"""

import asyncio
import contextlib
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.chain import training_key
from aitbc_agent_sdk.records import FaultPolicy
from aitbc_agent_sdk._stack import EMBEDDED_STAKE, join_embedded_market
from aitbc_agent_sdk.provider import ProviderAgent
from aitbc_agent_sdk.provider._verifier import Reexecuted
from scripts.chaos.lazy import LAZY
from scripts.chaos.verifiers import HostileVerifier, LazyVerifier
from tests.test_fault_tolerance import CHEAPEST, events, join_market, warm


def market_spec(canary_rate: float, workers: int = 4, rounds: int = 1, spot_checks: int = 2, segments: int = 64,
                **where: object) -> TrainingSpec:
    choice = {"verify_on": "market", **where}
    faults = FaultPolicy(heartbeat_timeout_s=2.0, ping_timeout_s=1.0, canary_rate=canary_rate,
                         spot_checks=spot_checks, **choice)
    return TrainingSpec(model_type="mlp", target_workers=workers, rounds=rounds, spare_workers=0, seed=3,
                        faults=faults, job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1, segments=segments))


async def paid(agent: Agent, training_id: str, event: str = "Released") -> dict[str, int]:
    """Wei per worker in the chain's ``event``s of the training (``Released``: wages; ``VerifierPaid``: fees)."""
    who = "worker" if event == "Released" else "verifier"
    totals: dict[str, int] = {}
    for e in await agent.stack.escrow.events(training_key(agent.stack.account.address, training_id)):
        if e.name == event:
            totals[e.args[who]] = totals.get(e.args[who], 0) + int(e.args["amount"])
    return totals


# auto sends a model at or above the threshold to the market even on CPUs (this mlp has ~10k parameters)
@pytest.mark.parametrize("where", [{"verify_on": "market"}, {"verify_on": "auto", "market_verify_parameters": 1000}],
                         ids=["market", "auto-large"])
async def test_verifiers_on_the_market_re_execute_every_check_and_the_coordinator_none(aitbc_home, where):
    async with Agent(AgentConfig(home=aitbc_home, providers=3)) as agent:
        report = await agent.run_distributed_training(market_spec(canary_rate=0.5, workers=3, **where))
        log = events(agent, report.training_id)
        wages = await paid(agent, report.training_id)
        verifier_fees = await paid(agent, report.training_id, "VerifierPaid")
    assert report.status == TrainingPhase.COMPLETE
    assert not [e for e in log if e["event"] in ("result_rejected", "slashed", "verifier_wrong", "worker_replaced")]
    verified = [e for e in log if e["event"] == "verification"]
    assert len(verified) == 6  # 3 results x 2 segments, each re-executed by another worker, agreeing
    assert all(e["outcome"] == "agreed" and e["verifier"] not in (None, e["worker"]) for e in verified)
    assert all(e["passed"] for e in [e for e in log if e["event"] == "canary"])
    checks = [e for e in log if e["event"] == "spot_check"]
    assert len(checks) == 3 and all(e["passed"] and e["seconds"] == 0 and e["verifiers"] >= 2 for e in checks)
    assert all(e["verified_on"] == "market" for e in checks)
    assert report.verification is not None and report.verification.coordinator_seconds == 0
    assert report.verification.on_market == 3 and report.verification.verifier_reports >= 6
    # each verification paid through the escrow at the verifier's own price for the share of the job it
    # trained again, apart from the wages (every worker is a verifier here too)
    fees = [e for e in log if e["event"] == "verifiers_paid"]
    assert len(fees) == 1 and fees[0]["reports"] == report.verification.verifier_reports
    assert report.verification.verifier_wei == fees[0]["amount_wei"] == sum(verifier_fees.values()) > 0
    prices = {w.address: w.price_wei for w in report.workers}
    assert set(verifier_fees) <= set(prices) and all(0 < fee < prices[w] for w, fee in verifier_fees.items())
    assert wages == {w.address: w.price_wei for w in report.workers if w.role == "worker"}


class Overlap:
    """Verifications in flight across a set of providers, and the most at once."""

    def __init__(self) -> None:
        self.in_flight = self.most = 0
        self.two = asyncio.Event()


class SlowVerifier(ProviderAgent):
    """An honest verifier that is slow: it starts re-executing only once another verification is in flight
    too (or after 20 s), as a busy GPU box would answer late."""

    def __init__(self, *args: Any, overlap: Overlap, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.overlap = overlap

    async def verify_segment(self, process: Any, owner: Any, request: Any, job_dir: Path) -> Any:
        overlap = self.overlap
        overlap.in_flight += 1
        overlap.most = max(overlap.most, overlap.in_flight)
        if overlap.in_flight >= 2:
            overlap.two.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(overlap.two.wait(), 20.0)
            return await super().verify_segment(process, owner, request, job_dir)
        finally:
            overlap.in_flight -= 1


async def test_checks_wait_for_their_verifiers_at_once_not_in_turn(aitbc_home):
    """The coordinator holds its spot-check turn (and the opened states) only to send a segment and to
    judge a report that does not agree; while verifiers work, the other workers' checks go on. Holding it
    throughout, as before, lets only one verification be in flight at a time."""
    overlap = Overlap()
    async with Agent(AgentConfig(home=aitbc_home, providers=1)) as agent, contextlib.AsyncExitStack() as stack:
        for _ in range(3):
            slow = await join_embedded_market(agent.stack, agent.config.home, CHEAPEST,
                                              factory=partial(SlowVerifier, overlap=overlap))
            await stack.enter_async_context(slow)
            await warm(slow)
        report = await agent.run_distributed_training(market_spec(canary_rate=0.0, workers=3))
        log = events(agent, report.training_id)
    assert report.status == TrainingPhase.COMPLETE
    assert overlap.most >= 2  # two verifiers re-executing for two checks at once
    verified = [e for e in log if e["event"] == "verification"]
    assert len(verified) == 6 and all(e["outcome"] == "agreed" for e in verified)
    assert not [e for e in log if e["event"] in ("result_rejected", "slashed", "verifier_wrong")]


async def test_a_hostile_verifier_loses_its_dispute_at_one_step_and_is_slashed_once_the_worker_paid(aitbc_home):
    """Five segments of each of three honest workers' results a round draw among three verifiers, so the
    hostile one goes unasked in the first round with odds of (2/3)^15 only; once shown wrong it is slashed,
    and never asked again in this training (a later round included), so never slashed twice."""
    async with Agent(AgentConfig(home=aitbc_home, providers=3)) as agent:
        hostile = await join_market(agent, HostileVerifier)
        async with hostile:
            await warm(hostile)
            # segments of several steps: each dispute traces them (one round) before it narrows to one
            report = await agent.run_distributed_training(market_spec(canary_rate=0.0, rounds=2, spot_checks=5,
                                                                      segments=8))
        log = events(agent, report.training_id)
        wages = await paid(agent, report.training_id)
        verifier_fees = await paid(agent, report.training_id, "VerifierPaid")
        state = await agent.stack.registry.provider(hostile.address)
    assert report.status == TrainingPhase.COMPLETE
    assert not [e for e in log if e["event"] == "result_rejected"]  # the work it disputed was honest
    wrong = [e for e in log if e["event"] == "verifier_wrong"]
    assert {e["worker"] for e in wrong} == {hostile.address}
    assert [e["worker"] for e in log if e["event"] == "slashed"] == [hostile.address]
    assert state.slashes == 1 and state.stake < EMBEDDED_STAKE
    # each disagreement narrowed to one step, trained here; no segment replayed here as the referee
    disputes = [e for e in log if e["event"] == "dispute"]
    assert disputes and all(e["verifier"] == hostile.address and e["outcome"] == "verifier" for e in disputes)
    # a segment of several steps is traced once (every step of it) before it narrows; one of one step is not
    assert all(e["steps_trained_here"] == 1 and e["rounds"] == (e["segment_steps"] > 1) for e in disputes)
    assert not [e for e in log if e["event"] == "verification" and e["outcome"] == "refereed"]
    caught_in = min(e["round"] for e in wrong)
    assert not [e for e in log if e["event"] == "verification" and e["verifier"] == hostile.address
                and e["round"] > caught_in]  # never asked again
    assert {e["round"] for e in log if e["event"] == "verification"} == {1, 2}
    # every worker, the hostile verifier too, trained honestly and is paid for it; no verification of the
    # liar's is paid (in the round it was caught, nor before), the honest verifiers' are
    assert wages == {w.address: 2 * w.price_wei for w in report.workers if w.role == "worker"}
    assert hostile.address not in verifier_fees and verifier_fees


async def test_a_lazy_verifier_is_caught_by_a_canary_and_slashed(aitbc_home):
    async with Agent(AgentConfig(home=aitbc_home, providers=3)) as agent:
        lazy = await join_market(agent, LazyVerifier)
        async with lazy:
            await warm(lazy)
            report = await agent.run_distributed_training(market_spec(canary_rate=1.0))
        log = events(agent, report.training_id)
        state = await agent.stack.registry.provider(lazy.address)
        verifier_fees = await paid(agent, report.training_id, "VerifierPaid")
    assert report.status == TrainingPhase.COMPLETE
    assert getattr(lazy, "lazy_reports", 0) > 0
    failed = [e for e in log if e["event"] == "canary" and not e["passed"]]
    assert failed and {e["worker"] for e in failed} == {lazy.address}
    assert [e["worker"] for e in log if e["event"] == "slashed"] == [lazy.address]
    assert state.slashes == 1
    assert lazy.address not in verifier_fees and verifier_fees  # its approvals earned nothing
    assert not [e for e in log if e["event"] == "result_rejected"]


async def test_a_worker_that_skipped_steps_is_caught_by_a_verifier_and_slashed_at_one_step(aitbc_home):
    async with Agent(AgentConfig(home=aitbc_home, providers=4)) as agent:
        cheat = await join_market(agent, LAZY["lazy"])
        async with cheat:
            await warm(cheat)
            report = await agent.run_distributed_training(market_spec(canary_rate=0.0).model_copy(
                update={"spare_workers": 1}))
        log = events(agent, report.training_id)
        state = await agent.stack.registry.provider(cheat.address)
    assert report.status == TrainingPhase.COMPLETE
    rejected = [e for e in log if e["event"] == "result_rejected"]
    assert [e["worker"] for e in rejected] == [cheat.address] and "spot check: segment" in rejected[0]["reason"]
    disputed = [e for e in log if e["event"] == "dispute" and e["worker"] == cheat.address]
    assert disputed and disputed[0]["outcome"] == "worker" and disputed[0]["verifier"] is not None
    assert disputed[0]["steps_trained_here"] == 1 and "step" in rejected[0]["reason"]
    assert not [e for e in log if e["event"] == "verification" and e["outcome"] == "refereed"]
    assert not [e for e in log if e["event"] == "verifier_wrong"]  # the verifier was right
    assert state.slashes == 1


class StonewallingLazy(LAZY["lazy"]):
    """A lazy worker that will not trace its own segments when disputed (labelled fault: a real provider
    never refuses its own trace, but a cheat may)."""

    async def verify_segment(self, process, owner, request, job_dir):
        if request.points or request.stop is not None:
            self.refused = getattr(self, "refused", 0) + 1
            return Reexecuted(problem="will not trace")
        return await super().verify_segment(process, owner, request, job_dir)


async def test_a_worker_that_will_not_trace_leaves_the_dispute_undecided_and_the_referee_catches_it(aitbc_home):
    """A dispute never passes work nobody checked: undecided, the segment is replayed here as before."""
    async with Agent(AgentConfig(home=aitbc_home, providers=4)) as agent:
        cheat = await join_market(agent, StonewallingLazy)
        async with cheat:
            await warm(cheat)
            # one segment a job: every dispute has steps to trace (a one-step segment is settled without)
            report = await agent.run_distributed_training(market_spec(canary_rate=0.0, segments=1).model_copy(
                update={"spare_workers": 1}))
        log = events(agent, report.training_id)
        state = await agent.stack.registry.provider(cheat.address)
    assert report.status == TrainingPhase.COMPLETE
    undecided = [e for e in log if e["event"] == "dispute" and e["worker"] == cheat.address]
    assert undecided and all(e["outcome"] == "undecided" and e["steps_trained_here"] == 0 for e in undecided)
    assert "the worker did not trace" in undecided[0]["reason"] and getattr(cheat, "refused", 0) >= 1
    refereed = [e for e in log if e["event"] == "verification" and e["outcome"] == "refereed"]
    assert refereed and refereed[0]["worker"] == cheat.address
    rejected = [e for e in log if e["event"] == "result_rejected"]
    assert [e["worker"] for e in rejected] == [cheat.address] and "spot check: segment" in rejected[0]["reason"]
    assert not [e for e in log if e["event"] == "verifier_wrong"] and state.slashes == 1


def test_reports_and_requests_hold_what_they_claim():
    from pydantic import ValidationError

    from aitbc_agent_sdk.records import MAX_TRACE_POINTS, VerifyReport

    base = dict(request_id="v1", training_id="training_x", verifier_id="0x" + "1" * 40, round=1, segment=0)
    ended = dict(end_cid="bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy", state_hash="a" * 64,
                 model_hash="b" * 64, signature="0x" + "11" * 65)
    assert VerifyReport(**base, **ended).problem is None
    assert VerifyReport(**base, problem="could not").end_cid is None
    for bad in ({**ended, "problem": "both"}, {k: v for k, v in ended.items() if k != "signature"}, {},
                {"problem": "could not", "trace": ("c" * 64,)}, {**ended, "trace": ("not a hash",)},
                {**ended, "trace": ("c" * 64,) * (MAX_TRACE_POINTS + 1)}):
        with pytest.raises(ValidationError):
            VerifyReport(**base, **bad)


def test_a_canary_start_is_a_different_state_of_the_same_shape_and_ends_compare_by_class():
    import random

    import torch

    from aitbc_agent_sdk.coordinator.checks._market_verification import ends_agree, model_of, perturbed_state
    from aitbc_agent_sdk.proof._trajectory import boundary_hashes, encode_boundary

    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    blob = encode_boundary(model, optimizer, None)
    canary = perturbed_state(blob, random.Random(1))
    assert boundary_hashes(canary) != boundary_hashes(blob)
    before, after = model_of(blob), model_of(canary)
    assert before.keys() == after.keys() and all(before[k].shape == after[k].shape for k in before)
    moved = {k: v + 1.0 for k, v in before.items()}
    near = {k: v + 1.0 + 1e-4 for k, v in before.items()}
    # bit for bit: only equal hashes agree; within a tolerance: ends close relative to the segment's change
    assert ends_agree(True, 0.0, "a", moved, "a", near, before)
    assert not ends_agree(True, 0.05, "a", moved, "b", near, before)
    assert ends_agree(False, 0.05, "a", moved, "b", near, before)
    assert not ends_agree(False, 0.05, "a", moved, "b", after, before)
    assert not ends_agree(False, 0.05, "a", None, "b", near, before)


def test_auto_sends_a_gpu_or_a_large_model_to_the_market_and_a_small_cpu_job_to_the_coordinator():
    from aitbc_agent_sdk.flow import checks_where
    from aitbc_agent_sdk.records import ModelFootprint

    auto = FaultPolicy(verify_on="auto", market_verify_parameters=25_000_000)
    assert not auto.verified_on_market("cpu", 10_000)
    assert auto.verified_on_market("cpu", 25_000_000)  # at the threshold: too much for a laptop
    assert auto.verified_on_market("NVIDIA H100 80GB HBM3", 10_000)
    assert auto.verified_on_market("unconfirmed", 10_000)  # not a CPU: cannot be reproduced here
    assert FaultPolicy(verify_on="market").verified_on_market("cpu", 1)
    assert not FaultPolicy(verify_on="coordinator", market_verify_parameters=1).verified_on_market("h100", 10**9)
    # the cost preview: auto resolves to the market once the rehearsal measured a large model
    big = ModelFootprint(parameters=85_000_000, weights_bytes=340_000_000, parameter_bytes=340_000_000,
                         optimizer_bytes=680_000_000, activation_bytes=1)
    assert checks_where(FaultPolicy(), big) == "market" and checks_where(FaultPolicy(), None) == "auto"
    assert checks_where(FaultPolicy(verify_on="coordinator"), big) == "coordinator"


def test_a_verifier_gets_the_segments_training_at_twice_the_workers_measured_speed_on_top_of_the_timeout():
    from aitbc_agent_sdk.coordinator.checks._spot_check import RECOMPUTE_SLACK, _CheckInputs
    from aitbc_agent_sdk.records import TrajectoryCommitment

    hashes = ("a" * 64,) * 4
    commitment = TrajectoryCommitment(job_id="job-1", worker="0x" + "ab" * 20, steps=250, segment_steps=100,
                                      device="cpu", model_hashes=hashes, state_hashes=hashes,
                                      batch_hashes=hashes[:3])
    check = _CheckInputs(job=None, commitment=commitment, data=None, opened={}, comparison=None, step_s=7.6)
    assert check.work_s(0) == pytest.approx(RECOMPUTE_SLACK * 7.6 * 100) and RECOMPUTE_SLACK >= 2
    assert check.work_s(2) == pytest.approx(RECOMPUTE_SLACK * 7.6 * 50)  # the last segment's 50 steps
