"""Hiring spares, replacing failed workers in their escrow slot, and slashing signed bad results.

Payment policy (docs/contracts.md): a worker's escrow slot is all or nothing for that worker.
A worker that is replaced (crashed, silent, rejected, or beaten by its speculative duplicate)
forfeits the slot, including rounds it already delivered; the replacement takes the slot over
and earns its own price per round it delivers, capped at what the slot holds. A spare whose
speculative duplicate loses the race is cancelled and paid nothing for it. Whatever nobody
earned is refunded to the coordinator when the training closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from ...chain import SlashEvidence
from ...chain._registry import RegistryClient
from ...errors import AitbcError, ContractRevertError, MessagingError, NotEnoughWorkersError
from ...messaging import SignedChannel, topics
from ...records import (
    UNCONFIRMED_CLASS, ChainIntent, JobCancel, TaskRef, TrainingSpec, Worker, WorkerContract, new_id,
)
from ...records._base import clipped
from .._logbook import AuditSink
from ..money._settlement import EscrowAccount
from .._training_db import TrainingDatabase

log = logging.getLogger(__name__)


class Hiring(Protocol):
    """The market as hiring needs it: offers that fit, ranked, and a contract agreed over the bus; with
    why the latest discovery passed offers over. The Coordinator is one."""

    hardware_flags: Mapping[str, str]  # provider -> why the hardware challenge flagged its offer

    async def discover(self, *, min_gpu: str | None = None, max_price_wei: int | None = None,
                       include_busy: bool = False, task: TaskRef | None = None,
                       min_stake_wei: int | None = None, fit: TrainingSpec | None = None) -> list[Worker]: ...

    def select(self, workers: Sequence[Worker], count: int) -> list[Worker]: ...

    async def negotiate(self, worker_id: str, training_id: str, price_wei: int, *, role: str = "worker",
                        shard_index: int | None = None, rounds: int | None = None,
                        device_class: str = UNCONFIRMED_CLASS) -> WorkerContract: ...

    def stake_note(self, requested_wei: int | None = None) -> str: ...


async def hire(market: Hiring, audit: AuditSink, training_id: str, workers: Sequence[Worker],
               spares: Sequence[Worker] = ()) -> list[WorkerContract]:
    """Contract ``workers`` (one shard each, in order) and ``spares`` (unfunded until they replace someone).

    The offers the latest discovery flagged (the hardware challenge) go into the training's audit log
    first, with whether one was hired anyway (nothing else was there)."""
    hiring = {w.worker_id for w in (*workers, *spares)}
    for worker_id, reason in market.hardware_flags.items():
        await audit.append("hardware_flagged", worker=worker_id, reason=reason, hired=worker_id in hiring)
    contracts = []
    for index, worker in enumerate(workers):
        contracts.append(await market.negotiate(worker.worker_id, training_id, worker.price,
                                                role="worker", shard_index=index,
                                                device_class=worker.device_class))
    for spare in spares:
        try:
            contracts.append(await market.negotiate(spare.worker_id, training_id, spare.price, role="spare",
                                                    device_class=spare.device_class))
        except MessagingError as exc:  # a spare is a bonus: hire the others anyway
            log.warning("spare %s not hired: %s", spare.worker_id, exc)
    return contracts


REPLACEMENT_ASKS_AT_ONCE = 8  # a candidate that never answers costs a reply timeout: ask several together


async def new_replacement(market: Hiring, spec: TrainingSpec, training_id: str, exclude: Collection[str], *,
                          max_price_wei: int | None) -> WorkerContract:
    """Discover a provider not yet in this training (``spec``) and contract it as a spare.

    Candidates are asked ``REPLACEMENT_ASKS_AT_ONCE`` at a time, in rank order; the best-ranked one that
    agrees is returned as soon as every one ranked above it has answered or timed out, and the asks still
    open are withdrawn. One ranked lower that agreed first stays a spare of the training, used first at
    the next replacement. On a market where many have just gone, one reply timeout is paid per wave,
    not per candidate."""
    found = [w for w in await market.discover(max_price_wei=max_price_wei, task=spec.task,
                                              min_stake_wei=spec.min_stake_wei, fit=spec)
             if w.worker_id not in exclude]
    ranked = market.select(found, len(found))
    for start in range(0, len(ranked), REPLACEMENT_ASKS_AT_ONCE):
        wave = ranked[start:start + REPLACEMENT_ASKS_AT_ONCE]
        asks = [asyncio.create_task(market.negotiate(w.worker_id, training_id, w.price, role="spare",
                                                     device_class=w.device_class)) for w in wave]
        try:
            for worker, ask in zip(wave, asks):
                try:
                    return await ask
                except MessagingError as exc:
                    log.warning("replacement candidate %s declined: %s", worker.worker_id, exc)
        finally:
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
    raise NotEnoughWorkersError(f"no provider is available to replace a worker in training {training_id}"
                                f"{market.stake_note(spec.min_stake_wei)}")


class Reassigner:
    """One training's slot moves, job cancels and slashes, with its own connections and audit log."""

    def __init__(self, training_id: str, *, channel: SignedChannel, db: TrainingDatabase, escrow: EscrowAccount,
                 audit: AuditSink, registry: RegistryClient | None = None) -> None:
        self.training_id = training_id
        self.channel = channel
        self.db = db
        self.escrow = escrow
        self.audit = audit
        self.registry = registry

    async def take_over_slot(self, old: WorkerContract, new: WorkerContract, reason: str) -> WorkerContract:
        """Move ``old``'s escrow slot to ``new`` on chain, then record the swap; returns new's contract.

        The intent is saved first and the swap is written in one transaction after the chain call,
        so a crash in between leaves a pending intent that :meth:`reconcile` settles.
        """
        tid = self.training_id
        intent = ChainIntent(intent_id=new_id("intent"), training_id=tid, kind="replace",
                             old_contract_id=old.contract_id, new_contract_id=new.contract_id, reason=clipped(reason))
        await self.db.save_intent(intent)
        try:
            tx, added = await self.escrow.replace(tid, old.worker_id, new)
        except ContractRevertError:  # the chain refused it: nothing moved
            await self.db.save_intent(intent.model_copy(update={"status": "failed"}))
            raise
        if added is not None:  # the replacement asked more than the old slot held: it got a slot of its own
            await self.audit.append("spare_funded", worker=new.worker_id, slot_wei=added[0], tx=added[1])
        promoted = _promoted(old, new)
        await self.db.finish_replacement(intent, old.model_copy(update={"role": "replaced"}), promoted)
        await self.audit.append("worker_replaced", worker=old.worker_id, replacement=new.worker_id,
                                shard_index=old.shard_index, reason=reason, tx=tx)
        return promoted

    async def reconcile(self) -> list[ChainIntent]:
        """Settle replacements a crash left half-recorded, from the escrow's WorkerReplaced events.

        Waits first until none of the coordinator's transactions is pending, so a replaceWorker
        still in flight is seen mined (or gone) rather than taken for one that never happened.
        Returns the intents it settled.
        """
        pending = [i for i in await self.db.intents(self.training_id) if i.kind == "replace"]
        if not pending:
            return []
        await self.escrow.sender.wait_settled()
        events = await self.escrow.replacements(self.training_id)
        moved = {(e.args["oldWorker"].lower(), e.args["newWorker"].lower()): e.tx_hash for e in events}
        settled = []
        for intent in pending:
            old = await self.db.contract(intent.old_contract_id)
            new = await self.db.contract(intent.new_contract_id)
            tx = moved.get((old.worker_id.lower(), new.worker_id.lower()))
            if tx is None:
                settled.append(intent.model_copy(update={"status": "failed"}))
                await self.db.save_intent(settled[-1])
                await self.audit.append("replacement_not_on_chain", worker=old.worker_id,
                                        replacement=new.worker_id, reason=intent.reason)
                continue
            await self.db.finish_replacement(intent, old.model_copy(update={"role": "replaced"}), _promoted(old, new))
            settled.append(intent.model_copy(update={"status": "done"}))
            await self.audit.append("worker_replaced", worker=old.worker_id, replacement=new.worker_id,
                                    shard_index=old.shard_index, reason=intent.reason, tx=tx, reconciled=True)
        return settled

    async def cancel_job(self, worker_id: str, job_id: str, reason: str) -> None:
        """Tell a worker its job is no longer wanted; a dead worker simply never hears it."""
        try:
            await self.channel.publish(topics.cancel(worker_id),
                                       JobCancel(job_id=job_id, training_id=self.training_id, reason=clipped(reason)))
        except AitbcError as exc:
            log.warning("cancel of %s not sent: %s", job_id, exc)
        await self.audit.append("job_cancelled", worker=worker_id, job_id=job_id, reason=reason)

    async def slash(self, worker_id: str, cid: str, signature: str, round: int) -> None:
        """Slash the worker's registry bond with its own signed result of ``round`` as evidence (when a
        registry is deployed). Called only for faults provable from that signed content."""
        if self.registry is None:
            return
        try:
            evidence = SlashEvidence(self.escrow.key(self.training_id), worker_id, cid,
                                     bytes.fromhex(signature[2:]), round)
            receipt = await self.registry.slash(self.escrow.sender, evidence)
        except (AitbcError, ValueError) as exc:  # already slashed, no bond: keep training
            await self.audit.append("slash_failed", worker=worker_id, cid=cid, reason=str(exc))
            return
        await self.audit.append("slashed", worker=worker_id, cid=cid, tx=receipt["transactionHash"].to_0x_hex())


def _promoted(old: WorkerContract, new: WorkerContract) -> WorkerContract:
    return new.model_copy(update={"role": "worker", "shard_index": old.shard_index, "ranges": old.ranges,
                                  "shard_id": old.shard_id})
