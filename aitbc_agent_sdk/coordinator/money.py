"""The coordinator's money steps: budget checks, funding the escrow, paying, settling.

A mixin of ``Coordinator`` (service.py), kept apart so each file reads in one sitting.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import ConfigError, InsufficientFundsError, NotFoundError
from ..models import Payment, Settlement, WorkerContract
from .settlement import plan_payouts

if TYPE_CHECKING:
    from .listener import Observer
    from .service import CoordinatorSettings
    from .settlement import EscrowAccount
    from .store import TrainingStore


class MoneySteps:
    db: TrainingStore
    escrow: EscrowAccount
    settings: CoordinatorSettings
    observer: Observer | None

    if TYPE_CHECKING:  # provided by Coordinator
        address: str

        async def audit(self, training_id: str, event: str, **fields: object) -> None: ...

    async def check_budget(self, training_id: str) -> list[WorkerContract]:
        """Raise InsufficientFundsError unless the wallet covers every contract plus gas."""
        contracts = await self.db.contracts(training_id, "worker")
        await self.ensure_funds(sum(c.price for c in contracts), f"{len(contracts)} contracts")
        return contracts

    async def ensure_funds(self, budget_wei: int, what: str) -> None:
        balance = await self.escrow.sender.balance()
        if balance < budget_wei + self.settings.gas_reserve_wei:
            raise InsufficientFundsError(
                f"wallet {self.address} holds {balance} wei; {what} cost {budget_wei} wei plus "
                f"{self.settings.gas_reserve_wei} wei for gas")

    async def fund_escrow(self, training_id: str) -> str:
        """Deposit every contract's full amount in one transaction; returns the tx hash."""
        contracts = await self.check_budget(training_id)
        tx = await self.escrow.open(training_id, contracts)
        await self.audit(training_id, "escrow_funded", tx=tx, deposit_wei=sum(c.price for c in contracts),
                         workers=[c.worker_id for c in contracts])
        await self.db.save_escrow(training_id, await self.escrow.summary(training_id))
        return tx

    async def pay(self, training_id: str, worker_id: str | None = None, *,
                  amount_wei: int | None = None) -> list[Payment]:
        """Release what is owed for accepted work (to one worker, or all) in one transaction.

        Amounts owed are computed against what the chain says was already paid, so paying
        twice is impossible. ``amount_wei`` pays one worker less than it is owed, never more.
        """
        contracts = [c for c in await self.db.contracts(training_id, "worker") if worker_id in (None, c.worker_id)]
        if worker_id is not None and not contracts:
            raise NotFoundError(f"worker {worker_id} has no funded contract in training {training_id}")
        slots = await self.escrow.slots_on_chain(training_id, [c.worker_id for c in contracts])
        payouts = plan_payouts(contracts, await self.db.checkpoints(training_id, "accepted"),
                               {w: paid for w, (_, paid) in slots.items()},
                               slot_amounts={w: amount for w, (amount, _) in slots.items()})
        if amount_wei is not None:
            if worker_id is None or len(payouts) != 1 or amount_wei > payouts[0].amount_wei:
                owed = payouts[0].amount_wei if len(payouts) == 1 else 0
                raise ConfigError(f"cannot pay {amount_wei} wei to {worker_id}: {owed} wei is owed for accepted work")
            payouts = [replace(payouts[0], amount_wei=amount_wei)]
        payments = await self.escrow.release(training_id, payouts)
        for payment in payments:
            await self.db.save_payment(payment)
            await self.audit(training_id, "payment", worker=payment.worker_id, amount_wei=payment.amount_wei,
                             tx=payment.tx_hash, result_hash=payment.result_hash)
            if self.observer is not None:
                self.observer(payment)
        await self.db.save_escrow(training_id, await self.escrow.summary(training_id))
        return payments

    async def settle(self, training_id: str) -> Settlement:
        """Pay every accepted worker in one transaction, then refund what is left."""
        payments = await self.pay(training_id)
        refund_wei, refund_tx = await self.escrow.refund(training_id)
        await self.audit(training_id, "refund", amount_wei=refund_wei, tx=refund_tx)
        summary = await self.escrow.summary(training_id)
        await self.db.save_escrow(training_id, summary)
        return Settlement(training_id=training_id, payments=tuple(payments), refund_wei=refund_wei,
                          refund_tx=refund_tx, escrow=summary)
