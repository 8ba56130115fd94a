"""Paying workers: a pure payout plan, then one batched escrow release and a refund."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...chain import (EscrowClient, EscrowEvent, EscrowState, EvidenceDomain, TransactionSender, consent_digest,
                     consent_signer, result_hash, sign_receipt, training_key, training_salt)
from ...errors import ConfigError
from ...records import CheckpointRef, EscrowSummary, Payment, WorkerContract


@dataclass(frozen=True)
class Payout:
    worker_id: str
    contract_id: str
    amount_wei: int
    result_cid: str


@dataclass(frozen=True)
class VerifierFee:
    """What one verification earns its verifier, and the report it is for (its request id)."""

    worker_id: str
    amount_wei: int
    request_id: str


def verification_fee_wei(price_wei: int, steps_trained: int, job_steps: int) -> int:
    """A verifier earns its own per-round price for the share of a job it trained again (rounded up, at
    least 1 wei): a segment of 4 steps of a 64-step job is a sixteenth of a round's pay."""
    if steps_trained < 1 or job_steps < 1 or price_wei < 1:
        raise ValueError(f"no fee for {steps_trained} of {job_steps} steps at {price_wei} wei")
    return -(-price_wei * min(steps_trained, job_steps) // job_steps)


def fees_by_verifier(fees: Sequence[VerifierFee]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for fee in fees:
        totals[fee.worker_id] = totals.get(fee.worker_id, 0) + fee.amount_wei
    return totals


def earned_wei(contract: WorkerContract, accepted_rounds: int) -> int:
    """A worker earns its per-round price for every accepted round, never more than the contract."""
    return contract.price_wei * min(accepted_rounds, contract.rounds)


def plan_payouts(contracts: Sequence[WorkerContract], accepted: Sequence[CheckpointRef],
                 already_paid: Mapping[str, int], *, slot_amounts: Mapping[str, int] | None = None) -> list[Payout]:
    """What is still owed to each worker, tied to its latest accepted checkpoint.

    ``slot_amounts`` caps each worker at its escrow slot: a replacement earns its own price
    per accepted round, but never more than the slot it took over holds.
    """
    payouts = []
    for contract in contracts:
        earned = accepted_earnings(contract, accepted,
                                   None if slot_amounts is None else slot_amounts.get(contract.worker_id, 0))
        if earned is None:
            continue
        due = earned[0] - already_paid.get(contract.worker_id, 0)
        if due > 0:
            payouts.append(Payout(contract.worker_id, contract.contract_id, due, earned[1].cid))
    return payouts


def accepted_earnings(contract: WorkerContract, accepted: Sequence[CheckpointRef],
                      slot_amount: int | None = None) -> tuple[int, CheckpointRef] | None:
    """What the contract's worker has earned in all (capped at ``slot_amount``) and its latest accepted
    checkpoint, or None before its first accepted round. Payouts and payment receipts both use it."""
    mine = [c for c in accepted if c.worker_id == contract.worker_id and c.training_id == contract.training_id]
    if not mine:
        return None
    earned = earned_wei(contract, len({c.round for c in mine}))
    if slot_amount is not None:
        earned = min(earned, slot_amount)
    return earned, max(mine, key=lambda c: c.round)


@dataclass
class EscrowAccount:
    """The coordinator's side of one escrow contract: its signer and the contract client."""

    sender: TransactionSender
    escrow: EscrowClient
    _domain: EvidenceDomain | None = field(default=None, repr=False)

    def key(self, training_id: str) -> bytes:
        """The training's on-chain id: derived from this coordinator's address, so it cannot be squatted."""
        return training_key(self.sender.address, training_id)

    async def evidence_domain(self) -> EvidenceDomain:
        """The chain and registry that workers' result signatures are bound to (read once)."""
        if self._domain is None:
            self._domain = EvidenceDomain(await self.escrow.chain_id(), await self.escrow.registry())
        return self._domain

    async def consent_digest(self, training_id: str, worker: str) -> bytes:
        """What ``worker`` signed to consent to its slot in this training (its public key recovers from it)."""
        domain = await self.evidence_domain()
        return consent_digest(domain.chain_id, self.escrow.address, self.key(training_id), worker)

    async def consent_ok(self, training_id: str, worker: str, consent: str | None) -> bool:
        """Whether ``consent`` is the worker's canonical signature to a slot in this training."""
        if not consent:
            return False
        try:
            raw = bytes.fromhex(consent.removeprefix("0x"))
        except ValueError:
            return False
        domain = await self.evidence_domain()
        signer = consent_signer(domain.chain_id, self.escrow.address, self.key(training_id), worker, raw)
        return signer is not None and signer.lower() == worker.lower()

    async def state(self, training_id: str) -> EscrowState:
        """The training's escrow as the chain holds it (``exists`` False when it was never opened there)."""
        return await self.escrow.training(self.key(training_id))

    async def replacements(self, training_id: str) -> list[EscrowEvent]:
        """Every slot move of the training, oldest first: what the chain says happened to a replacement."""
        return await self.escrow.events(self.key(training_id), names=("WorkerReplaced",))

    async def sign_receipt(self, training_id: str, worker: str, round: int, cumulative_wei: int) -> bytes:
        """The coordinator's redeemable promise that ``worker`` earned ``cumulative_wei`` up to ``round``."""
        domain = await self.evidence_domain()
        return sign_receipt(self.sender.account, domain.chain_id, self.escrow.address, self.key(training_id), worker,
                            round, cumulative_wei)

    async def summary(self, training_id: str) -> EscrowSummary:
        state = await self.escrow.training(self.key(training_id))
        held = await self.escrow.held(self.key(training_id))
        return EscrowSummary(address=self.escrow.address, deposited_wei=state.deposited,
                             paid_wei=state.paid, refunded_wei=state.refunded, held_wei=held.amount,
                             held_until=held.claimable_until if state.closed else None)

    async def paid_on_chain(self, training_id: str, workers: Sequence[str]) -> dict[str, int]:
        return {w: paid for w, (_, paid) in (await self.slots_on_chain(training_id, workers)).items()}

    async def slots_on_chain(self, training_id: str, workers: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(slot amount, paid so far) of each worker, as the escrow records them."""
        key = self.key(training_id)
        slots = {}
        for worker in workers:
            slot = await self.escrow.slot(key, worker)
            slots[worker] = (slot.amount, slot.paid)
        return slots

    async def add_slot(self, training_id: str, contract: WorkerContract, amount_wei: int) -> str:
        """Fund a slot for a worker joining an open training, with its consent; returns the tx hash."""
        receipt = await self.escrow.add_worker(self.sender, self.key(training_id), contract.worker_id, amount_wei,
                                               _consent(contract))
        return receipt["transactionHash"].to_0x_hex()

    async def replace(self, training_id: str, old_worker: str,
                      new: WorkerContract) -> tuple[str, tuple[int, str] | None]:
        """Move ``old_worker``'s unpaid slot to ``new``'s worker, with its consent; returns the tx
        hash, and the wei and tx hash of a slot added for it first (None when none was).

        A provider works only in a slot that holds its price for its rounds, so a replacement
        that asks more than the old slot holds gets its own slot first (``addWorker``); the
        replace then only retires the old one. What it does not earn is refunded on close.
        """
        slots = await self.slots_on_chain(training_id, [old_worker, new.worker_id])
        added = None
        if slots[new.worker_id][0] == 0 and new.price > slots[old_worker][0]:
            added = (new.price, await self.add_slot(training_id, new, new.price))
        receipt = await self.escrow.replace_worker(self.sender, self.key(training_id), old_worker, new.worker_id,
                                                   _consent(new))
        return receipt["transactionHash"].to_0x_hex(), added

    async def drop(self, training_id: str, worker: str) -> str:
        """Take back ``worker``'s unpaid slot (its speculative copy lost); returns the tx hash."""
        receipt = await self.escrow.drop_worker(self.sender, self.key(training_id), worker)
        return receipt["transactionHash"].to_0x_hex()

    async def open(self, training_id: str, contracts: Sequence[WorkerContract], *,
                   deadline: int | None = None) -> str:
        """Fund every contract in native ETH; ``deadline`` (unix time) defaults to one day of chain time."""
        if not contracts:
            raise ConfigError("no worker contracts to fund")
        receipt = await self.escrow.open(self.sender, training_salt(training_id),
                                         [c.worker_id for c in contracts], [c.price for c in contracts],
                                         [_consent(c) for c in contracts], deadline=deadline)
        return receipt["transactionHash"].to_0x_hex()

    async def release(self, training_id: str, payouts: Sequence[Payout]) -> list[Payment]:
        """Pay every payout in one transaction."""
        if not payouts:
            return []
        receipt = await self.escrow.release(
            self.sender, self.key(training_id), [p.worker_id for p in payouts],
            [p.amount_wei for p in payouts], [result_hash(p.result_cid) for p in payouts])
        tx = receipt["transactionHash"].to_0x_hex()
        return [Payment(training_id=training_id, worker_id=p.worker_id, contract_id=p.contract_id,
                        amount_wei=p.amount_wei, tx_hash=tx, result_hash="0x" + result_hash(p.result_cid).hex())
                for p in payouts]

    async def pay_verifiers(self, training_id: str, fees: Sequence[VerifierFee]) -> str:
        """Fund the training's verification budget with exactly what ``fees`` add up to and pay them from
        it, one payment per fee (its evidence the report's request id); returns the paying tx's hash."""
        key = self.key(training_id)
        await self.escrow.fund_verification(self.sender, key, sum(f.amount_wei for f in fees))
        receipt = await self.escrow.pay_verifiers(self.sender, key, [f.worker_id for f in fees],
                                                  [f.amount_wei for f in fees],
                                                  [result_hash(f.request_id) for f in fees])
        return receipt["transactionHash"].to_0x_hex()

    async def refund(self, training_id: str) -> tuple[int, str | None]:
        """Close the training: returns what came back now and the tx hash ((0, None) when already closed).

        What active slots were not paid stays held for their payment receipts until the claim
        window is over (:meth:`summary`'s ``held_wei`` and ``held_until``), then anyone may reclaim it.
        """
        key = self.key(training_id)
        if (await self.escrow.training(key)).closed:
            return 0, None
        receipt = await self.escrow.refund(self.sender, key)
        return (await self.escrow.training(key)).refunded, receipt["transactionHash"].to_0x_hex()


def _consent(contract: WorkerContract) -> bytes:
    if contract.consent is None:
        raise ConfigError(f"worker {contract.worker_id} gave no consent to a slot (contract {contract.contract_id})")
    return bytes.fromhex(contract.consent[2:])
