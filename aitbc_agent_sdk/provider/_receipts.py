"""The provider's payment receipts: the newest valid one per escrow slot, the rounds still lacking one,
and when to redeem it from the escrow without the coordinator.

A coordinator that never signs a receipt gets at most ``max_unreceipted_rounds`` rounds of work: the
provider then refuses its jobs (:func:`unreceipted_refusal`). A receipt is redeemed only once the chain
shows its training closed, within the claim window: while it is open the coordinator's ``release`` (which
pays amounts, not a total) could land after the redemption and pay the same rounds twice. A training still
open past ``deadline + GRACE_PERIOD`` is refunded by the provider first, as anyone may then; the refund holds
what the slots can still claim (:func:`redemption_verdict`).

The rules are pure functions; :class:`ReceiptBook` is in memory and bounded, and the receipts still to
redeem are kept in a JSON file in the provider's directory (:class:`ReceiptFile`), checked again when read,
so a provider that restarts after its coordinator is gone can still redeem them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eth_account.signers.local import LocalAccount
from pydantic import Field, ValidationError

from ..chain._escrow import training_key
from ..errors import AitbcError
from ..messaging import Verified
from ..records import PaymentReceipt
from ..records._base import Address, Record, Wei
from ._onchain import GRACE_PERIOD_S, ProviderChain, SlotView

__all__ = ["MAX_DELIVERED_ROUNDS", "MAX_RECEIPT_SLOTS", "RECEIPTS_FILE", "ProviderReceipts", "ReceiptBook",
           "ReceiptFile", "SavedReceipt", "SavedReceipts", "SlotKey", "SlotReceipts", "redeem_due",
           "redemption_verdict", "restore_receipts", "take_receipt", "unreceipted_refusal", "unreceipted_rounds"]

MAX_RECEIPT_SLOTS = 1024  # escrow slots tracked (as many as contracts); only slots it delivered to get one
MAX_DELIVERED_ROUNDS = 1024  # delivered rounds counted per slot (the limit is at most 1,000)
SlotKey = tuple[bytes, str]  # (on-chain training key, worker address): the escrow slot a receipt pays
REDEEM_S = 300.0  # one sweep's refunds and redemptions: a few transactions, each waiting for its confirmations
RECEIPTS_FILE = "receipts.json"  # in the provider's work dir
MAX_RECEIPTS_FILE_BYTES = 1 << 20  # MAX_RECEIPT_SLOTS receipts of about 400 bytes, with room to spare

log = logging.getLogger(__name__)


def unreceipted_rounds(delivered: int, receipted_wei: int, price_wei: int) -> int:
    """How many of the ``delivered`` rounds the newest receipt does not pay for at ``price_wei`` a round.

    Counted in wei, not by the receipt's round number: a receipt naming a late round but owing little
    would otherwise buy rounds of work for nothing. A rejected round is unpaid, so it counts too.
    """
    if price_wei <= 0:
        return 0
    return max(delivered - receipted_wei // price_wei, 0)


def unreceipted_refusal(unreceipted: int, limit: int) -> str | None:
    """Why the provider stops working under a contract, or None; a ``limit`` of 0 never stops it."""
    if limit and unreceipted >= limit:
        return (f"{unreceipted} delivered rounds have no payment receipt from the coordinator "
                f"(this provider stops at {limit})")
    return None


Redemption = Literal["redeem", "refund", "wait", "settled"]


def redemption_verdict(receipt: PaymentReceipt, view: SlotView) -> Redemption:
    """What to do with a slot's newest receipt: ``redeem`` it now, ``refund`` the overdue training first
    (then redeem), ``wait``, or nothing ever (``settled``: the slot was paid that much, it cannot hold it, the
    slot is gone or the claim window is over).

    Only a closed training is redeemed against: while it is open the coordinator may still release, and a
    release in flight pays amounts, not a total, so it would pay again what the redemption paid. A closed
    training takes no release. Past ``deadline + GRACE_PERIOD`` anyone may close it, so the provider does.
    """
    state, slot = view.state, view.slot
    if not state.exists or receipt.cumulative_wei <= slot.paid or receipt.cumulative_wei > slot.amount:
        return "settled"
    if state.closed:
        return "redeem" if view.now < view.held.claimable_until else "settled"
    return "refund" if view.now >= state.deadline + GRACE_PERIOD_S else "wait"


@dataclass
class SlotReceipts:
    """One escrow slot: whose training it is, the rounds delivered in it and its newest valid receipt."""

    training_id: str
    coordinator: str
    price_wei: int  # per round, the latest contract's in this training
    delivered: set[int] = field(default_factory=set)
    receipt: PaymentReceipt | None = None
    settled_wei: int = 0  # receipts up to this cumulative amount need nothing more: redeemed, or paid otherwise

    @property
    def unreceipted(self) -> int:
        return unreceipted_rounds(len(self.delivered), self.receipt.cumulative_wei if self.receipt else 0,
                                  self.price_wei)

    @property
    def unredeemed(self) -> bool:
        return self.receipt is not None and self.receipt.cumulative_wei > self.settled_wei


class SavedReceipt(Record):
    """A slot's receipt still to redeem, as the provider keeps it on disk; its slot follows from it
    (the training key of ``coordinator`` and the receipt's training, and the receipt's worker)."""

    coordinator: Address
    price_wei: Wei
    receipt: PaymentReceipt


class SavedReceipts(Record):
    receipts: list[SavedReceipt] = Field(default=[], max_length=MAX_RECEIPT_SLOTS)


class ReceiptBook:
    """Receipts by escrow slot, least recently used first; a slot appears once a round was delivered in it,
    so a stranger's receipts for work never done take no room."""

    def __init__(self, max_slots: int = MAX_RECEIPT_SLOTS) -> None:
        self.max_slots = max_slots
        self._slots: OrderedDict[SlotKey, SlotReceipts] = OrderedDict()
        self._changed = asyncio.Condition()  # a receipt kept or settled: tests and tools wait on it

    def delivered(self, key: SlotKey, training_id: str, coordinator: str, round: int, price_wei: int) -> None:
        entry = self._entry(key, training_id, coordinator, price_wei)
        if len(entry.delivered) < MAX_DELIVERED_ROUNDS:  # past it the count saturates, above any limit
            entry.delivered.add(round)

    def restore(self, key: SlotKey, saved: SavedReceipt) -> None:
        """A receipt read back from disk (already checked); its delivered rounds were not kept, so the slot
        counts only the rounds delivered from now on."""
        entry = self._entry(key, saved.receipt.training_id, saved.coordinator, saved.price_wei)
        if entry.receipt is None or saved.receipt.cumulative_wei > entry.receipt.cumulative_wei:
            entry.receipt = saved.receipt

    def saved(self) -> list[SavedReceipt]:
        """What must survive a restart: the receipts still to redeem."""
        return [SavedReceipt(coordinator=entry.coordinator, price_wei=entry.price_wei, receipt=entry.receipt)
                for _, entry in self.unredeemed() if entry.receipt is not None]

    def _entry(self, key: SlotKey, training_id: str, coordinator: str, price_wei: int) -> SlotReceipts:
        entry = self._slots.get(key)
        if entry is None:
            self._trim(self.max_slots - 1)
            entry = self._slots[key] = SlotReceipts(training_id, coordinator, price_wei)
        self._slots.move_to_end(key)
        entry.price_wei = price_wei
        return entry

    def unreceipted(self, key: SlotKey) -> int:
        entry = self._slots.get(key)
        return entry.unreceipted if entry is not None else 0

    def entry(self, key: SlotKey) -> SlotReceipts | None:
        return self._slots.get(key)

    async def keep(self, key: SlotKey, receipt: PaymentReceipt) -> bool:
        """Keep ``receipt`` (already checked) if it owes more than the one held; False when it adds nothing."""
        entry = self._slots.get(key)
        if entry is None or (entry.receipt is not None and receipt.cumulative_wei <= entry.receipt.cumulative_wei):
            return False
        entry.receipt = receipt
        await self._notify()
        return True

    async def settled(self, key: SlotKey, cumulative_wei: int) -> None:
        """Receipts of the slot up to ``cumulative_wei`` need nothing more."""
        entry = self._slots.get(key)
        if entry is not None:
            entry.settled_wei = max(entry.settled_wei, cumulative_wei)
            await self._notify()

    def unredeemed(self) -> list[tuple[SlotKey, SlotReceipts]]:
        return [(key, entry) for key, entry in self._slots.items() if entry.unredeemed]

    def forget(self, key: SlotKey) -> None:
        self._slots.pop(key, None)

    async def wait_for(self, key: SlotKey, *, cumulative_wei: int | None = None, settled_wei: int | None = None,
                       timeout: float) -> SlotReceipts:
        """Until the slot holds a receipt for at least ``cumulative_wei`` and is settled up to ``settled_wei``."""
        def reached() -> bool:
            entry = self._slots.get(key)
            return entry is not None and (
                (cumulative_wei is None or (entry.receipt is not None and entry.receipt.cumulative_wei >= cumulative_wei))
                and (settled_wei is None or entry.settled_wei >= settled_wei))
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(reached)
        return self._slots[key]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _trim(self, size: int) -> None:
        """Down to ``size``: forget the least recently used slots with nothing left to redeem, then any."""
        while len(self._slots) > max(size, 0):
            idle = next((k for k, e in self._slots.items() if not e.unredeemed), None)
            self._slots.pop(idle if idle is not None else next(iter(self._slots)))


