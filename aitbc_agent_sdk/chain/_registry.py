"""Typed async wrapper around the ProviderRegistry contract, and the slashing evidence format.

A provider bonds ETH and publishes the hash of its offer metadata; the registry's escrow moves
its reputation counters; a training's coordinator can slash it with a signed bad result.

Evidence format: the provider signs, with EIP-191 ``personal_sign``, the 32-byte digest
``keccak256(abi.encode(RESULT_TAG, chainId, registry, trainingId, round, keccak256(utf8(cid))))``
(:func:`result_digest`), so evidence is good on one chain, one registry, one training and one
round only; :func:`sign_result` produces the 65-byte ``r || s || v`` signature the contract
checks, and only canonical signatures (v in {27, 28}, low s) count (:func:`is_canonical_signature`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import keccak
from web3 import AsyncWeb3
from web3.types import TxReceipt

from aitbc_agent_sdk.errors import ChainError, ConfigError

from ._contract import ContractClient
from ._tx import CHAIN_EXCEPTIONS, TransactionSender, map_chain_error

__all__ = [
    "EvidenceDomain",
    "ProviderState",
    "RegistryClient",
    "SlashEvidence",
    "is_canonical_signature",
    "result_digest",
    "sign_result",
    "signature_signer",
]

RESULT_TAG = keccak(text="aitbc.result.v1")
# About 20k gas of storage reads each: 500 stay far below a node's eth_call gas cap.
PROVIDERS_PER_CALL = 500
# secp256k1's group order / 2: a canonical signature has s at most this (EIP-2).
HALF_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


@dataclass(frozen=True)
class EvidenceDomain:
    """Where a signed result counts: one chain and one registry deployment."""

    chain_id: int
    registry: str


def result_digest(domain: EvidenceDomain, training_id: bytes, round: int, cid: str) -> bytes:
    """What a provider signs for a result: the contract's ``resultDigest(trainingId, round, cid)``."""
    try:
        registry = AsyncWeb3.to_checksum_address(domain.registry)
    except ValueError as exc:
        raise ConfigError(f"invalid registry address: {exc}") from exc
    return keccak(abi_encode(["bytes32", "uint256", "address", "bytes32", "uint64", "bytes32"],
                             [RESULT_TAG, domain.chain_id, registry, _bytes32(training_id), round, keccak(text=cid)]))


def sign_result(account: LocalAccount, domain: EvidenceDomain, training_id: bytes, round: int, cid: str) -> bytes:
    """The provider's EIP-191 (personal_sign) signature over :func:`result_digest`."""
    signed = account.sign_message(encode_defunct(primitive=result_digest(domain, training_id, round, cid)))
    return bytes(signed.signature)


def is_canonical_signature(signature: bytes) -> bool:
    """65 bytes ``r || s || v`` with v in {27, 28} and s in the lower half: the only form the contracts take."""
    sig = bytes(signature)
    if len(sig) != 65 or sig[64] not in (27, 28):
        return False
    return 0 < int.from_bytes(sig[32:64], "big") <= HALF_ORDER


def signature_signer(digest: bytes, signature: bytes) -> str | None:
    """The address that personal_signed ``digest``, or None for a malformed or non-canonical signature."""
    if not is_canonical_signature(signature):
        return None
    try:
        return Account.recover_message(encode_defunct(primitive=digest), signature=bytes(signature))
    except Exception:  # eth_account raises several types for unrecoverable signatures
        return None


@dataclass(frozen=True)
class SlashEvidence:
    """A result the provider signed in ``round`` that failed verification."""

    training_id: bytes
    provider: str
    cid: str
    signature: bytes
    round: int


@dataclass(frozen=True)
class ProviderState:
    """A provider's bond (wei), metadata hash and on-chain reputation counters."""

    stake: int
    metadata_hash: bytes
    registered: bool
    unbonding_at: int  # unix time the bond can be withdrawn; 0 when not unbonding
    assigned: int  # open trainings that hold a slot for it
    completed: int  # consented assignments that were paid something
    failed: int  # consented assignments that ended unpaid
    slashes: int
    earned: int = 0  # wei of native ETH paid through the escrow: what discovery ranks by


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
        args = [_bytes32(evidence.training_id), evidence.round, provider, evidence.cid, bytes(evidence.signature)]
        return await self._transact(sender, "slash", args)

    # --- views ------------------------------------------------------------------------

    async def provider(self, account: str) -> ProviderState:
        values = await self._call("providerInfo", AsyncWeb3.to_checksum_address(account))
        stake, metadata_hash, registered, unbonding_at, assigned, completed, failed, slashes, earned = values
        return ProviderState(int(stake), bytes(metadata_hash), bool(registered), int(unbonding_at),
                             int(assigned), int(completed), int(failed), int(slashes), int(earned))

    async def provider_states(self, accounts: Sequence[str]) -> dict[str, ProviderState]:
        """``provider(a)`` for every account, ``PROVIDERS_PER_CALL`` to a call: what discovery reads."""
        states: dict[str, ProviderState] = {}  # keyed as asked
        for start in range(0, len(accounts), PROVIDERS_PER_CALL):
            chunk = accounts[start:start + PROVIDERS_PER_CALL]
            rows = await self._call("providerInfos", [AsyncWeb3.to_checksum_address(a) for a in chunk])
            if len(rows) != len(chunk):
                raise ChainError(f"the registry returned {len(rows)} providers for {len(chunk)} asked")
            for address, row in zip(chunk, rows):
                stake, unbonding_at, registered, _listed, assigned, completed, failed, slashes, earned, meta = row
                states[address] = ProviderState(int(stake), bytes(meta), bool(registered), int(unbonding_at),
                                                int(assigned), int(completed), int(failed), int(slashes), int(earned))
        return states

    async def providers(self) -> list[ChecksumAddress]:
        """Every address that ever registered; check ``provider(a).registered``."""
        return [AsyncWeb3.to_checksum_address(a) for a in await self._call("allProviders")]

    async def domain(self) -> EvidenceDomain:
        """The chain and address that this registry's evidence is bound to."""
        try:
            chain_id = int(await self._w3.eth.chain_id)
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action="read the chain id") from exc
        return EvidenceDomain(chain_id, self.address)

    async def escrow(self) -> ChecksumAddress:
        return AsyncWeb3.to_checksum_address(await self._call("escrow"))

    async def burned(self) -> int:
        """Wei slashed from bonds so far; it stays locked in the registry (nobody profits from a slash)."""
        return int(await self._call("burned"))

    async def was_slashed(self, training_id: bytes, provider: str) -> bool:
        return bool(await self._call("slashed", _bytes32(training_id), AsyncWeb3.to_checksum_address(provider)))


def _bytes32(value: bytes) -> bytes:
    raw = bytes(value)
    if len(raw) != 32:
        raise ConfigError(f"expected 32 bytes, got {len(raw)}")
    return raw
