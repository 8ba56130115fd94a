"""The provider agent against a test coordinator: signed results, cancel and ping.

The harness here (an in-memory bus, a local content store, a coordinator channel) is
also used by test_byzantine.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from eth_account import Account
from eth_account.messages import encode_defunct

from aitbc_agent_sdk.chain import (
    DevChain, EscrowClient, TransactionSender, deploy, load_artifact, start_embedded_chain, training_key,
    training_salt,
)
from aitbc_agent_sdk.chain._registry import result_digest
from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel, topics
from aitbc_agent_sdk.records import (
    ContractProposal, ContractReply, Hardware, JobAssignment, JobCancel, JobConfig, JobResult, ModelSpec, Ping,
    Pong, Progress, new_id,
)
from aitbc_agent_sdk.provider._node import ProviderAgent, ProviderConfig
from aitbc_agent_sdk.provider._onchain import ProviderChain
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.data._datasets import LabeledData, load_dataset
from aitbc_agent_sdk.tasks._networks import build_model, model_spec_for
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.coordinator.data._datasets import store_shard

TRAINING = "training-under-test"
PRICE = 10**15
HARDWARE = Hardware(cpu_model="test cpu", cpu_cores=1, ram_bytes=1 << 30)
WAIT_S = 60.0  # generous upper bound for a subprocess on a loaded machine; tests finish far sooner


class Feed:
    """Every message seen on one topic filter, with a way to wait for one that matches."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = asyncio.Condition()

    async def collect(self, messages: AsyncIterator[Any]) -> None:
        async for verified in messages:
            async with self._changed:
                self.items.append(verified.message)
                self._changed.notify_all()

    async def first(self, matches: Callable[[Any], bool], timeout: float = WAIT_S) -> Any:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: any(matches(item) for item in self.items))
        return next(item for item in self.items if matches(item))


@dataclass
class Market:
    """A test coordinator on an in-memory bus, a local content store and an embedded chain, where it
    funds each provider's slot (a provider works only for a slot funded on chain)."""

    bus: InMemoryBus
    store: LocalContentStore
    coordinator: SignedChannel
    data: LabeledData
    spec: ModelSpec
    work_root: Path
    escrow: EscrowClient
    sender: TransactionSender  # the coordinator's account on chain
    provider_chain: ProviderChain
    results: Feed = field(default_factory=Feed)
    progress: Feed = field(default_factory=Feed)

    def initial_weights(self, seed: int = 0) -> dict[str, torch.Tensor]:
        return build_model(self.spec, seed=seed).state_dict()

    @asynccontextmanager
    async def provider(self, agent_class: type[ProviderAgent] = ProviderAgent,
                       **config: Any) -> AsyncIterator[ProviderAgent]:
        agent = agent_class(Account.create(), self.bus, self.store, ProviderConfig(
            price_wei=PRICE, work_dir=self.work_root / new_id("provider"), **config), hardware=HARDWARE,
            chain=self.provider_chain)
        async with agent:
            yield agent

    async def hire(self, provider: ProviderAgent, coordinator: SignedChannel | None = None) -> str:
        """Agree a contract and (for the market's own coordinator) fund the provider's slot; returns its id."""
        coordinator = coordinator or self.coordinator
        proposal = ContractProposal(contract_id=new_id("contract"), training_id=TRAINING,
                                    coordinator=coordinator.address, price_wei=PRICE, rounds=5)
        reply = await coordinator.request(
            topics.negotiate(provider.address), proposal,
            topics.negotiate_reply(coordinator.address, proposal.contract_id), ContractReply,
            timeout=WAIT_S, expected_sender=provider.address)
        assert reply.accepted and reply.consent
        if coordinator is self.coordinator:
            key, consent = training_key(self.sender.address, TRAINING), bytes.fromhex(reply.consent[2:])
            if not (await self.escrow.training(key)).exists:
                await self.escrow.open(self.sender, training_salt(TRAINING), [provider.address], [PRICE * 5],
                                       [consent])
            elif (await self.escrow.slot(key, provider.address)).amount == 0:
                await self.escrow.add_worker(self.sender, key, provider.address, PRICE * 5, consent)
        return proposal.contract_id

    def signer_of(self, result: JobResult) -> str:
        """Who signed the result's evidence for this market's chain, registry, training and round."""
        key = training_key(self.coordinator.address, result.training_id)
        digest = result_digest(self.provider_chain.domain, key, result.round, result.checkpoint_cid)
        return Account.recover_message(encode_defunct(primitive=digest), signature=result.signature)

    async def assign(self, provider: ProviderAgent, contract_id: str, *, round: int = 1,
                     config: JobConfig = JobConfig(epochs=1), weights: dict[str, torch.Tensor] | None = None,
                     seed: int = 7, update_encoding: str = "weights") -> JobAssignment:
        weights = self.initial_weights() if weights is None else weights
        (shard_cid, shard_bytes), blob = await store_shard(self.store, self.data), encode_state(weights)
        job = JobAssignment(job_id=new_id("job"), training_id=TRAINING, round=round, worker_id=provider.address,
                            contract_id=contract_id, shard_cid=shard_cid, shard_bytes=shard_bytes,
                            weights_cid=await self.store.add(blob), weights_bytes=len(blob), model=self.spec,
                            config=config, seed=seed, update_encoding=update_encoding)
        await self.coordinator.publish(topics.jobs(provider.address), job)
        return job

    async def result(self, job: JobAssignment) -> JobResult:
        return await self.results.first(lambda r: r.job_id == job.job_id)

    async def status(self, job: JobAssignment, status: str, *, min_epoch: int = 0) -> Progress:
        return await self.progress.first(
            lambda p: p.job_id == job.job_id and p.status == status and p.epoch >= min_epoch)

    def statuses(self, job: JobAssignment) -> list[tuple[str, int]]:
        return [(p.status, p.epoch) for p in self.progress.items if p.job_id == job.job_id]


