"""The coordinator's money steps: budget checks, funding the escrow, paying, settling.

An object the coordinator holds (``coordinator.money``), with its own connections: the
database, the escrow account and the audit logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from ...errors import AitbcError, ConfigError, InsufficientFundsError, NotFoundError
from ...records import Payment, Settlement, WorkerContract
from .._listener import Observer
from .._logbook import AuditLogs
from ._settlement import EscrowAccount, VerifierFee, fees_by_verifier, plan_payouts
from .._training_db import TrainingDatabase


class EscrowSteps:
    def __init__(self, db: TrainingDatabase, escrow: EscrowAccount, logs: AuditLogs, *, gas_reserve_wei: int,
                 observer: Observer | None = None) -> None:
        self.db = db
        self.escrow = escrow
        self.logs = logs
        self.gas_reserve_wei = gas_reserve_wei
        self.observer = observer
        self._pay_lock = asyncio.Lock()

    async def check_budget(self, training_id: str) -> list[WorkerContract]:
        """Raise InsufficientFundsError unless the wallet covers every contract plus gas."""
        contracts = await self.db.contracts(training_id, "worker")
        await self.ensure_funds(sum(c.price for c in contracts), f"{len(contracts)} contracts")
        return contracts

    async def ensure_funds(self, budget_wei: int, what: str) -> None:
        balance = await self.escrow.sender.balance()
        if balance < budget_wei + self.gas_reserve_wei:
            raise InsufficientFundsError(
                f"wallet {self.escrow.sender.address} holds {balance} wei; {what} cost {budget_wei} wei plus "
                f"{self.gas_reserve_wei} wei for gas")

    async def fund_escrow(self, training_id: str) -> str:
        """Deposit every contract's full amount in one transaction; returns the tx hash."""
        contracts = await self.check_budget(training_id)
        tx = await self.escrow.open(training_id, contracts)
        await self.logs.note(training_id, "escrow_funded", tx=tx, deposit_wei=sum(c.price for c in contracts),
                             workers=[c.worker_id for c in contracts])
        await self.db.save_escrow(training_id, await self.escrow.summary(training_id))
        return tx

    async def fund_spare(self, training_id: str, worker_id: str) -> None:
        """Give a spare its own slot, funded at its price, before it runs a speculative copy: a
        provider works only in a slot funded on chain. The slot stays for later copies; unused, it
        is dropped before the refund (:meth:`drop_unused_spares`), so the registry counts no failure."""
        contract = next((c for c in await self.db.contracts(training_id, "spare") if c.worker_id == worker_id), None)
        if contract is None:
            return  # not a spare (already promoted): it holds a slot
        amount, _ = (await self.escrow.slots_on_chain(training_id, [worker_id]))[worker_id]
        if amount:
            return
        await self.ensure_funds(contract.price, f"a slot for spare {worker_id}")
        tx = await self.escrow.add_slot(training_id, contract, contract.price)
        await self.logs.note(training_id, "spare_funded", worker=worker_id, slot_wei=contract.price, tx=tx)

    async def drop_unused_spares(self, training_id: str) -> None:
        """Take back the funded slots of spares that never took over a shard: their copies were not
        wanted, which is no failure of theirs."""
        spares = [c.worker_id for c in await self.db.contracts(training_id, "spare")]
        if not spares or (await self.escrow.state(training_id)).closed:
            return
        for worker_id, (amount, paid) in (await self.escrow.slots_on_chain(training_id, spares)).items():
            if amount and not paid:
                tx = await self.escrow.drop(training_id, worker_id)
                await self.logs.note(training_id, "spare_slot_dropped", worker=worker_id, tx=tx)

    async def pay(self, training_id: str, worker_id: str | None = None, *,
                  amount_wei: int | None = None) -> list[Payment]:
        """Release what is owed for accepted work (to one worker, or all) in one transaction.

        Amounts owed are computed against what the chain says was already paid, once none of
        this coordinator's transactions is pending: a retry while an earlier ``release`` is in
        flight waits for it instead of paying the same rounds again (and a release that never
        landed gave its nonce back, so it cannot be mined after the new one either). Payments
        in one process run one at a time. ``amount_wei`` pays one worker less than it is owed, never more.
        """
        async with self._pay_lock:
            await self.escrow.sender.wait_settled()
            return await self._pay_owed(training_id, worker_id, amount_wei)

    async def _pay_owed(self, training_id: str, worker_id: str | None, amount_wei: int | None) -> list[Payment]:
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
            await self.logs.note(training_id, "payment", worker=payment.worker_id, amount_wei=payment.amount_wei,
                                 tx=payment.tx_hash, result_hash=payment.result_hash)
            if self.observer is not None:
                self.observer(payment)
        await self.db.save_escrow(training_id, await self.escrow.summary(training_id))
        return payments

    async def pay_verifiers(self, training_id: str, fees: Sequence[VerifierFee]) -> str | None:
        """Pay a round's verification fees through the escrow (funded from this wallet as they fall due,
        apart from the deposit); returns the tx hash, None when nothing is owed. A failure is logged and
        the fees stay unpaid: the round's result stands."""
        fees = [f for f in fees if f.amount_wei > 0]
        if not fees or self.escrow.escrow is None:
            return None
        total = sum(f.amount_wei for f in fees)
        async with self._pay_lock:
            try:
                await self.escrow.sender.wait_settled()
                await self.ensure_funds(total, f"{len(fees)} verifications")
                tx = await self.escrow.pay_verifiers(training_id, fees)
            except AitbcError as exc:
                await self.logs.note(training_id, "verifier_fees_unpaid", amount_wei=total, reason=str(exc)[:300])
                return None
        await self.logs.note(training_id, "verifiers_paid", amount_wei=total, tx=tx,
                             verifiers=fees_by_verifier(fees), reports=len(fees))
        await self.db.save_escrow(training_id, await self.escrow.summary(training_id))
        return tx

    async def settle(self, training_id: str) -> Settlement:
        """Pay every accepted worker in one transaction, then refund what is left."""
        payments = await self.pay(training_id)
        await self.drop_unused_spares(training_id)
        refund_wei, refund_tx = await self.escrow.refund(training_id)
        summary = await self.escrow.summary(training_id)
        await self.logs.note(training_id, "refund", amount_wei=refund_wei, tx=refund_tx, held_wei=summary.held_wei,
                             held_until=summary.held_until)
        await self.db.save_escrow(training_id, summary)
        return Settlement(training_id=training_id, payments=tuple(payments), refund_wei=refund_wei,
                          refund_tx=refund_tx, escrow=summary)
