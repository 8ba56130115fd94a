"""Chains to talk to: an embedded py-evm chain for dev and tests, or a JSON-RPC node.

Each call builds its own provider and chain; nothing is cached at module level, so
several agents (or tests) in one process never share state.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from eth_typing import ChecksumAddress
from web3 import AsyncHTTPProvider, AsyncWeb3
from web3.providers.eth_tester import AsyncEthereumTesterProvider
from web3.types import TxReceipt, Wei

from aitbc_agent_sdk.errors import ChainError, ChainUnreachableError, ConfigError, UnreachableError

from ._tx import CHAIN_EXCEPTIONS, map_chain_error

__all__ = ["DevChain", "connect_rpc", "start_embedded_chain"]


@dataclass
class DevChain:
    """An in-process chain with eth-tester's ten pre-funded, node-unlocked accounts.

    Blocks are mined on every transaction (auto-mine), so receipts are immediate.
    """

    w3: AsyncWeb3
    accounts: tuple[ChecksumAddress, ...]

    async def fund(self, address: str, wei: int, *, source: int = 0) -> TxReceipt:
        """Move ``wei`` from pre-funded account ``source`` to ``address``."""
        if wei < 0:
            raise ConfigError("wei must be non-negative")
        to = AsyncWeb3.to_checksum_address(address)
        try:
            # eth_sendTransaction: the tester node signs for its own unlocked accounts.
            tx_hash = await self.w3.eth.send_transaction(
                {"from": self.accounts[source], "to": to, "value": Wei(wei)}
            )
            return await self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=10)
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action=f"fund {to}") from exc

    async def balance(self, address: str) -> int:
        try:
            return int(await self.w3.eth.get_balance(AsyncWeb3.to_checksum_address(address)))
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action="get_balance") from exc


async def start_embedded_chain() -> DevChain:
    """Create a fresh py-evm chain (eth-tester's default fork) behind an ``AsyncWeb3``."""
    # Building genesis runs py-evm synchronously for a moment; keep it off the loop.
    provider = await asyncio.to_thread(AsyncEthereumTesterProvider)
    w3 = AsyncWeb3(provider)
    accounts = tuple(AsyncWeb3.to_checksum_address(a) for a in await w3.eth.accounts)
    return DevChain(w3=w3, accounts=accounts)


async def connect_rpc(url: str, *, timeout: float = 10.0, check: bool = True) -> AsyncWeb3:
    """Connect to a JSON-RPC node (anvil, geth, ...); every request is bounded by ``timeout``.

    With ``check`` (the default) the node is asked for its chain id, so a dead URL fails
    here with a ChainError rather than on the first real call.
    """
    provider = AsyncHTTPProvider(url, request_kwargs={"timeout": aiohttp.ClientTimeout(total=timeout)})
    w3 = AsyncWeb3(provider)
    if check:
        try:
            await asyncio.wait_for(w3.eth.chain_id, timeout=timeout)
        except CHAIN_EXCEPTIONS as exc:
            await provider.disconnect()
            err = map_chain_error(exc, action=f"connect to {url}")
            raise (ChainUnreachableError if isinstance(err, UnreachableError) else ChainError)(
                f"{err} — is the node running?") from exc
    return w3
