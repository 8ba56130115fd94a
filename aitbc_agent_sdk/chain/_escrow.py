"""Typed async wrapper around the TrainingEscrow contract.

The client only encodes calls and decodes results; every write goes through a
:class:`TransactionSender` passed in by the caller, which holds the signer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from web3 import AsyncWeb3
from web3.types import BlockIdentifier, TxReceipt

from aitbc_agent_sdk.errors import ConfigError

from ._contract import ContractClient
from ._escrow_digests import UINT64_MAX
from ._escrow_digests import as_address as _address
from ._escrow_digests import as_bytes32 as _bytes32
# Re-exported: the escrow's ids and signatures are part of its client's API.
from ._escrow_digests import (consent_digest, consent_signer, key_of, receipt_digest, receipt_signer, result_hash,
                             sign_consent, sign_receipt, training_key, training_salt)
from ._tx import CHAIN_EXCEPTIONS, TransactionSender, map_chain_error

__all__ = [
    "ETH_TOKEN",
    "EscrowClient",
    "EscrowEvent",
    "EscrowState",
    "HeldFunds",
    "SlotState",
    "consent_digest",
    "consent_signer",
    "key_of",
    "receipt_digest",
    "receipt_signer",
    "result_hash",
    "sign_consent",
    "sign_receipt",
    "training_key",
    "training_salt",
]

ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
ETH_TOKEN = ZERO_ADDRESS  # the escrow's token address for native ETH
# The contract's CLAIM_WINDOW: receipts stay redeemable this long after a refund.
CLAIM_WINDOW_S = 3600
# The contract's GRACE_PERIOD: after deadline + this anyone may refund a training.
GRACE_PERIOD_S = 24 * 3600
# The contract's MAX_DURATION: no training's deadline may be further away than this.
MAX_DURATION_S = 30 * 24 * 3600
# Without an explicit deadline a training may run this long (from the chain's latest block)
# before anyone may force the refund (after the contract's grace period on top).
DEFAULT_DEADLINE_S = 24 * 3600
EventName = Literal["TrainingOpened", "SlotOpened", "WorkerReplaced", "SlotDropped", "Released", "PaymentDeferred",
                    "Refunded", "Redeemed", "Reclaimed", "VerificationFunded", "VerifierPaid"]
# Every per-training event has trainingId as its first indexed topic.
TRAINING_EVENTS: tuple[EventName, ...] = (
    "TrainingOpened",
    "SlotOpened",
    "WorkerReplaced",
    "SlotDropped",
    "Released",
    "PaymentDeferred",
    "Refunded",
    "Redeemed",
    "Reclaimed",
    "VerificationFunded",
    "VerifierPaid",
)


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


class HeldFunds(NamedTuple):
    """What a training still holds and, once closed, until when receipts can claim it (unix time).

    While the training is open ``amount`` is its whole unpaid budget and ``claimable_until`` is 0.
    """

    amount: int
    claimable_until: int


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

    async def fund_verification(self, sender: TransactionSender, training_id: bytes, amount: int, *,
                                value: int | None = None) -> TxReceipt:
        """Add ``amount`` to the training's budget for paying workers per verification (coordinator only);
        what is not paid from it is refunded with the deposit. ETH trainings send it as the tx value."""
        tid = _bytes32(training_id, "training_id")
        if value is None:
            value = amount if (await self.training(tid)).token == ETH_TOKEN else 0
        return await self._transact(sender, "fundVerification", [tid, amount], value=value)

    async def pay_verifiers(self, sender: TransactionSender, training_id: bytes, verifiers: Sequence[str],
                            amounts: Sequence[int], evidence: Sequence[bytes]) -> TxReceipt:
        """Pay each verifier (a worker of the training) its amount from the verification budget, for the
        reports ``evidence`` names, in one tx."""
        tid = _bytes32(training_id, "training_id")
        addrs = _addresses(verifiers)
        digests = [_bytes32(e, "evidence") for e in evidence]
        _same_length(addrs, amounts, digests)
        return await self._transact(sender, "payVerifiers", [tid, addrs, list(amounts), digests])

    async def verification_budget(self, training_id: bytes) -> int:
        """What the training's verification budget still holds."""
        return int(await self._call("verificationBudget", _bytes32(training_id, "training_id")))

    async def refund(self, sender: TransactionSender, training_id: bytes) -> TxReceipt:
        """Close the training and return to the coordinator (the depositor) what no active slot
        can still claim; the slots' unpaid rest is held for receipts (:meth:`held`, :meth:`reclaim`).

        The coordinator may call it at any time; anyone else after ``deadline + GRACE_PERIOD``.
        """
        return await self._transact(sender, "refund", [_bytes32(training_id, "training_id")])

    async def redeem(self, sender: TransactionSender, training_id: bytes, worker: str, round: int, cumulative: int,
                     signature: bytes) -> TxReceipt:
        """Pay ``worker`` what the coordinator's receipt owes it beyond what its slot was paid.

        Anyone may send it (the money goes to the worker); it works while the training is open
        and until the claim window after its refund is over.
        """
        if not 0 <= round <= UINT64_MAX:
            raise ConfigError(f"round {round} is not a uint64")
        return await self._transact(sender, "redeem", [_bytes32(training_id, "training_id"),
                                                       _address(worker, "worker"), round, cumulative,
                                                       bytes(signature)])

    async def reclaim(self, sender: TransactionSender, training_id: bytes) -> TxReceipt:
        """Return what receipts did not claim to the coordinator, once the claim window is over (anyone)."""
        return await self._transact(sender, "reclaim", [_bytes32(training_id, "training_id")])

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

    async def held(self, training_id: bytes) -> HeldFunds:
        """What the training still holds and until when receipts can claim it (0 while open)."""
        amount, until = await self._call("held", _bytes32(training_id, "training_id"))
        return HeldFunds(int(amount), int(until))

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


def _addresses(workers: Sequence[str]) -> list[ChecksumAddress]:
    try:
        return [AsyncWeb3.to_checksum_address(w) for w in workers]
    except ValueError as exc:
        raise ConfigError(f"invalid worker address: {exc}") from exc


def _same_length(*columns: Sequence[Any]) -> None:
    if len({len(c) for c in columns}) != 1:
        raise ConfigError("workers, amounts (and consents or result hashes) must have the same length")
