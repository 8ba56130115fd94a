"""Strangers who reuse an honest customer's ids, or flood free proposals, against a real provider daemon.

Each test has two parties on the devnet's real parts (mosquitto, js-ipfs, anvil), each with its
own key, broker connection and funded account: the customer, and the stranger (the rig's
attacker), who opens trainings of his own on chain under the customer's id strings. An id string
is anybody's to pick; the escrow makes a training unique as keccak(coordinator, salt(id)), and
the provider keys everything it keeps by that.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import AsyncExitStack

from eth_account import Account

from aitbc_agent_sdk.chain import TransactionSender
from aitbc_agent_sdk.chain._deployment import fund_accounts
from aitbc_agent_sdk.chain._escrow import training_key
from aitbc_agent_sdk.messaging import SignedChannel, topics
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.records import (
    ContractReply, ResendRequest, TrajectoryChallenge, TrajectoryOpening, new_id,
)
from aitbc_agent_sdk.provider._book import BookLimits
from aitbc_agent_sdk.provider._owners import TrainingOwner
from aitbc_agent_sdk.provider._process import RESIDUAL_FILE

from tests.security.provider_rig import PRICE, TRAINING, WAIT_S, Rig, provider_rig, servers  # noqa: F401 (a fixture)


async def customer_of(rig: Rig, servers, exits: AsyncExitStack) -> Rig:
    """The honest customer: a key, a broker connection and a funded account of her own, same provider."""
    account = Account.create()
    await fund_accounts(TransactionSender(servers.w3, servers.funder), [account.address], 10**18)
    bus = await exits.enter_async_context(
        MqttBus("127.0.0.1", servers.broker_port, client_id=f"customer-{new_id('t')}", persistent=False))
    return dataclasses.replace(rig, attacker=SignedChannel(bus, account), bus=bus,
                               sender=TransactionSender(servers.w3, account), opened=set())


async def delivered(rig: Rig, job):
    """Send ``job`` and wait for the result it produces (not an earlier one of the same job id)."""
    results = rig.feeds["results"]
    after = len(results.items)
    await rig.send(topics.jobs(rig.provider.address), job)
    return await results.first(lambda v: v.message.job_id == job.job_id and results.items.index(v) >= after)


async def test_a_stranger_reusing_a_customers_training_and_job_ids_gets_neither_her_process_nor_her_results(servers):
    async with provider_rig(servers) as stranger, AsyncExitStack() as exits:
        customer = await customer_of(stranger, servers, exits)
        openings = await stranger.watch("openings", f"{topics.PREFIX}/openings/#", TrajectoryOpening, exits)
        provider = stranger.provider
        theirs, hers = await stranger.hire(), await customer.hire()  # both trainings are "TRAINING" by name

        # Attack 1: his job runs first; hers, of the same training id string, must not run in his process.
        await delivered(stranger, await stranger.job(theirs))
        his_process = provider.process.pid
        her_job = await customer.job(hers)
        await delivered(customer, her_job)
        assert provider.process.pid != his_process, "her job ran in the process his training had used"

        # Attack 3: he sends a job with her delivered job's id in his own training...
        reused = await stranger.job(theirs, job_id=her_job.job_id, epochs=2)  # another checkpoint than hers
        his_result = await delivered(stranger, reused)
        # ...and her spot check and re-send are still answered, for her job.
        await customer.send(topics.challenge(provider.address), TrajectoryChallenge(
            job_id=her_job.job_id, training_id=TRAINING, round=1, segments=(0,), deadline_s=WAIT_S))
        opening = await openings.first(lambda v: v.message.job_id == her_job.job_id)
        assert opening.sender == provider.address and opening.message.states
        her_result = next(v for v in stranger.feeds["results"].items if v.message.job_id == her_job.job_id)
        assert his_result.message.checkpoint_cid != her_result.message.checkpoint_cid
        before = len(stranger.feeds["results"].items)
        await customer.send(topics.resend(provider.address), ResendRequest(
            job_id=her_job.job_id, training_id=TRAINING, cid=her_result.message.checkpoint_cid,
            reason="could not fetch", deadline_s=WAIT_S))
        resent = await stranger.feeds["results"].first(
            lambda v: v.message.job_id == her_job.job_id and stranger.feeds["results"].items.index(v) >= before)
        assert resent.message.checkpoint_cid == her_result.message.checkpoint_cid  # hers, not his

        # Within one training a job id is used once: a repeat is refused with its reason, and not run.
        again = await customer.job(hers, job_id=her_job.job_id)
        await customer.send(topics.jobs(provider.address), again)
        refusal = await stranger.feeds["progress"].first(
            lambda v: v.message.job_id == her_job.job_id and v.message.status == "failed")
        assert "already used" in refusal.message.error


async def test_a_strangers_refund_under_her_training_id_does_not_sweep_her_kept_state(servers):
    async with provider_rig(servers) as stranger, AsyncExitStack() as exits:
        customer = await customer_of(stranger, servers, exits)
        provider = stranger.provider
        hers = await customer.hire()
        job = (await customer.job(hers)).model_copy(update={"update_encoding": "int8"})  # keeps error feedback
        await delivered(customer, job)
        her_state = (provider.config.work_dir / "task-state" / TrainingOwner(customer.attacker.address, TRAINING).hex
                     / hers / RESIDUAL_FILE)
        assert her_state.is_file()

        # Attack 2: he opens a training under her id string, keeps state of his own there, then refunds
        # (closes) it on chain.
        theirs = await stranger.hire()
        await delivered(stranger, (await stranger.job(theirs)).model_copy(update={"update_encoding": "int8"}))
        await stranger.escrow.refund(stranger.sender, training_key(stranger.sender.address, TRAINING))
        await provider._sweep()  # what the daemon runs every offer refresh
        assert her_state.is_file(), "a stranger's refund swept her kept state"

        # Her own close does sweep it.
        await customer.escrow.refund(customer.sender, training_key(customer.sender.address, TRAINING))
        await provider._sweep()
        assert not her_state.exists()


async def test_a_flood_of_free_proposals_never_evicts_a_funded_contract(servers):
    limits = BookLimits(unfunded=4, per_sender_per_min=3, per_min=1000)
    async with provider_rig(servers, contract_limits=limits) as stranger, AsyncExitStack() as exits:
        customer = await customer_of(stranger, servers, exits)
        provider = stranger.provider
        hers = await customer.hire()  # consented and funded on chain; no job has come yet

        # Attack 4: unfunded proposals, each from a throw-away key, ten times the pool.
        flood = [SignedChannel(stranger.bus, Account.create()) for _ in range(10 * limits.unfunded)]
        replies = []
        for channel in flood:
            contract_id = new_id("contract")
            proposal = stranger.proposal(contract_id).model_copy(update={"coordinator": channel.address})
            replies.append(channel.request(
                topics.negotiate(provider.address), proposal, topics.negotiate_reply(channel.address, contract_id),
                ContractReply, timeout=WAIT_S, expected_sender=provider.address))
        assert all(r.accepted for r in await asyncio.gather(*replies))
        assert len(provider._contracts) <= limits.unfunded + 1

        job = await customer.job(hers)
        await delivered(customer, job)  # her contract was kept: the chain shows it funded

        # One key past its rate is declined, with the reason.
        loud = SignedChannel(stranger.bus, Account.create())
        answers = []
        for _ in range(limits.per_sender_per_min + 1):
            contract_id = new_id("contract")
            proposal = stranger.proposal(contract_id).model_copy(update={"coordinator": loud.address})
            answers.append(await loud.request(
                topics.negotiate(provider.address), proposal, topics.negotiate_reply(loud.address, contract_id),
                ContractReply, timeout=WAIT_S, expected_sender=provider.address))
        assert [a.accepted for a in answers] == [True] * limits.per_sender_per_min + [False]
        assert "too many proposals" in answers[-1].reason
