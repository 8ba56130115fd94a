"""``aitbc devnet up|down|status``: every server on 127.0.0.1, contracts deployed, wallets funded.

``up`` starts a broker (mosquitto when installed, amqtt otherwise), anvil with the
contracts, optionally a js-ipfs daemon, and N provider daemons, then writes the
profile that later commands read. A failed ``up`` stops whatever it had started.

The broker admits only the devnet's accounts (one per wallet, plus ``observer``), each
publishing only where the ACL lets it (devnet/_broker_auth.py); beyond loopback it speaks
only TLS, with a CA made for this devnet whose certificate the profile carries.
"""

from __future__ import annotations

import asyncio
import ipaddress
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..chain import TransactionSender, WalletStore, connect_rpc
from ..chain._deployment import Deployment, deploy_contracts, fund_accounts
from ..errors import AitbcError, ConfigError
from ..profile import (
    BusSettings, ChainSettings, Profile, StoreSettings, devnet_password, load_profile, profile_path,
    remove_profile, save_profile,
)
from ._broker_auth import BrokerAccounts, reload_broker
from ._service import LOCALHOST, ServiceError, ServiceProcess, check_bind_host, free_port, spawn, stop

ETH = 10**18
COORDINATOR_WALLET = "dev"


class DevnetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    providers: int = Field(default=3, ge=0, le=64)
    wallets: tuple[str, ...] = Field(default=(), max_length=64, description="coordinator wallets to create (if "
                                    "missing), fund and admit to the broker besides 'dev' (init names its own)")
    ipfs: Literal["local", "daemon"] = "local"
    ipfs_api: str | None = Field(default=None, description="use this running Kubo/js-ipfs API instead")
    provider_price_wei: int = Field(default=ETH // 100, ge=0)
    coordinator_funding_wei: int = Field(default=1000 * ETH, ge=0)
    provider_funding_wei: int = Field(default=ETH, ge=0)
    # Ten times the coordinators' default minimum (market.discovery.DEFAULT_MIN_STAKE_WEI): a slash burns half.
    provider_stake_wei: int = Field(default=ETH // 10, ge=0, description="bond each provider posts in the registry")
    host: str = Field(default=LOCALHOST, description="the one local IPv4 address every server binds to (never 0.0.0.0)")
    tls: bool | None = Field(default=None, description="broker TLS with a generated CA; None: on unless host is loopback")
    max_message_bytes: int = Field(default=1 << 20, ge=1024, le=256 << 20, description="broker and client payload limit")

    @property
    def broker_tls(self) -> bool:
        return self.tls if self.tls is not None else not ipaddress.IPv4Address(self.host).is_loopback

    @field_validator("host")
    @classmethod
    def _one_local_address(cls, value: str) -> str:
        try:
            return check_bind_host(value)
        except ServiceError as exc:
            raise ValueError(str(exc)) from None


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


# The devnet's providers share this machine's cores, one thread and one slot each; they run any
# task (sandboxed), so a user can try their own task on the devnet first. They share its disk too:
# each keeps 4 GiB of delivered results, not a provider's 32 (a GPT-2-small job keeps about 3 GB).
DEVNET_PROVIDER_ARGS = ("--threads", "1", "--slots", "1", "--tasks", "any", "--kept-size", "4GiB")


def spawn_provider(home: Path, wallet: str, password: str, price_wei: int, stake_wei: int) -> ServiceProcess:
    return spawn(f"provider:{wallet}", [sys.executable, "-m", "aitbc_agent_sdk.flow._provider_daemon", "--home", str(home),
                                        "--wallet", wallet, "--price-wei", str(price_wei),
                                        "--stake-wei", str(stake_wei), *DEVNET_PROVIDER_ARGS],
                 port=0, log=home / "devnet" / "logs" / f"{wallet}.log", stdin_data=(password + "\n").encode())


async def devnet_up(home: Path, options: DevnetOptions) -> Profile:
    """Start the broker, the chain (contracts deployed, wallets funded), the store and the provider daemons."""
    _clear_stopped_devnet(home)
    from ._anvil import start_chain_node
    from ._mosquitto import BrokerSecurity, start_best_broker

    data = home / "devnet"
    started: list[ServiceProcess] = []
    try:
        # The wallets first: each gets a broker account named by its address.
        password = devnet_password(home, create=True)
        assert password is not None
        wallets = wallet_store(home)
        coordinators = [await _ensure_wallet(wallets, name, password)
                         for name in dict.fromkeys((COORDINATOR_WALLET, *options.wallets))]
        names = [provider_wallet(i) for i in range(options.providers)]
        addresses = [await _ensure_wallet(wallets, n, password) for n in names]
        accounts = BrokerAccounts(broker_auth_dir(home))
        accounts.ensure([*coordinators, *addresses])
        tls = None
        if options.broker_tls:
            from ._tls import make_broker_tls

            tls = make_broker_tls(broker_auth_dir(home) / "tls", options.host)
        broker = await start_best_broker(data / "broker", host=options.host, security=BrokerSecurity(
            password_file=accounts.password_file, acl_file=accounts.acl_file,
            max_message_bytes=options.max_message_bytes, tls=tls))
        started.append(broker)
        node = await start_chain_node(data / "anvil", host=options.host)
        started.append(node)
        store = await _start_store(home, options, started)
        rpc_url = f"http://{node.host}:{node.port}"
        deployment = await _deploy_and_fund(rpc_url, coordinators, addresses, options)
        profile = Profile(
            bus=BusSettings(host=broker.host, port=broker.port, tls=tls is not None,
                            ca_pem=tls.ca_pem() if tls else None, accounts_dir=accounts.accounts_dir,
                            max_message_bytes=options.max_message_bytes), store=store,
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


def _clear_stopped_devnet(home: Path) -> None:
    """Remove the profile of a devnet whose services are all gone; ConfigError while one still runs."""
    if not profile_path(home).exists():
        return
    running = [s.name for s in load_profile(home).services if s.alive()]
    if running:
        raise ConfigError(f"a devnet is already running in {home} ({', '.join(running)}); run 'aitbc devnet down'")
    remove_profile(home)


async def _start_store(home: Path, options: DevnetOptions, started: list[ServiceProcess]) -> StoreSettings:
    """The content store: an existing Kubo API, a js-ipfs daemon of its own (added to ``started``) or local."""
    if options.ipfs_api:
        return StoreSettings(kind="kubo", api=options.ipfs_api)
    if options.ipfs == "daemon":
        from ._ipfs import start_ipfs_daemon

        ipfs, api = await start_ipfs_daemon(home / "devnet" / "ipfs", api_port=free_port(options.host),
                                            swarm_port=free_port(options.host), host=options.host)
        started.append(ipfs)
        return StoreSettings(kind="kubo", api=api)
    return StoreSettings(kind="local", root=home / "store")


async def _deploy_and_fund(rpc_url: str, coordinators: list[str], providers: list[str],
                           options: DevnetOptions) -> Deployment:
    """Deploy the contracts from anvil's first dev account and fund the coordinators' and providers' wallets."""
    from ._anvil import dev_accounts

    w3 = await connect_rpc(rpc_url)
    funder = TransactionSender(w3, dev_accounts(1)[0])
    deployment = await deploy_contracts(funder)
    await fund_accounts(funder, coordinators, options.coordinator_funding_wei)
    if providers:
        await fund_accounts(funder, providers, options.provider_funding_wei)
    return deployment


async def wait_for_offers(profile: Profile, count: int, timeout: float = 60.0) -> None:
    """Up is done when every provider daemon has advertised its offer."""
    if count == 0:
        return
    from eth_account import Account

    from ..market import collect_offers
    from ..messaging import SignedChannel
    from ..messaging._settings import connect_bus

    deadline = time.monotonic() + timeout
    async with connect_bus(profile.bus, f"devnet-up-{time.time_ns()}", persistent=False) as bus:
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
    """Connect to the broker and read every provider's offer: its presence (heartbeats come only from
    providers at work; a provider that dies has its offer cleared by its last will)."""
    from eth_account import Account

    from ..market import collect_offers
    from ..messaging import SignedChannel
    from ..messaging._settings import connect_bus

    try:
        async with connect_bus(profile.bus, f"devnet-status-{time.time_ns()}", persistent=False,
                               reconnect=False) as bus:
            offers = await collect_offers(SignedChannel(bus, Account.create()), timeout=1.5)
    except AitbcError as exc:
        return [Health(part="broker", ok=False, detail=str(exc))]
    result = [Health(part="broker", ok=True, detail=f"{profile.bus.host}:{profile.bus.port}, {len(offers)} offers")]
    for offer in offers:
        result.append(Health(part=f"offer {offer.provider[:10]}", ok=True,
                             detail=f"issued {max(time.time() - offer.issued_at, 0.0):.1f}s ago, "
                                    f"{offer.free_slots}/{offer.slots} slots free"))
    return result


async def devnet_join(home: Path, source: Path, wallets: Sequence[str] = ()) -> tuple[Profile, dict[str, str]]:
    """Use another host's devnet from ``home``: its profile's addresses, none of its processes.

    The profile at ``source`` (written by ``devnet up`` on the devnet's host) is checked against
    the servers it names (the chain answers with its chain id and the escrow is deployed; the
    broker and the IPFS API accept connections), then saved in ``home`` with no services, so
    ``devnet down`` here stops nothing there. ``wallets`` are created here (if missing) with
    this home's own devnet password; returns the saved profile and each wallet's address.
    """
    try:
        theirs = Profile.model_validate_json(Path(source).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read profile {source}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ConfigError(f"unreadable profile {source}: {exc}") from exc
    if theirs.store.kind != "kubo":
        raise ConfigError(f"the profile {source} uses a content store local to its host;"
                          " start that devnet with '--ipfs daemon' so other hosts can reach it")
    if profile_path(home).exists():
        running = [s.name for s in load_profile(home).services if s.alive()]
        if running:
            raise ConfigError(f"{home} runs a devnet of its own ({', '.join(running)}); run 'aitbc devnet down' first")
    await _check_reachable(theirs)
    # Broker accounts are issued by the devnet's host ('aitbc devnet accounts'); they live here.
    bus = theirs.bus.model_copy(update={"accounts_dir": joined_accounts_dir(home)})
    profile = theirs.model_copy(update={"services": (), "providers": tuple(wallets), "bus": bus})
    password = devnet_password(home, create=True)
    assert password is not None
    store = wallet_store(home)
    addresses = {name: await _ensure_wallet(store, name, password) for name in wallets}
    save_profile(home, profile)
    return profile, addresses


def broker_auth_dir(home: Path) -> Path:
    """The devnet host's broker accounts, password file, ACL and TLS files (all 0600 but the certificates)."""
    return home / "devnet" / "broker-auth"


def joined_accounts_dir(home: Path) -> Path:
    """On a host that joined another's devnet: the account files its operator handed over."""
    return home / "devnet" / "bus-accounts"


def add_broker_accounts(home: Path, usernames: Sequence[str], export: Path | None = None) -> list[Path]:
    """On the devnet's host: create accounts for ``usernames`` (wallet addresses), reload the broker,
    and copy each account's file (0600) into ``export`` for the host that will use it."""
    profile = load_profile(home)
    broker = next((s for s in profile.services if s.name == "mosquitto"), None)
    if broker is None or not broker.alive():
        raise ConfigError(f"no devnet broker runs from {home}: broker accounts are made on the devnet's host")
    accounts = BrokerAccounts(broker_auth_dir(home))
    accounts.ensure(usernames)
    reload_broker(broker.pid)
    written = []
    if export is not None:
        export.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in usernames:
            target = export / name
            target.touch(mode=0o600)
            target.chmod(0o600)
            target.write_text(accounts.password(name) + "\n")
            written.append(target)
    return written


async def _check_reachable(profile: Profile, timeout: float = 5.0) -> None:
    import httpx

    try:
        w3 = await connect_rpc(profile.chain.rpc_url, timeout=timeout)
        try:
            chain_id = int(await w3.eth.chain_id)
            code = await w3.eth.get_code(profile.chain.escrow)
        finally:
            await w3.provider.disconnect()
    except AitbcError as exc:
        raise ConfigError(f"the profile's chain {profile.chain.rpc_url} is not reachable: {exc}") from exc
    if chain_id != profile.chain.chain_id:
        raise ConfigError(f"{profile.chain.rpc_url} reports chain id {chain_id}, the profile says {profile.chain.chain_id}")
    if not code:
        raise ConfigError(f"no escrow contract at {profile.chain.escrow} on {profile.chain.rpc_url}")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(profile.bus.host, profile.bus.port), timeout)
        writer.close()
        await writer.wait_closed()
    except (OSError, TimeoutError) as exc:
        raise ConfigError(f"the profile's broker {profile.bus.host}:{profile.bus.port} is not reachable: {exc}") from exc
    assert profile.store.api is not None
    try:
        async with httpx.AsyncClient(base_url=profile.store.api, timeout=timeout) as http:
            reply = await http.post("/api/v0/id")
        reply.raise_for_status()
    except httpx.HTTPError as exc:
        raise ConfigError(f"the profile's IPFS API {profile.store.api} is not reachable: {exc}") from exc
