"""Attack 7 (issue #25): a check that cannot run never pays.

A lazy worker trains a tenth of its steps and commits to a made-up trajectory whose opened states carry
Adam betas of (1.0, 0.999): the bytes match the commitment, and the coordinator's replay used to divide
by zero, an error the spot check did not catch and the round turned into "accepted unchecked". Now an
opened state must be one the task's own optimizer and scheduler could be in before anything is replayed,
and a check that crashes, times out or gets a malformed opening makes the result unverifiable: unpaid,
not slashed, with the reason in the audit log.
"""

from __future__ import annotations

import asyncio
import re

import torch

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.chain import training_key
from aitbc_agent_sdk.coordinator.checks import _spot_check as spot_check
from aitbc_agent_sdk.coordinator.round._round_work import ended_check
from aitbc_agent_sdk.coordinator.checks._spot_check import SpotCheck
from aitbc_agent_sdk.coordinator.checks._work_checks import PASS
from aitbc_agent_sdk.records import FaultPolicy
from aitbc_agent_sdk.provider import ProviderAgent
from aitbc_agent_sdk._stack import EMBEDDED_STAKE
from scripts.chaos.lazy import LazyProvider
from tests.test_fault_tolerance import events, join_market, warm


async def test_a_spot_check_that_raised_or_was_cancelled_is_unverifiable_not_a_pass():
    async def passes() -> SpotCheck:
        return SpotCheck(PASS, (0,), 0.0)

    async def raises() -> SpotCheck:
        raise ZeroDivisionError("float division by zero")

    async def hangs() -> SpotCheck:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    done = [asyncio.create_task(passes()), asyncio.create_task(raises())]
    cancelled = asyncio.create_task(hangs())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(*done, cancelled, return_exceptions=True)
    assert ended_check(done[0]) == PASS
    crashed = ended_check(done[1])
    assert crashed.problem == ("unverifiable: the spot check could not run (ZeroDivisionError: float division "
                               "by zero)") and not crashed.slashable
    assert ended_check(cancelled).problem == "unverifiable: the spot check was cancelled"


# -- the attack, on the embedded stack -------------------------------------------------------------

POLICY = FaultPolicy(opening_timeout_s=5.0)


class BetasProvider(LazyProvider):
    """The lazy worker of attack 7: every boundary it opens has Adam betas (1.0, 0.999)."""

    def tamper(self, optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:
            group["betas"] = (1.0, 0.999)


class SilentProvider(ProviderAgent):
    """Trains honestly but never answers a spot check's challenge."""

    async def _open_trajectory(self, verified) -> None:
        return None


class FaultyReplayProvider(ProviderAgent):
    """Trains honestly; the coordinator's replay of its segments raises (injected below)."""


async def test_checks_that_cannot_run_pay_nothing_and_slash_nothing(aitbc_home, monkeypatch):
    replay = spot_check.reexecute_with_threads
    victims: set[str] = set()

    def faulty_replay(threads, task, spec, data, config, seed, commitment, starts):
        # MOCK, labelled: a replay error no real opened state can cause once states are validated.
        if commitment.worker.lower() in victims:
            raise OverflowError("injected: the replay overflowed")
        return replay(threads, task, spec, data, config, seed, commitment, starts)

    monkeypatch.setattr(spot_check, "reexecute_with_threads", faulty_replay)
    spec = TrainingSpec(model_type="mlp", target_workers=4, rounds=1, spare_workers=3, seed=3, faults=POLICY,
                        job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))
    # Honest providers: one worker beside the cheats, three spares, and one on the market in case a
    # loaded machine makes a spare a straggler's copy.
    async with Agent(AgentConfig(home=aitbc_home, providers=5)) as agent:
        betas = await join_market(agent, BetasProvider)
        silent = await join_market(agent, SilentProvider)
        faulty = await join_market(agent, FaultyReplayProvider)
        victims.add(faulty.address.lower())
        async with betas, silent, faulty:
            await warm(silent)
            await warm(faulty)
            report = await agent.run_distributed_training(spec)
        key = training_key(agent.stack.account.address, report.training_id)
        released = [e for e in await agent.stack.escrow.events(key) if e.name == "Released"]
        log = events(agent, report.training_id)
        registry = {p.address: await agent.stack.registry.provider(p.address) for p in (betas, silent, faulty)}

    assert report.status == TrainingPhase.COMPLETE
    cheats = {betas.address: r"unverifiable: opened boundary \d+ is not a state of this task: param group 0\.betas "
                             r"is \[1\.0, 0\.999\]",
              silent.address: "missing work: did not open its committed trajectory in time",
              faulty.address: r"unverifiable: the spot check could not run \(OverflowError: injected"}
    paid = {e.args["worker"] for e in released}
    by_address = {w.address: w for w in report.workers}
    for worker, reason in cheats.items():
        checks = [e for e in log if e["event"] == "spot_check" and e["worker"] == worker]
        assert len(checks) == 1 and not checks[0]["passed"] and not checks[0]["slashable"], checks
        assert re.search(reason, checks[0]["reason"]), checks[0]["reason"]
        rejected = [e for e in log if e["event"] == "result_rejected" and e["worker"] == worker]
        assert len(rejected) == 1 and not rejected[0]["slashable"]
        assert worker not in paid and by_address[worker].role == "replaced" and by_address[worker].paid_wei == 0
        assert registry[worker].slashes == 0 and registry[worker].stake == EMBEDDED_STAKE
    assert not [e for e in log if e["event"] == "slashed"]
    # The honest worker of the same round, and the spares that took the cheats' shards over, are paid in full.
    honest = {w.address for w in report.workers if w.role == "worker"}
    assert len(honest) == 4 and not honest & set(cheats) and paid == honest
    assert all(e["passed"] for e in log if e["event"] == "spot_check" and e["worker"] in honest)
