"""Attack: a hired worker announces, under its own signature, a checkpoint that is not safetensors at
all. Decoding it raised out of the round loop and the whole training failed; now it is one more
rejected result, the worker is replaced, and the training completes without paying it.
"""

from __future__ import annotations

import asyncio

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.audit import read_log
from aitbc_agent_sdk.coordinator._service import audit_path
from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.limits import TEXT_MAX_LENGTH
from aitbc_agent_sdk.records import FaultPolicy
from aitbc_agent_sdk.provider import ProviderAgent
from aitbc_agent_sdk._stack import join_embedded_market

ETH = 10**18
CHEAPEST = ETH // 100 - ETH // 1000  # below every embedded provider, so the scorer hires it


async def run_beside(agent: Agent, factory: type[ProviderAgent]):
    """One round of two workers and a spare, with the cheapest provider (so the one hired) a ``factory``."""
    spec = TrainingSpec(model_type="mlp", target_workers=2, rounds=1, spare_workers=1, seed=3,
                        faults=FaultPolicy(heartbeat_timeout_s=5.0, ping_timeout_s=2.0),
                        job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))
    cheat = await join_embedded_market(agent.stack, agent.config.home, CHEAPEST, factory=factory)
    async with cheat:
        return await agent.run_distributed_training(spec), cheat


class GarbageProvider(ProviderAgent):
    """Trains, then stores and signs bytes that are no checkpoint (intact by CID, so no re-send is asked)."""

    async def train_job(self, job, job_dir, on_epoch):
        outcome = await super().train_job(job, job_dir, on_epoch)
        await asyncio.to_thread(outcome.checkpoint.write_bytes, b"\xff" * 64)
        return outcome


async def test_a_checkpoint_that_is_not_safetensors_is_rejected_not_a_crashed_round(aitbc_home):
    async with Agent(AgentConfig(home=aitbc_home, providers=2)) as agent:
        report, cheat = await run_beside(agent, GarbageProvider)
        assert report.status == TrainingPhase.COMPLETE
        by_address = {w.address: w for w in report.workers}
        assert by_address[cheat.address].role == "replaced" and by_address[cheat.address].paid_wei == 0
        log = [e for e in read_log(audit_path(aitbc_home / "trainings", report.training_id))]
        rejected = [e.fields for e in log if e.event == "result_rejected"]
        assert [e["worker"] for e in rejected] == [cheat.address]
        assert "malformed" in rejected[0]["reason"]


class LongErrorProvider(ProviderAgent):
    """Fails every job with an error of the longest length a Progress record allows."""

    async def train_job(self, job, job_dir, on_epoch):
        raise TrainingError("x" * TEXT_MAX_LENGTH)


async def test_a_worker_error_at_the_length_limit_does_not_crash_the_round(aitbc_home):
    """The coordinator quotes a failed worker's error in the cancels, re-sends and replacement records
    it builds ("its job failed: " + error): past the limit those failed validation and ended the round."""
    async with Agent(AgentConfig(home=aitbc_home, providers=2)) as agent:
        report, cheat = await run_beside(agent, LongErrorProvider)
        assert report.status == TrainingPhase.COMPLETE
        by_address = {w.address: w for w in report.workers}
        assert by_address[cheat.address].role == "replaced" and by_address[cheat.address].paid_wei == 0
