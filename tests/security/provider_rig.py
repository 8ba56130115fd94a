"""A real provider daemon on mosquitto and js-ipfs, and an attacker who signs with a key of its own.

The provider is the daemon's ProviderAgent with its keystore at ``$AITBC_HOME/wallets`` and
its work directory where ``aitbc provider start`` puts it (``$AITBC_HOME/providers/<address>``).
The attacker needs nothing but broker access: it signs with a fresh key and builds its
records with ``model_construct``, so our own validation never stops it from sending them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from pydantic import BaseModel

from aitbc_agent_sdk.chain import TransactionSender, WalletStore
from aitbc_agent_sdk.chain._deployment import deploy_contracts, fund_accounts
from aitbc_agent_sdk.chain._escrow import EscrowClient, training_salt
from aitbc_agent_sdk.messaging import SignedChannel, topics
from aitbc_agent_sdk.messaging._mqtt import MqttBus
from aitbc_agent_sdk.records import (
    ContractProposal, ContractReply, Hardware, JobAssignment, JobConfig, JobResult, ModelSpec, Progress, new_id,
)
from aitbc_agent_sdk.provider._node import ProviderAgent, ProviderConfig
from aitbc_agent_sdk.flow._provider_daemon import provider_dir
from aitbc_agent_sdk.provider._onchain import ProviderChain
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore
from aitbc_agent_sdk.tasks._networks import build_model, model_spec_for
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.coordinator.data._datasets import store_shard

PRICE = 10**15
HARDWARE = Hardware(cpu_model="test cpu", cpu_cores=1, ram_bytes=1 << 30)
WAIT_S = 90.0  # upper bound on a loaded 2-core machine; the tests wait for events and finish far sooner
PASSWORD = "provider-password"
TRAINING = "training_0123456789abcdef"


class Feed:
    """Every verified message seen on one filter (topic included), with a wait for a match."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = asyncio.Condition()

    async def collect(self, messages: AsyncIterator[Any]) -> None:
        async for verified in messages:
            async with self._changed:
                self.items.append(verified)
                self._changed.notify_all()

    async def first(self, matches: Callable[[Any], bool], timeout: float = WAIT_S) -> Any:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: any(matches(item) for item in self.items))
        return next(item for item in self.items if matches(item))


@dataclass
class Rig:
    home: Path
    provider: ProviderAgent
    attacker: SignedChannel
    store: KuboContentStore
    bus: MqttBus
    escrow: EscrowClient
    sender: TransactionSender  # the attacker's own funded account on chain
    feeds: dict[str, Feed] = field(default_factory=dict)
    opened: set[str] = field(default_factory=set)

    @property
    def keystore(self) -> Path:
        return self.home / "wallets"

    async def send(self, topic: str, message: BaseModel) -> None:
        await self.attacker.publish(topic, message)

    def proposal(self, contract_id: str, training_id: str = TRAINING) -> ContractProposal:
        return ContractProposal.model_construct(contract_id=contract_id, training_id=training_id,
                                                coordinator=self.attacker.address, price_wei=PRICE, rounds=5)

    async def hire(self, contract_id: str | None = None, training_id: str = TRAINING) -> str:
        """A contract the provider accepts, and the training the attacker opens and funds on chain
        with the provider's consent, as anyone with a funded account can; returns its id."""
        contract_id = contract_id or new_id("contract")
        reply = await self.attacker.request(
            topics.negotiate(self.provider.address), self.proposal(contract_id, training_id),
            topics.negotiate_reply(self.attacker.address, contract_id), ContractReply,
            timeout=WAIT_S, expected_sender=self.provider.address)
        assert reply.accepted, reply
        if training_id not in self.opened and getattr(reply, "consent", None):
            await self.escrow.open(self.sender, training_salt(training_id), [self.provider.address], [PRICE * 5],
                                   [bytes.fromhex(reply.consent[2:])])
            self.opened.add(training_id)
        return contract_id

    async def job(self, contract_id: str, *, job_id: str | None = None, training_id: str = TRAINING,
                  model: ModelSpec | None = None, epochs: int = 1) -> JobAssignment:
        """A job built without validation, as an attacker would send it."""
        data = load_dataset("digits").subset(list(range(64)))
        spec = model or model_spec_for("mlp", data, hidden=16)
        weights = build_model(spec, seed=0).state_dict() if model is None else {}
        (shard_cid, shard_bytes), blob = await store_shard(self.store, data), encode_state(weights) if weights else b"not used"
        return JobAssignment.model_construct(
            job_id=job_id or new_id("job"), training_id=training_id, round=1, worker_id=self.provider.address,
            contract_id=contract_id, shard_cid=shard_cid, weights_cid=await self.store.add(blob),
            shard_bytes=shard_bytes, weights_bytes=len(blob),  # the sizes the provider fetches up to
            model=spec, config=JobConfig(epochs=epochs, batch_size=16), seed=1)

    async def watch(self, name: str, topic_filter: str, model: type[BaseModel], exits: AsyncExitStack) -> Feed:
        feed = Feed()
        # A channel of its own: a verifier that saw a message on one subscription calls it a replay on the next.
        watcher = SignedChannel(self.bus, Account.create())
        messages = await exits.enter_async_context(watcher.subscribe(topic_filter, model))
        task = asyncio.create_task(feed.collect(messages))
        exits.callback(task.cancel)
        self.feeds[name] = feed
        return feed