async def take_receipt(book: ReceiptBook, chain: ProviderChain, worker: str,
                       verified: Verified[PaymentReceipt]) -> str | None:
    """Keep a receipt from the bus when it is valid; returns why it was ignored, or None.

    Its slot is the sender's training: a slot appears only once this provider delivered a round there, and
    the signature must be the training's coordinator's over this chain, escrow, worker, round and amount.
    """
    receipt = verified.message
    if receipt.worker_id != worker:
        return "for another worker"
    key = (training_key(verified.sender, receipt.training_id), worker)
    entry = book.entry(key)
    if entry is None:
        return "no round delivered in that training"
    if not chain.receipt_ok(receipt, entry.coordinator):
        return "not signed by the training's coordinator"
    return None if await book.keep(key, receipt) else "older than the receipt held"


def restore_receipts(book: ReceiptBook, chain: ProviderChain, worker: str, saved: list[SavedReceipt]) -> int:
    """Put receipts read back from disk into ``book``, each checked as when it came from the bus (for
    ``worker``, signed by its training's coordinator on this chain and escrow); returns how many were kept."""
    kept = 0
    for record in saved:
        receipt = record.receipt
        if receipt.worker_id != worker or not chain.receipt_ok(receipt, record.coordinator):
            log.warning("a saved receipt of training %s is not valid here; dropped", receipt.training_id)
            continue
        book.restore((training_key(record.coordinator, receipt.training_id), worker), record)
        kept += 1
    return kept


