"""The `node` fixture: a real anvil of the test's own (import it into a test module)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from web3 import AsyncWeb3

from aitbc_agent_sdk.chain import connect_rpc
from aitbc_agent_sdk.devnet._anvil import rpc_url, start_chain_node
from aitbc_agent_sdk.devnet._service import stop


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[AsyncWeb3]:
    """A real anvil of the test's own, stopped afterwards."""
    service = await start_chain_node(tmp_path / "anvil")
    w3 = await connect_rpc(rpc_url(service))
    try:
        yield w3
    finally:
        await w3.provider.disconnect()
        stop(service)
