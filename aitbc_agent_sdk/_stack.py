"""Building the ports an Agent runs on. Backends are picked from config through one table."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from .chain import EscrowClient, TransactionSender, connect_rpc, deploy, load_artifact, start_embedded_chain
from .chain._registry import RegistryClient
from .chain._revert import CHAIN_EXCEPTIONS, map_chain_error
from .config import AgentConfig
from .errors import ConfigError, MessagingError
from .messaging import Bus, InMemoryBus, LastWill
from .records import TaskPolicy
from .profile import Profile, load_profile, network_profile
from .provider._node import ProviderAgent, ProviderConfig
from .provider._hardware import detect_hardware
from .provider._onchain import ProviderChain
from .settings import BUILTIN_NETWORKS, NetworkSettings, load_settings
from .storage import ContentStore, LocalContentStore

ETH = 10**18
log = logging.getLogger(__name__)


@dataclass
class Stack:
    """The running parts behind one Agent."""

    bus: Bus
    store: ContentStore
    account: LocalAccount  # the agent's key; signs envelopes and (through sender) transactions
    sender: TransactionSender
    escrow: EscrowClient
    registry: RegistryClient
    providers: list[ProviderAgent] = field(default_factory=list)


def default_prices(count: int, base_wei: int = ETH // 100) -> list[int]:
    """Embedded providers ask slightly different prices (0.010, 0.011, ... ETH per round)."""
    return [base_wei + i * (base_wei // 10) for i in range(count)]


async def build_embedded(config: AgentConfig, account: LocalAccount | None, exits: AsyncExitStack) -> Stack:
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
    coordinator: LocalAccount = account or Account.create()
    if config.wallet_funding_wei:
        await chain.fund(coordinator.address, config.wallet_funding_wei)
    sender = TransactionSender(chain.w3, coordinator)
    escrow = EscrowClient(chain.w3, escrow_address)
    registry = RegistryClient(chain.w3, await escrow.registry())
    stack = Stack(bus=bus, store=store, account=coordinator, sender=sender, escrow=escrow, registry=registry)
    hardware = await asyncio.to_thread(detect_hardware)
    prices = list(config.provider_prices_wei or default_prices(config.providers))
    for i in range(config.providers):
        provider_account: LocalAccount = Account.create()
        await chain.fund(provider_account.address, ETH // 10, source=1 + i % 9)  # gas and a bond
        provider = ProviderAgent(provider_account, bus, store, ProviderConfig(
            price_wei=prices[i % len(prices)], work_dir=config.home / "providers" / provider_account.address,
            warm_start=config.warm_providers, **LOCAL_PROVIDER),
            hardware=hardware, chain=await ProviderChain.connect(chain.w3, escrow_address))
        await register_provider(registry, TransactionSender(chain.w3, provider_account), provider, EMBEDDED_STAKE)
        stack.providers.append(await exits.enter_async_context(provider))
    return stack


EMBEDDED_STAKE = ETH // 100
# The embedded market's providers are this machine, running its own user's tasks (sandboxed all
# the same); several share its cores, so each trains on one thread and one slot, and its disk, so
# each caches at most 1 GiB of fetched inputs.
LOCAL_PROVIDER: dict = {"tasks": TaskPolicy(accepts="any"), "worker_threads": 1, "slots": 1, "cache_bytes": 1 << 30}


async def join_embedded_market(stack: Stack, home: Path, price_wei: int, *,
                               factory: Callable[..., ProviderAgent] = ProviderAgent) -> ProviderAgent:
    """Fund (from the agent's wallet), bond and build one more local provider; start it with ``async with``.

    ``factory`` builds it from ProviderAgent's arguments, so a subclass can change how it works.
    """
    account: LocalAccount = Account.create()
    await stack.sender.send({"to": account.address, "value": ETH // 10})  # gas and a bond
    hardware = stack.providers[0].hardware if stack.providers else await asyncio.to_thread(detect_hardware)
    provider = factory(account, stack.bus, stack.store,
                       ProviderConfig(price_wei=price_wei, work_dir=home / "providers" / account.address,
                                      **LOCAL_PROVIDER),
                       hardware=hardware, chain=await ProviderChain.connect(stack.sender.w3, stack.escrow.address))
    await register_provider(stack.registry, TransactionSender(stack.sender.w3, account), provider, EMBEDDED_STAKE)
    return provider


async def register_provider(registry: RegistryClient, sender: TransactionSender, provider: ProviderAgent,
                            stake_wei: int) -> None:
    """Bond the provider in the registry, committing to the hash of what it offers."""
    from eth_utils import keccak

    await registry.register(sender, stake_wei, keccak(text=provider.offer_metadata()))


async def open_bus(profile: Profile, client_id: str, exits: AsyncExitStack, *, identity: str | None = None,
                   home: Path | None = None, persist_seen: bool = True, will: LastWill | None = None) -> Bus:
    """The profile's broker, logged in as ``identity``'s account; ``client_id`` names a persistent session.
    ``will``: what the broker publishes if this connection dies without saying goodbye.

    With ``home`` and ``persist_seen``, the session's accepted nonces persist there, so a restart
    still refuses replays. On the devnet's own host a wallet without a broker account gets one.
    """
    from .messaging._settings import connect_bus

    issued = home is not None and identity is not None and await asyncio.to_thread(
        _issue_local_account, profile, home, identity)
    seen_home = home if persist_seen else None
    for attempt in range(20 if issued else 1):
        try:
            return await exits.enter_async_context(connect_bus(profile.bus, client_id, identity=identity,
                                                               home=seen_home, will=will))
        except MessagingError as exc:  # the broker may not have re-read its password file yet
            if "refused" not in str(exc) or attempt == 19 or not issued:
                raise
            await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


def _issue_local_account(profile: Profile, home: Path, identity: str) -> bool:
    """Make ``identity``'s broker account if this home runs the devnet's broker and it has none."""
    from .devnet._network import add_broker_accounts, broker_auth_dir
    from .messaging._settings import account_file

    accounts = profile.bus.accounts_dir
    if accounts is None or account_file(accounts, identity).is_file():
        return False
    if accounts != broker_auth_dir(home) / "accounts":
        log.warning("no broker account for %s in %s: it may read and coordinate, not advertise;"
                    " the devnet's host gives one with 'aitbc devnet accounts %s --export DIR'",
                    identity, accounts, identity)
        return False
    try:
        add_broker_accounts(home, [identity])
    except ConfigError as exc:  # the broker is not running (yet): connecting will say so
        log.warning("%s", exc)
        return False
    return True


async def _local_store(profile: Profile, config: AgentConfig, exits: AsyncExitStack) -> ContentStore:
    return LocalContentStore(profile.store.root or config.home / "store")


async def _kubo_store(profile: Profile, config: AgentConfig, exits: AsyncExitStack) -> ContentStore:
    from .storage._kubo import KuboClient, KuboContentStore

    if not profile.store.api:
        raise ConfigError("profile store kind 'kubo' needs an api URL")
    return KuboContentStore(await exits.enter_async_context(KuboClient(profile.store.api)))


STORE_OPENERS = {"local": _local_store, "kubo": _kubo_store}


async def open_store(profile: Profile, config: AgentConfig, exits: AsyncExitStack) -> ContentStore:
    return await STORE_OPENERS[profile.store.kind](profile, config, exits)


async def build_devnet(config: AgentConfig, account: LocalAccount | None, exits: AsyncExitStack) -> Stack:
    """Connect to the servers named in $AITBC_HOME/profile.json; the signer must be passed in."""
    if account is None:
        raise ConfigError("a devnet agent needs a wallet: unlock one and pass it as Agent(config, account=...)")
    return await connect_profile(load_profile(config.home), config, account, exits)


async def build_remote(config: AgentConfig, account: LocalAccount | None, exits: AsyncExitStack) -> Stack:
    """Connect to a configured network's servers by URL: its broker, IPFS API, RPC node and contracts."""
    name, network = resolve_network(config.network)
    if account is None:
        raise ConfigError(f"network {name!r} needs a wallet: unlock one and pass it as Agent(config, account=...)")
    stack = await connect_profile(network_profile(name, network), config, account, exits)
    # The configuration could point at the wrong chain or contract: check before anything is signed.
    try:
        chain_id = int(await stack.sender.w3.eth.chain_id)
    except CHAIN_EXCEPTIONS as exc:
        raise map_chain_error(exc, action=f"read the chain id of network {name!r}") from exc
    if chain_id != network.chain_id:
        raise ConfigError(f"network {name!r}: the node at {network.rpc_url} serves chain {chain_id},"
                          f" the configuration says chain_id = {network.chain_id}")
    if network.registry is not None and network.registry != stack.registry.address:
        raise ConfigError(f"network {name!r}: the escrow {network.escrow} uses the registry"
                          f" {stack.registry.address}, the configuration says registry = {network.registry}")
    return stack


def resolve_network(network: str | NetworkSettings) -> tuple[str, NetworkSettings]:
    """A configured network's name and settings (a NetworkSettings given outright is named 'custom')."""
    settings = load_settings()
    if isinstance(network, str):
        return network, settings.network_settings(network)
    return "custom", settings.with_default_rpc("custom", network)


async def connect_profile(profile: Profile, config: AgentConfig, account: LocalAccount,
                          exits: AsyncExitStack) -> Stack:
    """The bus, store and chain a profile names, with ``account`` signing."""
    client_id = config.client_id or f"{config.name}-{account.address[2:10]}-{os.getpid()}"
    # Only a chosen client id names a session that a later process resumes: persist its nonces.
    bus = await open_bus(profile, client_id, exits, identity=account.address, home=config.home,
                         persist_seen=config.client_id is not None)
    store = await open_store(profile, config, exits)
    w3 = await connect_rpc(profile.chain.rpc_url)
    escrow = EscrowClient(w3, profile.chain.escrow)
    sender = TransactionSender(w3, account, confirmations=profile.chain.confirmations)
    return Stack(bus=bus, store=store, account=account, sender=sender, escrow=escrow,
                 registry=RegistryClient(w3, await escrow.registry()))


StackBuilder = Callable[[AgentConfig, LocalAccount | None, AsyncExitStack], Awaitable[Stack]]
# Keyed by stack_kind(): the two built-in networks, and every configured one.
STACK_BUILDERS: dict[str, StackBuilder] = {"embedded": build_embedded, "devnet": build_devnet, "remote": build_remote}


def stack_kind(network: str | NetworkSettings) -> str:
    """'embedded' or 'devnet' for the built-in networks, 'remote' for a configured one."""
    return network if isinstance(network, str) and network in BUILTIN_NETWORKS else "remote"


async def build_stack(config: AgentConfig, account: LocalAccount | None, exits: AsyncExitStack) -> Stack:
    """The stack ``config.network`` names; what it opens closes with ``exits``."""
    return await STACK_BUILDERS[stack_kind(config.network)](config, account, exits)