@asynccontextmanager
async def provider_rig(servers: Servers, agent_class: type[ProviderAgent] = ProviderAgent,
                       **config: Any) -> AsyncIterator[Rig]:
    """The provider serving and the attacker connected; the attacker watches results and progress.

    ``funder`` is a funded dev account: it deploys a fresh escrow and pays the attacker's gas.
    """
    home, w3, funder = servers.home, servers.w3, servers.funder
    deployment = await deploy_contracts(TransactionSender(w3, funder))
    attacker = Account.create()
    await fund_accounts(TransactionSender(w3, funder), [attacker.address], 10**18)
    wallets = WalletStore(home / "wallets", kdf="pbkdf2", iterations=2)
    await wallets.create("provider", PASSWORD)
    account = await wallets.unlock("provider", PASSWORD)
    async with AsyncExitStack() as exits:
        store = KuboContentStore(await exits.enter_async_context(KuboClient(servers.ipfs_api)))
        bus = await exits.enter_async_context(MqttBus("127.0.0.1", servers.broker_port, client_id=f"provider-{new_id('t')}"))
        attacker_bus = await exits.enter_async_context(
            MqttBus("127.0.0.1", servers.broker_port, client_id=f"attacker-{new_id('t')}", persistent=False))
        provider = agent_class(account, bus, store, ProviderConfig(
            price_wei=PRICE, work_dir=provider_dir(home, account.address), **config), hardware=HARDWARE,
            chain=await ProviderChain.connect(w3, deployment.escrow))
        rig = Rig(home=home, provider=provider, attacker=SignedChannel(attacker_bus, attacker), store=store,
                  bus=attacker_bus, escrow=EscrowClient(w3, deployment.escrow), sender=TransactionSender(w3, attacker))
        await exits.enter_async_context(provider)
        # Everything the provider publishes lands under these: one filter per kind, every depth.
        await rig.watch("results", f"{topics.PREFIX}/results/#", JobResult, exits)
        await rig.watch("progress", f"{topics.PREFIX}/progress/#", Progress, exits)
        await rig.watch("replies", f"{topics.PREFIX}/negotiate-reply/#", ContractReply, exits)
        yield rig


@dataclass(frozen=True)
class Servers:
    home: Path
    broker_port: int
    ipfs_api: str
    w3: Any
    funder: Any


@pytest.fixture
def servers(aitbc_home, mosquitto, ipfs_daemon, anvil_w3, anvil_dev_accounts) -> Servers:
    """The real parts a rig runs on; dev account 5 deploys and funds (no other test here uses it)."""
    return Servers(aitbc_home, mosquitto.port, ipfs_daemon, anvil_w3, anvil_dev_accounts[5])
