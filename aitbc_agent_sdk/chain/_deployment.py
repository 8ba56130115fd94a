"""Deploying the SDK's contracts to a chain, funding dev accounts, and checking a deployment still exists.

A :class:`Deployment` is what a devnet profile records; :func:`verify_deployment` is run
before it is trusted again, because a restarted dev node without persisted state has
silently forgotten every contract.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from pydantic import BaseModel, ConfigDict
from web3 import AsyncWeb3
from web3.types import TxReceipt, Wei

from aitbc_agent_sdk.errors import ChainError, ConfigError

from ._artifacts import ContractArtifact, deploy, load_artifact
from ._tx import CHAIN_EXCEPTIONS, TransactionSender, map_chain_error

__all__ = ["Deployment", "deploy_contracts", "fund_accounts", "verify_deployment"]

# Field name on Deployment -> shipped artifact name. A new contract is one more entry here
# plus one more field on Deployment; deploy and verify walk this table.
CONTRACTS: dict[str, str] = {"escrow": "TrainingEscrow"}
# Contracts that a deployed contract creates itself: field -> (artifact name, parent field,
# parent view returning the address). The escrow deploys its ProviderRegistry in its constructor.
CREATED: dict[str, tuple[str, str, str]] = {"registry": ("ProviderRegistry", "escrow", "registry")}


class Deployment(BaseModel):
    """Where the SDK's contracts live on one chain."""

    model_config = ConfigDict(frozen=True)

    chain_id: int
    escrow: ChecksumAddress
    # None only in deployments recorded before the registry existed.
    registry: ChecksumAddress | None = None
    block: int  # block of the last deployment tx; event scans can start here
    deployer: ChecksumAddress

    def addresses(self) -> dict[str, ChecksumAddress]:
        return {field: getattr(self, field) for field in CONTRACTS}


async def deploy_contracts(sender: TransactionSender) -> Deployment:
    """Deploy every contract in :data:`CONTRACTS` from the sender's account, one after the other.

    Contracts they create themselves (:data:`CREATED`: the escrow's ProviderRegistry) are
    looked up and recorded too.
    """
    try:
        chain_id = int(await sender.w3.eth.chain_id)
    except CHAIN_EXCEPTIONS as exc:
        raise map_chain_error(exc, action="deploy_contracts") from exc
    addresses: dict[str, ChecksumAddress] = {}
    for field, name in CONTRACTS.items():
        addresses[field] = await deploy(sender, load_artifact(name))
    try:
        for field, (_, parent, view) in CREATED.items():
            parent_artifact = load_artifact(CONTRACTS[parent])
            contract = sender.w3.eth.contract(address=addresses[parent], abi=parent_artifact.abi)
            created = await getattr(contract.functions, view)().call()
            addresses[field] = AsyncWeb3.to_checksum_address(created)
        block = int(await sender.w3.eth.block_number)
    except CHAIN_EXCEPTIONS as exc:
        raise map_chain_error(exc, action="deploy_contracts") from exc
    return Deployment(chain_id=chain_id, block=block, deployer=sender.address, **addresses)


async def fund_accounts(sender: TransactionSender, addresses: Sequence[str], wei: int) -> list[TxReceipt]:
    """Send ``wei`` to each address concurrently; the sender hands out consecutive nonces."""
    if wei < 0:
        raise ConfigError("wei must be non-negative")
    try:
        targets = [AsyncWeb3.to_checksum_address(a) for a in addresses]
    except ValueError as exc:
        raise ConfigError(f"invalid address to fund: {exc}") from exc
    return list(
        await asyncio.gather(
            *(sender.send({"to": to, "value": Wei(wei)}, label=f"fund {to}") for to in targets)
        )
    )


async def verify_deployment(w3: AsyncWeb3, deployment: Deployment) -> None:
    """Raise ChainError unless every contract of ``deployment`` is on this chain with the shipped code."""
    try:
        chain_id = int(await w3.eth.chain_id)
    except CHAIN_EXCEPTIONS as exc:
        raise map_chain_error(exc, action="verify deployment") from exc
    if chain_id != deployment.chain_id:
        raise ChainError(
            f"deployment is for chain {deployment.chain_id} but the node is on chain {chain_id}"
        )
    created = {field: name for field, (name, _, _) in CREATED.items()}
    for field, name in {**CONTRACTS, **created}.items():
        address = getattr(deployment, field)
        if address is None:
            continue
        try:
            code = bytes(await w3.eth.get_code(address))
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action=f"verify {name}") from exc
        if not code:
            raise ChainError(
                f"no {name} contract at {address} on chain {chain_id}: the chain was reset or the deployment"
                " belongs to another node; deploy the contracts again"
            )
        _check_code(load_artifact(name), address, code)


def _check_code(artifact: ContractArtifact, address: str, code: bytes) -> None:
    # The contracts have no immutables, so the runtime code equals the artifact's byte for byte.
    if code != bytes(HexBytes(artifact.deployed_bytecode)):
        raise ChainError(
            f"the code at {address} is not this SDK's {artifact.name} (different version or another contract)"
        )