class ReceiptFile:
    """The receipts still to redeem, in one JSON file replaced whole (temp file, then ``os.replace``), so a
    crash leaves the old list or the new one. An unreadable file is logged and read as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[SavedReceipt]:
        try:
            with self.path.open("rb") as file:
                data = file.read(MAX_RECEIPTS_FILE_BYTES + 1)
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("saved receipts in %s not read: %s", self.path, exc)
            return []
        if len(data) > MAX_RECEIPTS_FILE_BYTES:
            log.warning("saved receipts in %s exceed %d bytes; not read", self.path, MAX_RECEIPTS_FILE_BYTES)
            return []
        try:
            return SavedReceipts.model_validate_json(data).receipts
        except ValidationError as exc:
            log.warning("saved receipts in %s are not valid: %s", self.path, exc)
            return []

    def save(self, receipts: list[SavedReceipt]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(self.path.name + ".tmp")
        with temp.open("w") as file:
            file.write(SavedReceipts(receipts=receipts).model_dump_json())
            file.flush()
            os.fsync(file.fileno())  # on disk before it replaces the old list: money rides on it
        os.replace(temp, self.path)


async def redeem_due(book: ReceiptBook, chain: ProviderChain, account: LocalAccount) -> list[str]:
    """Redeem every held receipt that :func:`redemption_verdict` says is due, one slot at a time, refunding
    an overdue training first; returns the transaction hashes. A slot whose chain read, refund or redemption
    fails (another sender may have refunded first) is logged and tried on the next sweep."""
    sent = []
    for key, entry in book.unredeemed():
        receipt = entry.receipt
        assert receipt is not None
        try:
            verdict = redemption_verdict(receipt, await chain.slot_view(*key))
            if verdict == "refund":  # closed now, the slot's unpaid part is held for the receipt
                sent.append(await chain.refund(account, key[0]))
                log.info("refunded training %s, open past its deadline and grace period", receipt.training_id)
                verdict = redemption_verdict(receipt, await chain.slot_view(*key))
            if verdict == "redeem":
                sent.append(await chain.redeem(account, key[0], receipt))
                log.info("redeemed %d wei in total for round %d of training %s", receipt.cumulative_wei,
                         receipt.round, receipt.training_id)
            if verdict in ("redeem", "settled"):
                await book.settled(key, receipt.cumulative_wei)
        except AitbcError as exc:
            log.warning("receipt of training %s not redeemed: %s", receipt.training_id, exc)
    return sent


class ProviderReceipts:
    """The provider's receipts on its serving loops: what the node calls, one line each.

    Without a chain (a provider that accepts no contract) it keeps nothing and redeems nothing. With a
    ``work_dir`` the receipts still to redeem are saved there (:data:`RECEIPTS_FILE`) and read back here.
    """

    def __init__(self, chain: ProviderChain | None, account: LocalAccount, limit: int,
                 book: ReceiptBook | None = None, *, work_dir: Path | None = None) -> None:
        self.chain = chain
        self.account = account
        self.limit = limit  # the offer's max_unreceipted_rounds
        self.book = book or ReceiptBook()
        self.file = ReceiptFile(work_dir / RECEIPTS_FILE) if work_dir is not None else None
        self._redeeming = asyncio.Lock()  # one pass at a time: sweeps can overlap on a slow chain
        self._saving = asyncio.Lock()  # one writer of the file at a time, each with the latest list
        self._saved: list[SavedReceipt] = []
        if self.file is not None and chain is not None:  # a small file, read once as the provider starts
            self._saved = self.file.load()
            restore_receipts(self.book, chain, account.address, self._saved)

    def delivered(self, training_key: bytes, training_id: str, coordinator: str, round: int, price_wei: int) -> None:
        """A result of ``round`` went out in that training: it counts as unreceipted until a receipt pays for it."""
        self.book.delivered((training_key, self.account.address), training_id, coordinator, round, price_wei)

    def refusal(self, training_key: bytes) -> str | None:
        """Why a job in that training is refused for lack of receipts, or None."""
        return unreceipted_refusal(self.book.unreceipted((training_key, self.account.address)), self.limit)

    async def take(self, verified: Verified[PaymentReceipt]) -> str | None:
        """Keep a receipt from the bus when valid; returns why it was ignored, or None."""
        if self.chain is None:
            return "no chain to check it against"
        ignored = await take_receipt(self.book, self.chain, self.account.address, verified)
        if ignored is None:
            await self.save()
        return ignored

    async def redeem(self, *, timeout: float = REDEEM_S) -> None:
        """Redeem what is due (the sweep), within ``timeout``; never at shutdown, where the training may
        still be open and its coordinator still paying."""
        if self.chain is None or not self.book.unredeemed() or self._redeeming.locked():
            return
        try:
            async with self._redeeming, asyncio.timeout(timeout):
                await redeem_due(self.book, self.chain, self.account)
        except TimeoutError:
            log.warning("redeeming receipts took over %.0f s; the rest waits for the next sweep", timeout)
        finally:
            await self.save()

    async def save(self) -> None:
        """Write the receipts still to redeem when they changed; a failed write is logged (they stay in memory)."""
        if self.file is None:
            return
        async with self._saving:
            receipts = self.book.saved()
            if receipts == self._saved:
                return
            try:
                await asyncio.to_thread(self.file.save, receipts)
                self._saved = receipts
            except OSError as exc:
                log.warning("receipts not saved to %s: %s", self.file.path, exc)
