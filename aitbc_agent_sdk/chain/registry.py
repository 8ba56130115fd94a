"""Typed async wrapper around the ProviderRegistry contract, and the slashing evidence format.

A provider bonds ETH and publishes the hash of its offer metadata; the registry's escrow moves
its reputation counters; a training's coordinator can slash it with a signed bad result.

Evidence format: the provider signs, with EIP-191 ``personal_sign``, the 32-byte digest
``keccak256(abi.encode(trainingId, keccak256(utf8(cid))))`` (:func:`result_digest`);
:func:`sign_result` produces the 65-byte ``r || s || v`` signature the contract checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_abi import encode as abi_encode
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import keccak
from web3 import AsyncWeb3
from web3.types import TxReceipt

from aitbc_agent_sdk.errors import ConfigError

from .contract import ContractClient
from .tx import TransactionSender

__all__ = ["ProviderState", "RegistryClient", "SlashEvidence", "result_digest", "sign_result"]


def result_digest(training_id: bytes, cid: str) -> bytes:
    """What a provider signs for a result: ``keccak256(abi.encode(trainingId, keccak256(cid)))``."""
    return keccak(abi_encode(["bytes32", "bytes32"], [_bytes32(training_id), keccak(text=cid)]))


def sign_result(account: LocalAccount, training_id: bytes, cid: str) -> bytes:
    """The provider's EIP-191 (personal_sign) signature over :func:`result_digest`."""
    signed = account.sign_message(encode_defunct(primitive=result_digest(training_id, cid)))
    return bytes(signed.signature)


@dataclass(frozen=True)
class SlashEvidence:
    """A result the provider signed that failed verification."""

    training_id: bytes
    provider: str
    cid: str
    signature: bytes


@dataclass(frozen=True)
class ProviderState:
    """A provider's bond (wei), metadata hash and on-chain reputation counters."""

    stake: int
    metadata_hash: bytes
    registered: bool
    unbonding_at: int  # unix time the bond can be withdrawn; 0 when not unbonding
    assigned: int  # open trainings that hold a slot for it
    completed: int
    failed: int
    slashes: int


class RegistryClient(ContractClient):
    """Reads and writes one deployed ProviderRegistry (see ``EscrowClient.registry()``)."""

    ARTIFACT = "ProviderRegistry"

    # --- writes -----------------------------------------------------------------------

    async def register(self, sender: TransactionSender, stake: int, metadata_hash: bytes) -> TxReceipt:
        """Register the sender with ``stake`` wei as its bond (at least ``MIN_STAKE``)."""
        return await self._transact(sender, "register", [_bytes32(metadata_hash)], value=stake)

    async def update(self, sender: TransactionSender, metadata_hash: bytes, *, add_stake: int = 0) -> TxReceipt:
        """Publish new offer metadata and top up the bond; cancels a pending unbonding."""
        return await self._transact(sender, "update", [_bytes32(metadata_hash)], value=add_stake)

    async def begin_unbonding(self, sender: TransactionSender) -> TxReceipt:
        return await self._transact(sender, "beginUnbonding", [])

    async def withdraw(self, sender: TransactionSender) -> TxReceipt:
        """Take the bond back once unbonded and assigned to no open training."""
        return await self._transact(sender, "withdraw", [])

    async def slash(self, sender: TransactionSender, evidence: SlashEvidence) -> TxReceipt:
        """Slash a provider of one of the sender's trainings; the sender receives the amount."""
        try:
            provider = AsyncWeb3.to_checksum_address(evidence.provider)
        except ValueError as exc:
            raise ConfigError(f"invalid provider address: {exc}") from exc
        args = [_bytes32(evidence.training_id), provider, evidence.cid, bytes(evidence.signature)]
        return await self._transact(sender, "slash", args)

    # --- views ------------------------------------------------------------------------

    async def provider(self, account: str) -> ProviderState:
        values = await self._call("providerInfo", AsyncWeb3.to_checksum_address(account))
        stake, metadata_hash, registered, unbonding_at, assigned, completed, failed, slashes = values
        return ProviderState(int(stake), bytes(metadata_hash), bool(registered), int(unbonding_at),
                             int(assigned), int(completed), int(failed), int(slashes))

    async def providers(self) -> list[ChecksumAddress]:
        """Every address that ever registered; check ``provider(a).registered``."""
        return [AsyncWeb3.to_checksum_address(a) for a in await self._call("allProviders")]

    async def escrow(self) -> ChecksumAddress:
        return AsyncWeb3.to_checksum_address(await self._call("escrow"))

    async def was_slashed(self, training_id: bytes, provider: str) -> bool:
        return bool(await self._call("slashed", _bytes32(training_id), AsyncWeb3.to_checksum_address(provider)))


def _bytes32(value: bytes) -> bytes:
    raw = bytes(value)
    if len(raw) != 32:
        raise ConfigError(f"expected 32 bytes, got {len(raw)}")
    return raw