@asynccontextmanager
async def open_market(tmp_path: Path, samples: int = 200) -> AsyncIterator[Market]:
    data = load_dataset("digits").subset(list(range(samples)))
    bus = InMemoryBus()
    chain: DevChain = await start_embedded_chain()
    account = Account.create()
    await chain.fund(account.address, 10**20)
    sender = TransactionSender(chain.w3, account)
    escrow = EscrowClient(chain.w3, await deploy(sender, load_artifact("TrainingEscrow")))
    market = Market(bus=bus, store=LocalContentStore(tmp_path / "store"),
                    coordinator=SignedChannel(bus, account), data=data,
                    spec=model_spec_for("mlp", data), work_root=tmp_path / "providers", escrow=escrow,
                    sender=sender, provider_chain=await ProviderChain.connect(chain.w3, escrow.address))
    async with AsyncExitStack() as exits:
        exits.push_async_callback(bus.close)
        feeds = []
        for feed, topic, model in ((market.results, topics.results(TRAINING), JobResult),
                                   (market.progress, topics.all_progress(TRAINING), Progress)):
            messages = await exits.enter_async_context(market.coordinator.subscribe(topic, model))
            feeds.append(asyncio.create_task(feed.collect(messages)))
        try:
            yield market
        finally:
            for task in feeds:
                task.cancel()
            await asyncio.gather(*feeds, return_exceptions=True)


def signer_of(market: Market, result: JobResult) -> str:
    return market.signer_of(result)


