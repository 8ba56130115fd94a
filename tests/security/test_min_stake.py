"""Attack 6: a sybil with no bond. Before the fix a provider with 0 ETH and no bond in the registry was hired
first whenever it was cheapest: an identity costs nothing, so nothing made a stranger's failure cost it.
Now discovery on any network but the embedded one hires only providers bonded with at least the
training's minimum (``--min-stake``, 0.01 ETH by default), says how many offers it skipped and why, and
never takes one of them as a replacement either; the embedded network's providers are the user's own
processes, so it asks for no bond.

The market test runs two real provider agents on mosquitto and anvil: a cheap one that never bonded and a
bonded one that asks twice as much.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from aitbc_agent_sdk import flow
from aitbc_agent_sdk._agent import Agent
from aitbc_agent_sdk.chain import EscrowClient, TransactionSender
from aitbc_agent_sdk.chain._deployment import deploy_contracts, fund_accounts
from aitbc_agent_sdk.chain._registry import RegistryClient
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.coordinator.round._reassign import hire, new_replacement
from aitbc_agent_sdk.coordinator._service import Coordinator
from aitbc_agent_sdk.coordinator._settings import CoordinatorSettings
from aitbc_agent_sdk.coordinator.money._settlement import EscrowAccount
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.devnet._network import DevnetOptions
from aitbc_agent_sdk.errors import NotEnoughWorkersError
from aitbc_agent_sdk.market import WeightedScore
from aitbc_agent_sdk.market._discovery import (
    DEFAULT_MIN_STAKE_WEI, collect_offers, resolve_min_stake, split_by_stake, stake_skip_text,
)
from aitbc_agent_sdk.messaging import SignedChannel
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.records import Hardware, Offer, TrainingSpec, Worker, new_id
from aitbc_agent_sdk.provider._node import ProviderAgent, ProviderConfig
from aitbc_agent_sdk.provider._onchain import ProviderChain
from aitbc_agent_sdk._stack import EMBEDDED_STAKE
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_cli.exits import ExitCode

HARDWARE = Hardware(cpu_model="test cpu", cpu_cores=1, ram_bytes=1 << 30)  # no GPU: no hardware challenge
CHEAP, BONDED_PRICE = 10**15, 2 * 10**15
WAIT_S = 90.0  # upper bound on a loaded 2-core machine; the test waits for events and ends far sooner


# -- the rule (pure) ----------------------------------------------------------------------------

def _worker(stake_wei: int) -> Worker:
    offer = Offer(provider=Account.create().address, price_wei=CHEAP, hardware=HARDWARE)
    return Worker(worker_id=offer.provider, offer=offer, reputation=2.5, stake_wei=stake_wei)


def test_only_offers_bonded_at_the_minimum_or_more_are_kept():
    at, above, below, none = (_worker(s) for s in (10**16, 10**18, 10**16 - 1, 0))
    kept, skipped = split_by_stake([at, above, below, none], 10**16)
    assert kept == [at, above]
    assert skipped == {below.worker_id: 10**16 - 1, none.worker_id: 0}
    assert split_by_stake([at, none], 0) == ([at, none], {})  # no minimum: nobody is skipped


def test_the_training_chooses_else_the_network_else_the_default():
    assert resolve_min_stake(5, 7) == 5 and resolve_min_stake(0, 7) == 0  # an explicit 0 is a choice
    assert resolve_min_stake(None, 7) == 7 and resolve_min_stake(None, 0) == 0
    assert resolve_min_stake(None, None) == DEFAULT_MIN_STAKE_WEI == 10**16
    assert CoordinatorSettings().min_stake_wei is None and TrainingSpec(model_type="mlp",
                                                                        target_workers=1).min_stake_wei is None


def test_the_reason_reads_as_the_user_sees_it():
    assert stake_skip_text(3, 10**16) == "3 offers skipped: stake below 0.01 ETH"
    assert stake_skip_text(1, 10**18) == "1 offer skipped: stake below 1 ETH"


def test_the_cost_preview_shows_the_minimum_and_the_skipped_offers_without_adding_them_up():
    cost = flow.preview([10**16], [], 2, min_stake_wei=10**16, stake_skipped=2)
    assert [wei for _, wei in cost.items()] == [2 * 10**16]  # the bond is a condition, not a cost
    assert cost.notes() == ["hired providers hold at least 0.01 ETH of bond (--min-stake)",
                            "2 offers skipped: stake below 0.01 ETH"]
    assert cost.as_json()["min_stake_wei"] == str(10**16) and cost.as_json()["stake_skipped"] == 2
    assert flow.preview([1], [], 1).notes() == ["hired providers hold at least 0 ETH of bond (--min-stake)"]


def test_devnet_and_embedded_providers_bond_at_least_the_default():
    assert DevnetOptions().provider_stake_wei >= DEFAULT_MIN_STAKE_WEI
    assert EMBEDDED_STAKE >= DEFAULT_MIN_STAKE_WEI


# -- the market: mosquitto and anvil --------------------------------------------------------------

@dataclass
class Market:
    coordinator: Coordinator
    cheap: ProviderAgent  # never bonded, half the price
    bonded: ProviderAgent  # bonded with exactly the default minimum


async def _provider(exits: AsyncExitStack, home: Path, port: int, account: LocalAccount, price: int,
                    chain: ProviderChain) -> ProviderAgent:
    bus = await exits.enter_async_context(MqttBus("127.0.0.1", port, client_id=f"provider-{new_id('t')}"))
    return ProviderAgent(account, bus, LocalContentStore(home / "store"),
                         ProviderConfig(price_wei=price, work_dir=home / "providers" / account.address),
                         hardware=HARDWARE, chain=chain)


async def _both_offers_retained(channel: SignedChannel, providers: set[str]) -> None:
    """Discovery reads retained offers: wait until the broker holds both."""
    async with asyncio.timeout(WAIT_S):
        while not providers <= {o.provider for o in await collect_offers(channel, timeout=5.0, quiet=1.0)}:
            pass


@asynccontextmanager
async def market(home: Path, port: int, w3, funder: LocalAccount) -> AsyncIterator[Market]:
    deployment = await deploy_contracts(TransactionSender(w3, funder))
    escrow = EscrowClient(w3, deployment.escrow)
    registry = RegistryClient(w3, await escrow.registry())
    coordinator_key, cheap_key, bonded_key = (Account.create() for _ in range(3))
    await fund_accounts(TransactionSender(w3, funder), [coordinator_key.address, bonded_key.address], 10**18)
    chain = await ProviderChain.connect(w3, deployment.escrow)
    async with AsyncExitStack() as exits:
        cheap = await _provider(exits, home, port, cheap_key, CHEAP, chain)
        bonded = await _provider(exits, home, port, bonded_key, BONDED_PRICE, chain)
        await registry.register(TransactionSender(w3, bonded_key), DEFAULT_MIN_STAKE_WEI,
                                keccak(text=bonded.offer_metadata()))
        for provider in (cheap, bonded):
            await exits.enter_async_context(provider)
        bus = await exits.enter_async_context(
            MqttBus("127.0.0.1", port, client_id=f"coordinator-{new_id('t')}", persistent=False))
        db = await exits.enter_async_context(TrainingDatabase(home / "aitbc.db"))
        coordinator = Coordinator(
            channel=SignedChannel(bus, coordinator_key), store=LocalContentStore(home / "store"), db=db,
            escrow=EscrowAccount(TransactionSender(w3, coordinator_key), escrow), scoring=WeightedScore(),
            settings=CoordinatorSettings(discovery_timeout_s=10.0, reply_timeout_s=WAIT_S), registry=registry)
        await _both_offers_retained(coordinator.channel, {cheap.address, bonded.address})
        yield Market(coordinator, cheap, bonded)


@pytest.fixture
async def stake_market(aitbc_home, fresh_mosquitto, anvil_w3, anvil_dev_accounts) -> AsyncIterator[Market]:
    """A broker of its own, so no other test's retained offer joins this market; dev account 9 deploys and
    funds (no other test module uses it)."""
    async with market(aitbc_home, fresh_mosquitto.port, anvil_w3, anvil_dev_accounts[9]) as m:
        yield m


async def test_the_bonded_provider_is_hired_and_the_cheaper_unbonded_one_skipped_with_its_reason(stake_market):
    c, cheap, bonded = stake_market.coordinator, stake_market.cheap, stake_market.bonded
    record = await c.initialize(TrainingSpec(model_type="mlp", target_workers=1))

    found = await c.discover(min_stake_wei=record.spec.min_stake_wei)
    assert [w.worker_id for w in found] == [bonded.address] and found[0].stake_wei == DEFAULT_MIN_STAKE_WEI
    assert c.stake_skipped == {cheap.address: 0}
    assert c.stake_skips(record.spec.min_stake_wei) == "1 offer skipped: stake below 0.01 ETH"
    (contract,) = await hire(c, c.logs.of(record.training_id), record.training_id, c.select(found, 1))
    assert contract.worker_id == bonded.address

    # A replacement is hired through the same discovery: the unbonded offer is never taken, and the
    # error says why nobody was and which flag lowers the bar.
    with pytest.raises(NotEnoughWorkersError, match=r"1 offer skipped: stake below 0\.01 ETH \(--min-stake\)"):
        await new_replacement(c, record.spec, record.training_id, {bonded.address}, max_price_wei=None)
    assert {x.worker_id for x in await c.db.contracts(record.training_id)} == {bonded.address}


async def test_a_training_that_asks_for_no_bond_gets_the_cheapest(stake_market):
    """The attack the minimum stops: by score alone the unbonded offer wins."""
    c = stake_market.coordinator
    record = await c.initialize(TrainingSpec(model_type="mlp", target_workers=1, min_stake_wei=0))
    found = await c.discover(min_stake_wei=record.spec.min_stake_wei)
    assert c.stake_skipped == {} and c.select(found, 1)[0].worker_id == stake_market.cheap.address
    (contract,) = await hire(c, c.logs.of(record.training_id), record.training_id, c.select(found, 1))
    assert contract.worker_id == stake_market.cheap.address


# -- the embedded network ---------------------------------------------------------------------------

async def test_the_embedded_network_hires_a_provider_with_no_bond(tmp_path):
    async with Agent(AgentConfig(home=tmp_path / "home", providers=0)) as agent:
        stack = agent.stack
        own = Account.create()  # one of this machine's own processes, never bonded
        provider = ProviderAgent(own, stack.bus, stack.store,
                                 ProviderConfig(price_wei=CHEAP, work_dir=tmp_path / "providers" / own.address),
                                 hardware=HARDWARE,
                                 chain=await ProviderChain.connect(stack.sender.w3, stack.escrow.address))
        async with provider:
            assert agent.coordinator.min_stake() == 0
            assert not (await stack.registry.provider(own.address)).registered
            record = await flow.create_training(agent, TrainingSpec(model_type="mlp", target_workers=1), "default")
            (hired,) = await flow.hire_workers(agent, record.training_id)
    assert hired.worker_id == own.address


def test_a_run_whose_minimum_no_provider_meets_says_so_and_names_the_flag(aitbc_cmd, cli_env, aitbc_home):
    """The embedded providers are bonded with 0.01 ETH: a run that asks for 0.05 ETH (in gwei) hires none."""
    done = subprocess.run([*aitbc_cmd, "distributed-training", "run", "--workers", "1", "--providers", "2",
                           "--rounds", "1", "--dry-run", "--min-stake", "50000000gwei"], env=cli_env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == int(ExitCode.NOT_ENOUGH_PROVIDERS), done.stdout + done.stderr
    assert "2 offers skipped: stake below 0.05 ETH (--min-stake)" in done.stderr and "Traceback" not in done.stderr
