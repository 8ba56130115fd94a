"""Training ids and the digests that TrainingEscrow's signatures cover (consents, payment receipts).

Pure functions: they mirror the contract's ``trainingIdOf``, ``consentDigest`` and ``receiptDigest``
byte for byte, so a signature made here is exactly what the contract checks.
"""

from __future__ import annotations

from eth_abi import encode as abi_encode
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import keccak
from web3 import AsyncWeb3

from aitbc_agent_sdk.errors import ConfigError

from ._registry import is_canonical_signature, signature_signer

CONSENT_TAG = keccak(text="aitbc.consent.v1")
RECEIPT_TAG = keccak(text="aitbc.receipt.v1")
UINT64_MAX = 2**64 - 1
UINT256_MAX = 2**256 - 1


def training_salt(training_id: str) -> bytes:
    """The salt a coordinator opens its training with: keccak256 of the string id (utf-8)."""
    return keccak(text=training_id)


def key_of(coordinator: str, salt: bytes) -> bytes:
    """The contract's ``trainingIdOf(coordinator, salt)``: ``keccak256(abi.encode(coordinator, salt))``."""
    return keccak(abi_encode(["address", "bytes32"],
                             [as_address(coordinator, "coordinator"), as_bytes32(salt, "salt")]))


def training_key(coordinator: str, training_id: str) -> bytes:
    """The on-chain bytes32 id of a coordinator's training (:func:`key_of` its salt).

    The contract derives it from the sender, so nobody else can open (squat) the same id.
    """
    return key_of(coordinator, training_salt(training_id))


def consent_digest(chain_id: int, escrow: str, key: bytes, worker: str) -> bytes:
    """What a worker signs to accept a slot: the contract's ``consentDigest(trainingId, worker)``."""
    return keccak(abi_encode(["bytes32", "uint256", "address", "bytes32", "address"],
                             [CONSENT_TAG, chain_id, as_address(escrow, "escrow"), as_bytes32(key, "training_id"),
                              as_address(worker, "worker")]))


def sign_consent(account: LocalAccount, chain_id: int, escrow: str, key: bytes) -> bytes:
    """The worker's EIP-191 signature over :func:`consent_digest` (canonical: low s, v in {27, 28})."""
    digest = consent_digest(chain_id, escrow, key, account.address)
    return bytes(account.sign_message(encode_defunct(primitive=digest)).signature)


def consent_signer(chain_id: int, escrow: str, key: bytes, worker: str, signature: bytes) -> str | None:
    """The address a consent recovers to, or None unless it is canonical (the contract's rule)."""
    if not is_canonical_signature(signature):
        return None
    return signature_signer(consent_digest(chain_id, escrow, key, worker), signature)


def receipt_digest(chain_id: int, escrow: str, key: bytes, worker: str, round: int, cumulative: int) -> bytes:
    """What the coordinator signs to owe ``worker`` ``cumulative`` wei in total once it accepted
    ``round``: the contract's ``receiptDigest(trainingId, worker, round, cumulative)``."""
    if not 0 <= round <= UINT64_MAX:
        raise ConfigError(f"round {round} is not a uint64")
    if not 0 <= cumulative <= UINT256_MAX:
        raise ConfigError(f"cumulative amount {cumulative} is not a uint256")
    return keccak(abi_encode(["bytes32", "uint256", "address", "bytes32", "address", "uint64", "uint256"],
                             [RECEIPT_TAG, chain_id, as_address(escrow, "escrow"), as_bytes32(key, "training_id"),
                              as_address(worker, "worker"), round, cumulative]))


def sign_receipt(account: LocalAccount, chain_id: int, escrow: str, key: bytes, worker: str, round: int,
                 cumulative: int) -> bytes:
    """The coordinator's EIP-191 signature over :func:`receipt_digest` (65 bytes, canonical)."""
    digest = receipt_digest(chain_id, escrow, key, worker, round, cumulative)
    return bytes(account.sign_message(encode_defunct(primitive=digest)).signature)


def receipt_signer(chain_id: int, escrow: str, key: bytes, worker: str, round: int, cumulative: int,
                   signature: bytes) -> str | None:
    """The address a receipt recovers to, or None unless it is canonical (the contract's rule)."""
    if not is_canonical_signature(signature):
        return None
    return signature_signer(receipt_digest(chain_id, escrow, key, worker, round, cumulative), signature)


def result_hash(cid: str) -> bytes:
    """The bytes32 recorded with a payment: keccak256 of the accepted checkpoint's CID (utf-8)."""
    return keccak(text=cid)


def as_bytes32(value: bytes, what: str) -> bytes:
    """``value`` as exactly 32 bytes, or a ConfigError naming ``what``."""
    raw = bytes(value)
    if len(raw) != 32:
        raise ConfigError(f"{what} must be 32 bytes, got {len(raw)}")
    return raw


def as_address(value: str, what: str) -> ChecksumAddress:
    """``value`` as a checksummed address, or a ConfigError naming ``what``."""
    try:
        return AsyncWeb3.to_checksum_address(value)
    except ValueError as exc:
        raise ConfigError(f"invalid {what} address: {exc}") from exc
