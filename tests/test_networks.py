"""A network by name: a config file naming a real anvil, mosquitto and js-ipfs builds a working Agent stack."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from aitbc_agent_sdk import Agent, AgentConfig
from aitbc_agent_sdk.chain import TransactionSender, connect_rpc
from aitbc_agent_sdk.chain._deployment import Deployment, deploy_contracts, fund_accounts
from aitbc_agent_sdk.coordinator import CoordinatorSettings
from aitbc_agent_sdk.devnet._service import ServiceProcess
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.storage._kubo import KuboClient

ETH = 10**18


@pytest.fixture
async def deployment(anvil, anvil_dev_accounts: list[LocalAccount]) -> Deployment:
    w3 = await connect_rpc(anvil.url)
    try:
        return await deploy_contracts(TransactionSender(w3, anvil_dev_accounts[8]))  # no other module uses 8
    finally:
        await w3.provider.disconnect()


@pytest.fixture
async def wallet(anvil, anvil_dev_accounts: list[LocalAccount]) -> LocalAccount:
    account: LocalAccount = Account.create()
    w3 = await connect_rpc(anvil.url)
    try:
        await fund_accounts(TransactionSender(w3, anvil_dev_accounts[8]), [account.address], ETH)
    finally:
        await w3.provider.disconnect()
    return account


def write_network(path: Path, name: str, *, chain_id: int, rpc_url: str, deployment: Deployment,
                  broker: ServiceProcess, ipfs_api: str) -> None:
    api = urlsplit(ipfs_api)
    path.write_text(f"""
[networks.{name}]
chain_id = {chain_id}
rpc_url = "{rpc_url}"
escrow = "{deployment.escrow}"
registry = "{deployment.registry}"
deployed_block = {deployment.block}
broker = "mqtt://{broker.host}:{broker.port}"
ipfs_api = "/ip4/{api.hostname}/tcp/{api.port}"   # kubo's multiaddr form
""")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("AITBC_") or name == "ETH_RPC_URL":
            monkeypatch.delenv(name)
    config = tmp_path / "config.toml"
    monkeypatch.setenv("AITBC_CONFIG", str(config))
    return config


async def test_a_configured_network_builds_a_working_stack(
        isolated: Path, tmp_path: Path, anvil, mosquitto: ServiceProcess, ipfs_daemon: str,
        deployment: Deployment, wallet: LocalAccount) -> None:
    write_network(isolated, "lab", chain_id=anvil.chain_id, rpc_url=anvil.url, deployment=deployment,
                  broker=mosquitto, ipfs_api=ipfs_daemon)
    config = AgentConfig(name="net-test", blockchain_network="lab", home=tmp_path / "home",
                         coordinator=CoordinatorSettings(discovery_timeout_s=0.3))
    async with Agent(config, account=wallet) as agent:
        stack = agent.stack
        assert stack.escrow.address == deployment.escrow and stack.registry.address == deployment.registry
        assert await stack.sender.w3.eth.get_balance(agent.address) == ETH  # the chain: a balance
        cid = await agent.upload_to_ipfs(data=b"named networks")  # the store: into the real daemon
        assert await agent.discover_gpu_workers() == []  # the bus: an empty market, asked over mosquitto
    async with KuboClient(ipfs_daemon) as client:
        assert cid in await client.pin_ls()


async def test_a_network_on_the_wrong_chain_is_refused(
        isolated: Path, tmp_path: Path, anvil, mosquitto: ServiceProcess, ipfs_daemon: str,
        deployment: Deployment, wallet: LocalAccount) -> None:
    write_network(isolated, "lab", chain_id=1, rpc_url=anvil.url, deployment=deployment,
                  broker=mosquitto, ipfs_api=ipfs_daemon)
    with pytest.raises(ConfigError, match="serves chain 31337.*chain_id = 1"):
        async with Agent(AgentConfig(network="lab", home=tmp_path / "home"), account=wallet):
            pass


async def test_a_network_needs_a_wallet(isolated: Path, tmp_path: Path, anvil, mosquitto: ServiceProcess,
                                        ipfs_daemon: str, deployment: Deployment) -> None:
    write_network(isolated, "lab", chain_id=anvil.chain_id, rpc_url=anvil.url, deployment=deployment,
                  broker=mosquitto, ipfs_api=ipfs_daemon)
    with pytest.raises(ConfigError, match="needs a wallet"):
        await Agent(AgentConfig(network="lab", home=tmp_path / "home")).start()
