"""Typed async wrapper around the TrainingEscrow contract.

The client only encodes calls and decodes results; every write goes through a
:class:`TransactionSender` passed in by the caller, which holds the signer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from eth_abi import encode as abi_encode
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import keccak
from hexbytes import HexBytes
from web3 import AsyncWeb3
from web3.types import BlockIdentifier, TxReceipt

from aitbc_agent_sdk.errors import ConfigError

from .contract import ContractClient
from .registry import is_canonical_signature, signature_signer
from .tx import CHAIN_EXCEPTIONS, TransactionSender, map_chain_error

__all__ = [
    "ETH_TOKEN",
    "EscrowClient",
    "EscrowEvent",
    "EscrowState",
    "SlotState",
    "consent_digest",
    "consent_signer",
    "key_of",
    "result_hash",
    "sign_consent",
    "training_key",
    "training_salt",
]

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
ETH_TOKEN = ZERO_ADDRESS  # the escrow's token address for native ETH
CONSENT_TAG = keccak(text="aitbc.consent.v1")
# The contract's MAX_DURATION: no training's deadline may be further away than this.
MAX_DURATION_S = 30 * 24 * 3600
# Without an explicit deadline a training may run this long (from the chain's latest block)
# before anyone may force the refund (after the contract's grace period on top).
DEFAULT_DEADLINE_S = 24 * 3600
EventName = Literal["TrainingOpened", "SlotOpened", "WorkerReplaced", "SlotDropped", "Released", "PaymentDeferred",
                    "Refunded"]
# Every per-training event has trainingId as its first indexed topic.
TRAINING_EVENTS: tuple[EventName, ...] = (
    "TrainingOpened",
    "SlotOpened",
    "WorkerReplaced",
    "SlotDropped",
    "Released",
    "PaymentDeferred",
    "Refunded",
)


def training_salt(training_id: str) -> bytes:
    """The salt a coordinator opens its training with: keccak256 of the string id (utf-8)."""
    return keccak(text=training_id)


def key_of(coordinator: str, salt: bytes) -> bytes:
    """The contract's ``trainingIdOf(coordinator, salt)``: ``keccak256(abi.encode(coordinator, salt))``."""
    return keccak(abi_encode(["address", "bytes32"], [_address(coordinator, "coordinator"), _bytes32(salt, "salt")]))


def training_key(coordinator: str, training_id: str) -> bytes:
    """The on-chain bytes32 id of a coordinator's training (:func:`key_of` its salt).

    The contract derives it from the sender, so nobody else can open (squat) the same id.
    """
    return key_of(coordinator, training_salt(training_id))


def consent_digest(chain_id: int, escrow: str, key: bytes, worker: str) -> bytes:
    """What a worker signs to accept a slot: the contract's ``consentDigest(trainingId, worker)``."""
    return keccak(abi_encode(["bytes32", "uint256", "address", "bytes32", "address"],
                             [CONSENT_TAG, chain_id, _address(escrow, "escrow"), _bytes32(key, "training_id"),
                              _address(worker, "worker")]))


def sign_consent(account: LocalAccount, chain_id: int, escrow: str, key: bytes) -> bytes:
    """The worker's EIP-191 signature over :func:`consent_digest` (canonical: low s, v in {27, 28})."""
    digest = consent_digest(chain_id, escrow, key, account.address)
    return bytes(account.sign_message(encode_defunct(primitive=digest)).signature)


def consent_signer(chain_id: int, escrow: str, key: bytes, worker: str, signature: bytes) -> str | None:
    """The address a consent recovers to, or None unless it is canonical (the contract's rule)."""
    if not is_canonical_signature(signature):
        return None
    return signature_signer(consent_digest(chain_id, escrow, key, worker), signature)


def result_hash(cid: str) -> bytes:
    """The bytes32 recorded with a payment: keccak256 of the accepted checkpoint's CID (utf-8)."""
    return keccak(text=cid)


@dataclass(frozen=True)
class EscrowState:
    """One training's budget as the contract sees it (amounts in wei or token base units)."""

    coordinator: ChecksumAddress
    deposited: int
    paid: int
    refunded: int
    closed: bool
    token: ChecksumAddress = ETH_TOKEN  # type: ignore[assignment]
    deadline: int = 0  # unix time; anyone may refund after deadline + the contract's GRACE_PERIOD

    @property
    def exists(self) -> bool:
        return self.coordinator != ZERO_ADDRESS

    @property
    def remaining(self) -> int:
        """Wei still held for this training (not paid, not refunded)."""
        return self.deposited - self.paid - self.refunded


class SlotState(NamedTuple):
    """A worker's cap and what has been released to it so far, in wei."""

    amount: int
    paid: int


@dataclass(frozen=True)
class EscrowEvent:
    name: EventName
    args: dict[str, Any]
    block_number: int
    tx_hash: str
    log_index: int


