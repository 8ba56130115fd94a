"""pytest fixtures for a real chain node: one anvil per test session on a free 127.0.0.1 port.

Tests share the node, so each one deploys its own contracts and uses fresh accounts
(funded from the dev accounts) rather than relying on a clean chain.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from eth_account.signers.local import LocalAccount
from web3 import AsyncWeb3

from aitbc_agent_sdk.chain import connect_rpc
from aitbc_agent_sdk.devnet._anvil import anvil_path, dev_accounts, rpc_url, start_chain_node
from aitbc_agent_sdk.devnet._service import ServiceError, ServiceProcess, stop, tail


class AnvilNode:
    """The running test node: its process record and JSON-RPC URL."""

    def __init__(self, service: ServiceProcess, chain_id: int) -> None:
        self.service = service
        self.url = rpc_url(service)
        self.chain_id = chain_id


@pytest.fixture(scope="session")
def anvil_binary() -> Path:
    # CI installs anvil (make setup); a missing binary is a broken environment, not a skip.
    try:
        return anvil_path()
    except ServiceError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def anvil(anvil_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AnvilNode]:
    data_dir = tmp_path_factory.mktemp("anvil")
    try:
        service = await start_chain_node(data_dir)
    except ServiceError as exc:
        pytest.fail(f"anvil ({anvil_binary}) failed to start: {exc}", pytrace=False)
    try:
        yield AnvilNode(service, chain_id=31337)
    finally:
        stop(service)
        if service.alive():  # pragma: no cover - stop() SIGKILLs; this only reports
            print(f"anvil pid {service.pid} survived stop; log:\n{tail(service.log)}")


@pytest.fixture
async def anvil_w3(anvil: AnvilNode) -> AsyncIterator[AsyncWeb3]:
    # Function-scoped: the aiohttp session belongs to the test's own event loop.
    w3 = await connect_rpc(anvil.url)
    try:
        yield w3
    finally:
        await w3.provider.disconnect()


@pytest.fixture(scope="session")
def anvil_dev_accounts() -> list[LocalAccount]:
    """anvil's ten funded dev accounts (10,000 ETH each at start), with their keys."""
    return dev_accounts(10)

