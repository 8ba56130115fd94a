"""Payment receipts: after each round the coordinator signs, for every worker it accepted, what it owes
that worker in all, and sends it to the worker.

A worker redeems its newest receipt from the escrow by itself, so a customer who interrupts the run or
never releases cannot refund the accepted work (docs/threat-model.md, "Receipts"). Settlement still pays
only what the chain shows unpaid per slot, so a redeemed receipt is never paid twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from ...errors import AitbcError
from ...messaging import SignedChannel, topics
from ...records import CheckpointRef, PaymentReceipt, WorkerContract
from .._logbook import AuditLogs
from ._settlement import EscrowAccount, accepted_earnings
from .._training_db import TrainingDatabase

__all__ = ["ReceiptIssuer", "receipt_terms"]

log = logging.getLogger(__name__)


def receipt_terms(contract: WorkerContract, accepted: Sequence[CheckpointRef],
                  slot_amount: int) -> tuple[int, int] | None:
    """(round, cumulative wei) of the worker's receipt: its latest accepted round and all it has earned,
    never more than its slot holds (the escrow refuses more); None before it earned anything."""
    earned = accepted_earnings(contract, accepted, slot_amount)
    if earned is None or earned[0] == 0:
        return None
    return earned[1].round, earned[0]


class ReceiptIssuer:
    """Signs with the coordinator's escrow key and publishes each worker's cumulative receipt."""

    def __init__(self, channel: SignedChannel, db: TrainingDatabase, escrow: EscrowAccount, logs: AuditLogs) -> None:
        self.channel = channel
        self.db = db
        self.escrow = escrow
        self.logs = logs

    async def issue(self, training_id: str, workers: Iterable[str]) -> list[PaymentReceipt]:
        """Send ``workers`` (those a round just accepted) their receipts; a failure is logged, never raised:
        the round's result stands, and the next round's receipt covers this one's rounds too."""
        if self.escrow.escrow is None:  # a coordinator without an escrow (unit tests) owes nothing on chain
            return []
        try:
            return await self._issue(training_id, set(workers))
        except AitbcError as exc:
            log.warning("receipts for training %s not sent: %s", training_id, exc)
            return []

    async def _issue(self, training_id: str, workers: set[str]) -> list[PaymentReceipt]:
        contracts = [c for c in await self.db.contracts(training_id, "worker") if c.worker_id in workers]
        if not contracts:
            return []
        accepted = await self.db.checkpoints(training_id, "accepted")
        slots = await self.escrow.slots_on_chain(training_id, [c.worker_id for c in contracts])
        sent = []
        for contract in contracts:
            terms = receipt_terms(contract, accepted, slots[contract.worker_id][0])
            if terms is None:
                continue
            round, cumulative = terms
            signature = await self.escrow.sign_receipt(training_id, contract.worker_id, round, cumulative)
            receipt = PaymentReceipt(training_id=training_id, worker_id=contract.worker_id, round=round,
                                     cumulative_wei=cumulative, signature="0x" + signature.hex())
            await self.channel.publish(topics.receipts(contract.worker_id), receipt)
            await self.logs.note(training_id, "receipt_sent", worker=contract.worker_id, round=round,
                                 cumulative_wei=cumulative)
            sent.append(receipt)
        return sent
