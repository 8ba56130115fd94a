"""One pass of data through a round (issue #14, item 2), on the embedded stack with real providers.

* A round reads its inputs once: the manifest is fetched at most once per round start and no job
  sent costs a fetch (before: three fetches per round start, one more per job and per result).
* A coordinator restarted mid-training keeps every provider's round times (before: they lived in
  memory only, so the resumed coordinator gave every provider the first-round deadline again).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.coordinator import Coordinator, RunRequest, TrainingDatabase, resume_training, run_training
from aitbc_agent_sdk.records import RoundMetrics, TrainingRecord
from aitbc_agent_sdk.storage import ContentStore

SPEC = TrainingSpec(model_type="mlp", target_workers=3, rounds=2, seed=5,
                    job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))


class CountingStore:
    """Instrumentation wrapper, not a mock: every call goes to the real store; each is counted by CID."""

    def __init__(self, inner: ContentStore) -> None:
        self.inner = inner
        self.calls: Counter[tuple[str, str]] = Counter()

    async def add(self, data: Any, **kwargs: Any) -> str:
        return await self.inner.add(data, **kwargs)

    async def cat(self, cid: str, **kwargs: Any) -> bytes:
        self.calls["cat", cid] += 1
        return await self.inner.cat(cid, **kwargs)

    def stream(self, cid: str, **kwargs: Any) -> AsyncIterator[bytes]:
        self.calls["stream", cid] += 1
        return self.inner.stream(cid, **kwargs)

    async def size(self, cid: str) -> int:
        self.calls["size", cid] += 1
        return await self.inner.size(cid)

    def __getattr__(self, name: str) -> Any:  # pin and the rest: passed through uncounted
        return getattr(self.inner, name)


class CountingTrainingDatabase(TrainingDatabase):
    """Instrumentation wrapper, not a mock: the real SQLite store, counting reads of training records."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.record_reads = 0

    async def training(self, training_id: str) -> TrainingRecord:
        self.record_reads += 1
        return await super().training(training_id)


def twin(agent: Agent, store: ContentStore, db: TrainingDatabase, observer: Any = None) -> Coordinator:
    """A second coordinator on the agent's stack (bus, chain, providers): what a restarted process builds."""
    c = agent.coordinator
    return Coordinator(channel=c.channel, store=store, db=db, escrow=c.escrow, scoring=c.scoring,
                       settings=c.settings, observer=observer, registry=c.registry)


async def test_a_round_fetches_the_manifest_once_and_nothing_per_job(aitbc_home: Path) -> None:
    async with Agent(AgentConfig(home=aitbc_home, providers=3)) as agent:
        store = CountingStore(agent.stack.store)
        async with CountingTrainingDatabase(aitbc_home / "counted.db") as db:
            coordinator = twin(agent, store, db)
            try:
                report = await run_training(coordinator, RunRequest(spec=SPEC, round_timeout_s=300))
            finally:
                await coordinator.close()
            jobs = await db.jobs(report.training_id)

    assert report.status == TrainingPhase.COMPLETE
    assert len(jobs) == SPEC.rounds * SPEC.target_workers  # no faults: one job per worker and round
    assert store.calls["cat", report.manifest_cid] <= SPEC.rounds  # at most once per round start
    model_cids = {j.weights_cid for j in jobs}
    shard_cids = {j.shard_cid for j in jobs}
    # Sizes are read once per round for the round's model and each shard, none per job or per result.
    assert sum(store.calls["size", cid] for cid in model_cids) <= SPEC.rounds
    assert all(store.calls["size", cid] <= SPEC.rounds for cid in shard_cids)
    # Record reads: the phase changes and the round's close, a fixed few per round, none per job
    # (before: four per job sent on top of those).
    assert db.record_reads <= 8 * SPEC.rounds + 4, db.record_reads


class SimulatedCrash(BaseException):
    """Fault injection: the coordinator process dies right after round 1 is saved."""


async def test_a_resumed_coordinator_keeps_the_round_times_of_before_the_restart(aitbc_home: Path) -> None:
    def crash_after_round_one(event: object) -> None:
        if isinstance(event, RoundMetrics) and event.round == 1:
            raise SimulatedCrash

    async with Agent(AgentConfig(home=aitbc_home, providers=3)) as agent:
        first = twin(agent, agent.stack.store, agent.coordinator.db, observer=crash_after_round_one)
        with pytest.raises(SimulatedCrash):
            await run_training(first, RunRequest(spec=SPEC, round_timeout_s=300))
        await first.close()  # the dead process's subscriptions go with it
        [record] = await agent.coordinator.db.trainings()
        workers = [c.worker_id for c in await agent.coordinator.db.contracts(record.training_id, "worker")]
        before = {w: list(first.round_times.of(record.training_id, w)) for w in workers}
        assert record.round == 1 and all(len(t) == 1 for t in before.values()), before

        async with TrainingDatabase(aitbc_home / "aitbc.db") as db:  # the restarted process's own connection
            resumed = twin(agent, agent.stack.store, db)
            try:
                outcome = await resume_training(resumed, record.training_id, round_timeout_s=300)
            finally:
                await resumed.close()

    assert outcome is not None
    assert (await agent_db_phase(aitbc_home, record.training_id)) == TrainingPhase.COMPLETE
    for worker, times in before.items():
        # Round 1's time as the first coordinator measured it, then round 2's.
        after = resumed.round_times.of(record.training_id, worker)
        assert after[:1] == times and len(after) == 2, (worker, times, after)


async def agent_db_phase(home: Path, training_id: str) -> TrainingPhase:
    async with TrainingDatabase(home / "aitbc.db") as db:
        return (await db.training(training_id)).phase



async def test_a_rounds_metrics_and_the_record_moving_past_it_are_saved_together(tmp_path):
    """A coordinator killed between the two writes would resume a round its metrics call done: they are
    one transaction, so a failed record write keeps no metrics either."""
    cid = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    record = TrainingRecord(training_id="training_00000000000000001", coordinator="0x" + "ab" * 20,
                            spec=TrainingSpec(model_type="mlp", target_workers=1, rounds=2))
    metrics = RoundMetrics(round=1, accuracy=0.5, loss=1.0, model_cid=cid, workers=1)
    async with TrainingDatabase(tmp_path / "aitbc.db") as db:
        await db.save_training(record)
        with pytest.raises(AttributeError):  # the record's write fails after the metrics' (no phase to store)
            await db.finish_round(metrics, record.model_copy(update={"round": 1, "phase": None}))
        assert await db.rounds(record.training_id) == [] and (await db.training(record.training_id)).round == 0
        await db.finish_round(metrics, record.model_copy(update={"round": 1}))
        assert [r.round for r in await db.rounds(record.training_id)] == [1]
        assert (await db.training(record.training_id)).round == 1