async def until(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Wait for state the bus does not announce; fails with TimeoutError if it never comes."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def process_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# Enough work that a job is still training when the test cancels it (minutes, were it left alone).
LONG_JOB = JobConfig(epochs=1000, batch_size=4)


async def test_results_are_signed_by_the_provider_over_training_and_checkpoint(tmp_path):
    async with open_market(tmp_path) as market, market.provider() as provider:
        job = await market.assign(provider, await market.hire(provider))
        result = await market.result(job)
        await market.status(job, "complete")
    assert signer_of(market, result) == provider.address
    # the signature is bound to the CID: another CID does not recover to the provider
    other = result.model_copy(update={"checkpoint_cid": job.weights_cid})
    assert signer_of(market, other) != provider.address
    assert provider.completed_jobs == 1 and provider.progress(job.job_id).status == "complete"


async def test_cancel_kills_a_running_job_and_the_next_job_still_completes(tmp_path):
    async with open_market(tmp_path) as market, market.provider() as provider:
        contract = await market.hire(provider)
        long_job = await market.assign(provider, contract, config=LONG_JOB)
        await market.status(long_job, "running", min_epoch=1)  # inside the training process now
        training_pid = provider.process.pid
        assert training_pid is not None

        await market.coordinator.publish(topics.cancel(provider.address), JobCancel(
            job_id=long_job.job_id, training_id=TRAINING, reason="a duplicate finished first"))
        cancelled = await market.status(long_job, "cancelled")

        assert cancelled.epoch >= 1 and cancelled.epoch < LONG_JOB.epochs
        assert process_is_gone(training_pid)
        assert provider.process.pid is None  # restarted lazily by the next job
        assert provider.progress(long_job.job_id).status == "cancelled"

        next_job = await market.assign(provider, contract)
        result = await market.result(next_job)
        assert provider.process.pid not in (None, training_pid)
    assert signer_of(market, result) == provider.address
    assert all(r.job_id != long_job.job_id for r in market.results.items)
    assert provider.completed_jobs == 1


async def test_a_cancelled_queued_job_never_runs(tmp_path):
    async with open_market(tmp_path) as market, market.provider() as provider:
        contract = await market.hire(provider)
        running = await market.assign(provider, contract, config=LONG_JOB)
        await market.status(running, "running", min_epoch=1)
        queued = await market.assign(provider, contract)  # waits for the only slot
        await until(lambda: queued.job_id in provider.active_job_ids)  # a cancel can overtake its job

        await market.coordinator.publish(topics.cancel(provider.address), JobCancel(
            job_id=queued.job_id, training_id=TRAINING, reason="reassigned"))
        await market.status(queued, "cancelled")
        pid = provider.process.pid

        assert market.statuses(queued) == [("cancelled", 0)]
        assert provider.progress(running.job_id).status == "running"  # the running job is untouched
        assert pid is not None and not process_is_gone(pid)


async def test_cancel_from_a_coordinator_that_does_not_own_the_job_is_ignored(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="aitbc_agent_sdk.provider._node")
    async with open_market(tmp_path) as market, market.provider() as provider:
        job = await market.assign(provider, await market.hire(provider), config=JobConfig(epochs=40, batch_size=8))
        await market.status(job, "running", min_epoch=1)
        # The intruder holds a contract with the same provider, just not this job's.
        intruder = SignedChannel(market.bus, Account.create())
        await market.hire(provider, intruder)

        await intruder.publish(topics.cancel(provider.address), JobCancel(
            job_id=job.job_id, training_id=TRAINING, reason="let me have the slot"))
        # The warning is only logged while the job is active, so the cancel met a running job.
        await until(lambda: "ignored" in caplog.text)

        result = await market.result(job)
        await market.status(job, "complete")
    assert result.job_id == job.job_id
    assert "cancelled" not in [status for status, _ in market.statuses(job)]


async def test_a_cancel_for_an_unknown_or_finished_job_changes_nothing(tmp_path):
    async with open_market(tmp_path) as market, market.provider() as provider:
        contract = await market.hire(provider)
        done = await market.assign(provider, contract)
        await market.status(done, "complete")
        for job_id in (done.job_id, "job_unknown"):
            await market.coordinator.publish(topics.cancel(provider.address), JobCancel(
                job_id=job_id, training_id=TRAINING, reason="too late"))
        # a ping on the same provider is answered after the cancels were read
        await market.coordinator.request(
            topics.ping(provider.address), Ping(nonce="n1", sent_at=time.time()),
            topics.pong(market.coordinator.address, "n1"), Pong, timeout=WAIT_S, expected_sender=provider.address)
        after = await market.assign(provider, contract)
        await market.result(after)
    assert provider.progress(done.job_id).status == "complete"
    assert provider.completed_jobs == 2


async def test_a_ping_is_answered_with_a_pong_to_its_sender(tmp_path):
    async with open_market(tmp_path) as market, market.provider() as provider:
        nonce = new_id("ping")
        pong = await market.coordinator.request(
            topics.ping(provider.address), Ping(nonce=nonce, sent_at=time.time()),
            topics.pong(market.coordinator.address, nonce), Pong, timeout=5, expected_sender=provider.address)
        assert pong == Pong(nonce=nonce, busy_jobs=0)

        job = await market.assign(provider, await market.hire(provider), config=LONG_JOB)
        await market.status(job, "running")
        busy = await market.coordinator.request(
            topics.ping(provider.address), Ping(nonce="busy", sent_at=time.time()),
            topics.pong(market.coordinator.address, "busy"), Pong, timeout=5, expected_sender=provider.address)
        assert busy.busy_jobs == 1


async def test_an_idle_provider_stops_when_cancelled_as_work_comes_in(tmp_path):
    # Work arriving in the very tick the daemon is cancelled: Python 3.11's wait_for returned the event's result
    # and lost the cancel, so the advertise loop went on and the provider's shutdown hung in its gather.
    async with open_market(tmp_path) as market, market.provider() as provider:
        advertise = provider._tasks[-1]  # noqa: SLF001 - the loop under test, started last by __aenter__
        await asyncio.sleep(0.1)  # idle: waiting for work or the offer's refresh
        assert not provider.at_work and not advertise.done()
        provider._set_to_work.set()  # noqa: SLF001
        advertise.cancel()
        done, _ = await asyncio.wait({advertise}, timeout=10)
        assert done and advertise.cancelled(), "the advertise loop swallowed its cancel"
