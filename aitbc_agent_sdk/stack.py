"""Building the ports an Agent runs on. Backends are picked from config through one table."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from .chain import EscrowClient, TransactionSender, deploy, load_artifact, start_embedded_chain
from .messaging import Bus, InMemoryBus
from .provider.agent import ProviderAgent, ProviderConfig
from .provider.hardware import detect_hardware
from .storage import ContentStore, LocalContentStore

ETH = 10**18


@dataclass
class Stack:
    """The running parts behind one Agent."""

    bus: Bus
    store: ContentStore
    account: LocalAccount  # the coordinator's key; signs envelopes and (through sender) transactions
    sender: TransactionSender
    escrow: EscrowClient
    providers: list[ProviderAgent] = field(default_factory=list)


@dataclass(frozen=True)
class EmbeddedSettings:
    home: Path
    providers: int
    provider_prices_wei: tuple[int, ...] | None
    wallet_funding_wei: int


def default_prices(count: int, base_wei: int = ETH // 100) -> list[int]:
    """Embedded providers ask slightly different prices (0.010, 0.011, ... ETH per round)."""
    return [base_wei + i * (base_wei // 10) for i in range(count)]


async def build_embedded(config: EmbeddedSettings, exits: AsyncExitStack) -> Stack:
    """In-process bus, a local content store under $AITBC_HOME, py-evm, local provider agents."""
    bus = InMemoryBus()
    exits.push_async_callback(bus.close)
    store = LocalContentStore(config.home / "store")
    chain = await start_embedded_chain()
    # The contract is deployed by a separate dev key, as on a shared devnet, so the
    # coordinator's wallet holds exactly what the user funded it with.
    deployer: LocalAccount = Account.create()
    await chain.fund(deployer.address, ETH)
    escrow_address = await deploy(TransactionSender(chain.w3, deployer), load_artifact("TrainingEscrow"))
    coordinator: LocalAccount = Account.create()
    if config.wallet_funding_wei:
        await chain.fund(coordinator.address, config.wallet_funding_wei)
    sender = TransactionSender(chain.w3, coordinator)
    escrow = EscrowClient(chain.w3, escrow_address)
    stack = Stack(bus=bus, store=store, account=coordinator, sender=sender, escrow=escrow)
    hardware = await asyncio.to_thread(detect_hardware)
    prices = list(config.provider_prices_wei or default_prices(config.providers))
    for i in range(config.providers):
        account: LocalAccount = Account.create()
        await chain.fund(account.address, ETH // 10, source=1 + i % 9)  # gas money to withdraw with
        provider = ProviderAgent(account, bus, store, ProviderConfig(
            price_wei=prices[i % len(prices)], work_dir=config.home / "providers" / account.address),
            hardware=hardware)
        stack.providers.append(await exits.enter_async_context(provider))
    return stack


StackBuilder = Callable[[EmbeddedSettings, AsyncExitStack], Awaitable[Stack]]
STACK_BUILDERS: dict[str, StackBuilder] = {"embedded": build_embedded}
