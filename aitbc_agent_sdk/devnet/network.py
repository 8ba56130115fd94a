"""``aitbc devnet up|down|status``: every server on 127.0.0.1, contracts deployed, wallets funded.

``up`` starts a broker (mosquitto when installed, amqtt otherwise), anvil with the
contracts, optionally a js-ipfs daemon, and N provider daemons, then writes the
profile that later commands read. A failed ``up`` stops whatever it had started.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..chain import TransactionSender, WalletStore, connect_rpc
from ..chain.deployment import deploy_contracts, fund_accounts
from ..errors import AitbcError, ConfigError
from ..profile import (
    BusSettings, ChainSettings, Profile, StoreSettings, devnet_password, load_profile, profile_path,
    remove_profile, save_profile,
)
from .service import ServiceProcess, free_port, spawn, stop

ETH = 10**18
COORDINATOR_WALLET = "dev"


class DevnetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    providers: int = Field(default=3, ge=0, le=64)
    ipfs: Literal["local", "daemon"] = "local"
    ipfs_api: str | None = Field(default=None, description="use this running Kubo/js-ipfs API instead")
    provider_price_wei: int = Field(default=ETH // 100, ge=0)
    coordinator_funding_wei: int = Field(default=1000 * ETH, ge=0)
    provider_funding_wei: int = Field(default=ETH, ge=0)
    provider_stake_wei: int = Field(default=ETH // 10, ge=0, description="bond each provider posts in the registry")


def wallet_store(home: Path) -> WalletStore:
    # Devnet wallets hold devnet ETH only; a light KDF keeps every daemon's start fast.
    return WalletStore(home / "wallets", kdf="pbkdf2", iterations=4096)


def provider_wallet(i: int) -> str:
    return f"provider-{i}"


async def _ensure_wallet(store: WalletStore, name: str, password: str) -> str:
    try:
        return (await store.get(name)).address
    except ConfigError:
        return (await store.create(name, password)).address


def spawn_provider(home: Path, wallet: str, password: str, price_wei: int, stake_wei: int) -> ServiceProcess:
    return spawn(f"provider:{wallet}", [sys.executable, "-m", "aitbc_agent_sdk.provider.daemon", "--home", str(home),
                                        "--wallet", wallet, "--price-wei", str(price_wei),
                                        "--stake-wei", str(stake_wei)],
                 port=0, log=home / "devnet" / "logs" / f"{wallet}.log", stdin_data=(password + "\n").encode())


async def devnet_up(home: Path, options: DevnetOptions) -> Profile:
    if profile_path(home).exists():
        running = [s.name for s in load_profile(home).services if s.alive()]
        if running:
            raise ConfigError(f"a devnet is already running in {home} ({', '.join(running)}); run 'aitbc devnet down'")
        remove_profile(home)
    from .anvil import dev_accounts, start_chain_node
    from .mosquitto import start_best_broker

    data = home / "devnet"
    started: list[ServiceProcess] = []
    try:
        broker = await start_best_broker(data / "broker")
        started.append(broker)
        node = await start_chain_node(data / "anvil")
        started.append(node)
        store = StoreSettings(kind="local", root=home / "store")
        if options.ipfs_api:
            store = StoreSettings(kind="kubo", api=options.ipfs_api)
        elif options.ipfs == "daemon":
            from .ipfs import start_ipfs_daemon

            ipfs, api = await start_ipfs_daemon(data / "ipfs", api_port=free_port(), swarm_port=free_port())
            started.append(ipfs)
            store = StoreSettings(kind="kubo", api=api)

        rpc_url = f"http://{node.host}:{node.port}"
        w3 = await connect_rpc(rpc_url)
        funder = TransactionSender(w3, dev_accounts(1)[0])
        deployment = await deploy_contracts(funder)

        password = devnet_password(home, create=True)
        assert password is not None
        wallets = wallet_store(home)
        coordinator = await _ensure_wallet(wallets, COORDINATOR_WALLET, password)
        names = [provider_wallet(i) for i in range(options.providers)]
        addresses = [await _ensure_wallet(wallets, n, password) for n in names]
        await fund_accounts(funder, [coordinator], options.coordinator_funding_wei)
        if addresses:
            await fund_accounts(funder, addresses, options.provider_funding_wei)

        profile = Profile(
            bus=BusSettings(host=broker.host, port=broker.port), store=store,
            chain=ChainSettings(rpc_url=rpc_url, chain_id=deployment.chain_id, escrow=deployment.escrow,
                                deployed_block=deployment.block),
            services=tuple(started), providers=tuple(names))
        save_profile(home, profile)  # the provider daemons read it
        for i, name in enumerate(names):
            price = options.provider_price_wei + i * (options.provider_price_wei // 10)
            started.append(spawn_provider(home, name, password, price, options.provider_stake_wei))
        profile = profile.model_copy(update={"services": tuple(started)})
        save_profile(home, profile)
        await wait_for_offers(profile, len(names))
        return profile
    except BaseException:
        for service in reversed(started):
            stop(service)
        remove_profile(home)
        raise


async def wait_for_offers(profile: Profile, count: int, timeout: float = 60.0) -> None:
    """Up is done when every provider daemon has advertised its offer."""
    if count == 0:
        return
    from eth_account import Account

    from ..market import collect_offers
    from ..messaging import SignedChannel
    from ..messaging.mqtt import MqttBus

    deadline = time.monotonic() + timeout
    async with MqttBus(profile.bus.host, profile.bus.port, client_id=f"devnet-up-{time.time_ns()}",
                       persistent=False) as bus:
        channel = SignedChannel(bus, Account.create())
        while time.monotonic() < deadline:
            offers = await collect_offers(channel, timeout=1.0)
            if len(offers) >= count:
                return
            for service in profile.services:
                if service.name.startswith("provider:") and not service.alive():
                    raise AitbcError(f"{service.name} exited; see {service.log}")
            await asyncio.sleep(0.2)
    raise AitbcError(f"only some of the {count} providers advertised within {timeout:.0f}s")


def devnet_down(home: Path) -> list[str]:
    profile = load_profile(home)
    stopped = []
    # providers first, so they leave the broker cleanly
    for service in sorted(profile.services, key=lambda s: not s.name.startswith("provider:")):
        if service.alive():
            stop(service)
            stopped.append(service.name)
    remove_profile(home)
    return stopped


class Health(BaseModel):
    part: str
    ok: bool
    detail: str


async def devnet_status(home: Path) -> list[Health]:
    profile = load_profile(home)
    checks = [Health(part=s.name, ok=s.alive(), detail=f"pid {s.pid}" + (f", port {s.port}" if s.port else ""))
              for s in profile.services]
    checks.append(await _check_chain(profile))
    checks.extend(await _check_bus(profile))
    return checks


async def _check_chain(profile: Profile) -> Health:
    try:
        w3 = await connect_rpc(profile.chain.rpc_url, timeout=3.0)
        block = await w3.eth.block_number
        code = await w3.eth.get_code(profile.chain.escrow)
    except AitbcError as exc:
        return Health(part="chain", ok=False, detail=str(exc))
    return Health(part="chain", ok=len(code) > 0,
                  detail=f"block {block}, escrow {'deployed' if code else 'MISSING'} at {profile.chain.escrow}")


async def _check_bus(profile: Profile) -> list[Health]:
    """Connect to the broker and look for every provider's offer and a fresh heartbeat."""
    from eth_account import Account

    from ..market import collect_offers
    from ..messaging import SignedChannel, topics
    from ..messaging.mqtt import MqttBus
    from ..models import Heartbeat

    try:
        async with MqttBus(profile.bus.host, profile.bus.port, client_id=f"devnet-status-{time.time_ns()}",
                           persistent=False, reconnect=False) as bus:
            channel = SignedChannel(bus, Account.create())
            offers = await collect_offers(channel, timeout=1.5)
            beats: dict[str, float] = {}
            async with channel.subscribe(topics.HEARTBEATS, Heartbeat) as stream:
                try:
                    async with asyncio.timeout(2.5):
                        async for beat in stream:
                            beats[beat.sender] = beat.message.sent_at
                except TimeoutError:
                    pass
    except AitbcError as exc:
        return [Health(part="broker", ok=False, detail=str(exc))]
    result = [Health(part="broker", ok=True, detail=f"{profile.bus.host}:{profile.bus.port}, {len(offers)} offers")]
    for offer in offers:
        seen = beats.get(offer.provider)
        result.append(Health(part=f"heartbeat {offer.provider[:10]}", ok=seen is not None,
                             detail=f"{time.time() - seen:.1f}s ago" if seen else "no heartbeat in 2.5s"))
    return result