class EscrowClient(ContractClient):
    """Reads and writes one deployed TrainingEscrow."""

    ARTIFACT = "TrainingEscrow"

    # --- writes -----------------------------------------------------------------------

    async def open(
        self,
        sender: TransactionSender,
        salt: bytes,
        workers: Sequence[str],
        amounts: Sequence[int],
        consents: Sequence[bytes],
        *,
        value: int | None = None,
        token: str = ETH_TOKEN,
        deadline: int | None = None,
    ) -> TxReceipt:
        """Open the training ``trainingIdOf(sender, salt)`` funded with ``sum(amounts)`` of ``token``.

        ``consents`` holds each worker's :func:`sign_consent` for that id. For ETH the deposit is sent as the tx value (``value`` overrides, for tests); for an
        ERC-20 the sender must have approved the escrow for the sum first. ``deadline``
        (unix time) defaults to the latest block's time plus :data:`DEFAULT_DEADLINE_S`.
        """
        tid = _bytes32(salt, "salt")
        addrs = _addresses(workers)
        _same_length(addrs, amounts, consents)
        token_address = _address(token, "token")
        if value is None:
            value = sum(amounts) if token_address == ETH_TOKEN else 0
        if deadline is None:
            deadline = await self._latest_timestamp() + DEFAULT_DEADLINE_S
        return await self._transact(
            sender, "open", [tid, token_address, addrs, list(amounts), [bytes(c) for c in consents], deadline],
            value=value,
        )

    async def add_worker(
        self, sender: TransactionSender, training_id: bytes, worker: str, amount: int, consent: bytes, *,
        value: int | None = None,
    ) -> TxReceipt:
        """Fund a slot for one more worker, which signed ``consent``, in an open training (coordinator only).

        Trainings in ETH send ``amount`` as the tx value (``value`` overrides, for tests); for an
        ERC-20 training the sender must have approved the escrow for ``amount`` first.
        """
        tid = _bytes32(training_id, "training_id")
        if value is None:
            value = amount if (await self.training(tid)).token == ETH_TOKEN else 0
        return await self._transact(sender, "addWorker", [tid, _address(worker, "worker"), amount, bytes(consent)],
                                    value=value)

    async def replace_worker(
        self, sender: TransactionSender, training_id: bytes, old_worker: str, new_worker: str, consent: bytes
    ) -> TxReceipt:
        """Move an unpaid worker's slot to another provider, which signed ``consent`` (coordinator only)."""
        return await self._transact(
            sender,
            "replaceWorker",
            [_bytes32(training_id, "training_id"), _address(old_worker, "worker"), _address(new_worker, "worker"),
             bytes(consent)],
        )

    async def drop_worker(self, sender: TransactionSender, training_id: bytes, worker: str) -> TxReceipt:
        """Take back an unpaid worker's slot without recording a failure (coordinator only)."""
        return await self._transact(sender, "dropWorker", [_bytes32(training_id, "training_id"),
                                                           _address(worker, "worker")])

    async def release(
        self,
        sender: TransactionSender,
        training_id: bytes,
        workers: Sequence[str],
        amounts: Sequence[int],
        result_hashes: Sequence[bytes],
    ) -> TxReceipt:
        """Pay each worker its amount for the result with the matching hash, in one tx."""
        tid = _bytes32(training_id, "training_id")
        addrs = _addresses(workers)
        hashes = [_bytes32(h, "result hash") for h in result_hashes]
        _same_length(addrs, amounts, hashes)
        return await self._transact(sender, "release", [tid, addrs, list(amounts), hashes])

    async def refund(self, sender: TransactionSender, training_id: bytes) -> TxReceipt:
        """Close the training and return the unreleased budget to the coordinator (the depositor).

        The coordinator may call it at any time; anyone else after ``deadline + GRACE_PERIOD``.
        """
        return await self._transact(sender, "refund", [_bytes32(training_id, "training_id")])

    async def withdraw(self, sender: TransactionSender, token: str = ETH_TOKEN) -> TxReceipt:
        """Pull payments of ``token`` that could not be pushed to the sender's address."""
        return await self._transact(sender, "withdraw", [_address(token, "token")])

    # --- views ------------------------------------------------------------------------

    async def training(self, training_id: bytes) -> EscrowState:
        coordinator, token, deadline, deposited, paid, refunded, closed = await self._call(
            "trainings", _bytes32(training_id, "training_id")
        )
        return EscrowState(
            AsyncWeb3.to_checksum_address(coordinator), int(deposited), int(paid), int(refunded), bool(closed),
            token=AsyncWeb3.to_checksum_address(token), deadline=int(deadline),
        )

    async def slot(self, training_id: bytes, worker: str) -> SlotState:
        amount, paid = await self._call(
            "slot", _bytes32(training_id, "training_id"), AsyncWeb3.to_checksum_address(worker)
        )
        return SlotState(int(amount), int(paid))

    async def owed(self, account: str, token: str = ETH_TOKEN) -> int:
        """What ``account`` can pull with :meth:`withdraw` (a payment whose push failed)."""
        return int(await self._call("owed", _address(token, "token"), _address(account, "account")))

    async def workers(self, training_id: bytes) -> list[ChecksumAddress]:
        """Every address given a slot in the training, replacements appended."""
        found = await self._call("trainingWorkers", _bytes32(training_id, "training_id"))
        return [AsyncWeb3.to_checksum_address(a) for a in found]

    async def chain_id(self) -> int:
        try:
            return int(await self._w3.eth.chain_id)
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action="read the chain id") from exc

    async def registry(self) -> ChecksumAddress:
        """The ProviderRegistry this escrow deployed and reports assignments to."""
        return AsyncWeb3.to_checksum_address(await self._call("registry"))

    async def events(
        self,
        training_id: bytes,
        *,
        names: Sequence[EventName] = TRAINING_EVENTS,
        from_block: int = 0,
        to_block: BlockIdentifier = "latest",
        chunk_size: int = 10_000,
    ) -> list[EscrowEvent]:
        """Decoded events of one training, oldest first, read with ``eth_getLogs``."""
        tid = _bytes32(training_id, "training_id")
        return await self._logs(names, [HexBytes(tid).to_0x_hex()], from_block, to_block, chunk_size)

    async def trainings_named(self, training_id: str, *, from_block: int = 0) -> list[tuple[bytes, ChecksumAddress]]:
        """(on-chain id, coordinator) of every training opened with ``training_id``'s salt, oldest first.

        For tools that know a training by name only; anybody may open one with the same salt,
        so pick by coordinator.
        """
        salt = HexBytes(training_salt(training_id)).to_0x_hex()
        found = await self._logs(("TrainingOpened",), [None, None, salt], from_block, "latest", 10_000)
        return [(bytes(e.args["trainingId"]), AsyncWeb3.to_checksum_address(e.args["coordinator"])) for e in found]

    async def worker_payments(self, worker: str, *, from_block: int = 0,
                              to_block: BlockIdentifier = "latest") -> list[EscrowEvent]:
        """Every ``Released`` event paying ``worker``, across all trainings (its earnings)."""
        padded = "0x" + "00" * 12 + AsyncWeb3.to_checksum_address(worker)[2:].lower()
        return await self._logs(("Released",), [None, padded], from_block, to_block, 10_000)

    async def _logs(self, names: Sequence[EventName], indexed: list[str | None], from_block: int,
                    to_block: BlockIdentifier, chunk_size: int) -> list[EscrowEvent]:
        """Decoded logs of the named events whose indexed topics match, oldest first.

        The range is walked in ``chunk_size`` blocks because public nodes cap log ranges.
        """
        by_topic = {
            HexBytes(getattr(self._contract.events, name).topic): getattr(self._contract.events, name)
            for name in names
        }
        topics = [[t.to_0x_hex() for t in by_topic], *indexed]
        try:
            last = int((await self._w3.eth.get_block(to_block))["number"])
            found: list[EscrowEvent] = []
            for start in range(from_block, last + 1, chunk_size):
                logs = await self._w3.eth.get_logs(
                    {
                        "address": self.address,
                        "topics": topics,
                        "fromBlock": start,
                        "toBlock": min(start + chunk_size - 1, last),
                    }
                )
                for log in logs:
                    event = by_topic[HexBytes(log["topics"][0])]().process_log(log)
                    found.append(
                        EscrowEvent(
                            name=event["event"],
                            args=dict(event["args"]),
                            block_number=int(event["blockNumber"]),
                            tx_hash=HexBytes(event["transactionHash"]).to_0x_hex(),
                            log_index=int(event["logIndex"]),
                        )
                    )
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, abi=self.abi, action="TrainingEscrow events") from exc
        return found

    async def _latest_timestamp(self) -> int:
        try:
            return int((await self._w3.eth.get_block("latest"))["timestamp"])
        except CHAIN_EXCEPTIONS as exc:
            raise map_chain_error(exc, action="read the latest block") from exc


def _bytes32(value: bytes, what: str) -> bytes:
    raw = bytes(value)
    if len(raw) != 32:
        raise ConfigError(f"{what} must be 32 bytes, got {len(raw)}")
    return raw


def _address(value: str, what: str) -> ChecksumAddress:
    try:
        return AsyncWeb3.to_checksum_address(value)
    except ValueError as exc:
        raise ConfigError(f"invalid {what} address: {exc}") from exc


def _addresses(workers: Sequence[str]) -> list[ChecksumAddress]:
    try:
        return [AsyncWeb3.to_checksum_address(w) for w in workers]
    except ValueError as exc:
        raise ConfigError(f"invalid worker address: {exc}") from exc


def _same_length(*columns: Sequence[Any]) -> None:
    if len({len(c) for c in columns}) != 1:
        raise ConfigError("workers, amounts (and consents or result hashes) must have the same length")
