"""One federated round that finishes although workers crash, stall or cheat.

Each shard has a slot: the worker holding its escrow slot, the jobs running on the shard
(the holder's, and a spare's speculative duplicate) and, once one arrives, the winning
result, which is verified alone, then against the round (its norm), then by a spot check. The loop below reads results and failures as they come, checks liveness and
stragglers between them, and ends when every shard has a verified result. A failed or
rejected holder is replaced (``reassign``); the replacement retrains the same shard with the
same seed, so a recovered round computes what a clean one would have.
"""

from __future__ import annotations

import asyncio
import random
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from ...errors import InsufficientFundsError, NotEnoughWorkersError, TrainingError
from ...messaging import SignedChannel
from ...records import CheckpointRef, JobAssignment, Progress, TrainingPhase, TrainingRecord, WorkerContract
from ...storage import ContentStore
from ...aggregate._strategies import strategy_for_round
from ..checks._arrival import Arrival, arrival_checks, check_arrival
from ..checks._market_verification import MarketVerifiers
from ..checks._spot_check import SpotChecker, boundary_limit
from ..data._datasets import DatasetStore
from .._listener import TrainingListener
from ..money._money import EscrowSteps
from ..money._receipts import ReceiptIssuer
from ..money._settlement import EscrowAccount
from .._training_db import TrainingDatabase
from ._deadlines import job_deadline, job_work
from ._health import confirmed_stragglers
from ..data._inputs import RoundInputs, new_job
from ._liveness import LivenessWatch
from .._logbook import AuditSink
from ._reassign import Reassigner
from ._round_model import decoded, outer_step
from ._resends import ResendRequests
from ._results import fold
from ._round_slots import ShardSlot, SlotPhase
from ._round_work import RoundWork
from ._round_times import RoundTimes
from ._stats import RoundStats
from ..checks._verification import Inspection, judge_norms, round_median

log = logging.getLogger(__name__)
P = TrainingPhase
TICK_S = 0.25


@dataclass(frozen=True)
class RoundPorts:
    """What a round reads and writes, and nothing more: the training's records, the content store, the bus
    (its jobs out, its listener in), the escrow and the payments made from it. The market comes in as one
    call that hires a spare; the coordinator itself never does."""

    db: TrainingDatabase
    store: ContentStore
    data: DatasetStore
    channel: SignedChannel
    listener: TrainingListener
    escrow: EscrowAccount
    money: EscrowSteps
    receipts: ReceiptIssuer
    round_times: RoundTimes
    spot_check_turn: asyncio.Semaphore
    publish_job: Callable[[JobAssignment], Awaitable[None]]  # saved, its dataset key attached, then sent
    update_phase: Callable[[str, TrainingPhase], Awaitable[TrainingRecord]]
    hire_spare: Callable[[Collection[str]], Awaitable[WorkerContract]]  # a provider not among those given


class RoundRunner:
    """One round, from its inputs (read once by the caller) to its aggregated model and stats, over the
    ports it is handed; reassignment and the audit log are handed in too."""

    def __init__(self, ports: RoundPorts, inputs: RoundInputs, liveness: LivenessWatch, unusable: set[str],
                 *, audit: AuditSink, reassign: Reassigner) -> None:
        self.ports = ports
        self.inputs = inputs
        self.tid = inputs.training_id
        self.round = inputs.round
        self.policy = inputs.policy
        self.baseline = inputs.baseline
        self.audit = audit
        self.reassign = reassign
        self.liveness = liveness
        self.slots: dict[int, ShardSlot] = {}
        self.unusable = unusable  # spares that failed or cheated, shared across the training's rounds
        self.median_norm: float | None = None
        self.resends = ResendRequests(training_id=self.tid, round=self.round, timeout_s=self.policy.resend_timeout_s,
                                      channel=ports.channel, db=ports.db, audit=audit)
        self.decode = decoded(inputs.record.spec.upload_encoding, inputs.baseline.reference)
        self.market: MarketVerifiers | None = None  # the round's verifiers, when its checks may go to them
        self.bytes_sent = self.bytes_received = 0  # the model out to jobs, results in from workers
        self.first_published: dict[str, str] = {}  # checkpoint CID -> the job whose result named it first

    # -- the round, top to bottom ----------------------------------------------------------
    async def run(self, timeout: float) -> RoundStats:
        for contract in self.inputs.contracts:
            assert contract.shard_index is not None
            self.slots[contract.shard_index] = ShardSlot(self.inputs.shards[contract.shard_index], contract)
        self.listener = self.ports.listener
        self.market = self._verifiers()
        checker = SpotChecker(self.inputs, self.audit, db=self.ports.db, store=self.ports.store, data=self.ports.data,
                              channel=self.ports.channel, listener=self.listener, round_times=self.ports.round_times,
                              turn=self.ports.spot_check_turn, market=self.market)
        self.work = await asyncio.to_thread(RoundWork, self.inputs, data=self.ports.data, checker=checker)
        self.checks = arrival_checks(self.ports.escrow, self.inputs, self.work, self.first_published)
        self.started = time.monotonic()
        for slot in self.slots.values():
            await self._dispatch(slot, slot.contract)
        await self.ports.update_phase(self.tid, P.TRAINING)
        try:
            async with asyncio.timeout(timeout):
                while not all(s.phase is SlotPhase.ACCEPTED for s in self.slots.values()):
                    await self._next_events()
                    await self._check_resends()
                    await self._check_liveness()
                    await self._check_stragglers()
                    await self._judge_norms()
                    await self._collect_spot_checks()
        finally:
            await self.work.close()
        return await self._aggregate()

    async def _dispatch(self, slot: ShardSlot, contract: WorkerContract) -> None:
        """Send ``contract``'s worker the slot's job: built from the round's inputs, no reads."""
        inputs = self.inputs
        delta_cid = inputs.record.model_delta_cid
        job = new_job(inputs.record, contract, slot.shard, inputs.model, inputs.record.spec.job,
                      shard_bytes=inputs.sizes[slot.shard.cid], weights_bytes=inputs.sizes[inputs.model_cid],
                      delta_bytes=inputs.sizes.get(delta_cid) if delta_cid else None)
        await self.ports.publish_job(job)
        # What the worker fetches: the model's change when it holds last round's model, else the model.
        held = job.weights_delta is not None and contract.worker_id in inputs.holders_of_base
        self.bytes_sent += job.weights_delta.delta_bytes if held and job.weights_delta else job.weights_bytes
        slot.jobs[job.job_id] = job
        slot.sent_at[job.job_id] = time.monotonic()

    # -- events ----------------------------------------------------------------------------
    async def _next_events(self) -> None:
        try:
            item = await asyncio.wait_for(self.listener.results.get(), TICK_S)
        except TimeoutError:
            return
        await self._handle(item)
        while not self.listener.results.empty():
            await self._handle(self.listener.results.get_nowait())

    def _slot_of(self, job_id: str) -> ShardSlot | None:
        return next((s for s in self.slots.values() if job_id in s.jobs), None)

    def _awaits_result(self, job_id: str) -> bool:
        slot = self._slot_of(job_id)
        return slot is not None and slot.waiting

    async def _handle(self, item: CheckpointRef | Progress) -> None:
        if isinstance(item, CheckpointRef):  # in arrival order: the queue's
            self.first_published.setdefault(item.cid, item.job_id)
        slot = self._slot_of(item.job_id)
        if slot is None or not slot.waiting:
            return  # a cancelled job, an earlier round, or the loser of a speculative race
        if isinstance(item, Progress):
            await self.audit.append("job_failed", worker=item.worker_id, job_id=item.job_id,
                                    round=self.round, reason=item.error)
            await self._drop_worker(slot, item.worker_id, f"its job failed: {item.error}")
            return
        self.resends.answered(item.job_id)
        inspection = await self._inspect(slot, item)
        if inspection.problem is not None:
            if not inspection.fetched and self.resends.may_ask(item.job_id):  # asked once at most
                await self.resends.ask(item, inspection)
                return
            await self._reject(slot, item, inspection)
            return
        took = time.monotonic() - slot.sent_at[item.job_id]
        slot.receive(inspection, item, took)
        await self.ports.round_times.record(self.tid, item.worker_id, took)
        for job in list(slot.jobs.values()):
            if job.job_id != item.job_id:
                await self._cancel(slot, job, "another copy of this shard's job finished first")
        if item.worker_id != slot.holder:
            await self._replace(slot, item.worker_id, "straggler: its speculative duplicate finished first")
        if self.median_norm is not None:
            await self._judge_norms()

    async def _inspect(self, slot: ShardSlot, ref: CheckpointRef) -> Inspection:
        """Fetch and decode the result, then run the round's checks on arrival (:mod:`._arrival`)."""
        try:
            async with asyncio.timeout(self.policy.fetch_timeout_s):
                blob = await self.ports.store.cat(ref.cid, max_bytes=self.inputs.checkpoint_limit)
        except Exception as exc:  # a timeout, a missing block or a block that fails its hash: same verdict
            why = "not retrievable" if isinstance(exc, TimeoutError) else f"not intact ({exc})"
            return Inspection(ref.job_id, ref.worker_id, ref.cid, f"checkpoint {ref.cid} is {why}", fetched=False)
        self.bytes_received += len(blob)
        try:
            state = await asyncio.to_thread(self.decode, blob)
        except TrainingError as exc:  # intact, but not what the job asked for: a bad result, never a crashed round
            return Inspection(ref.job_id, ref.worker_id, ref.cid, f"checkpoint {ref.cid} is malformed: {exc}")
        arrival = Arrival(ref, slot.jobs[ref.job_id], slot.shard, blob, state, frozenset(slot.jobs))
        return await check_arrival(self.checks, arrival)

    async def _reject(self, slot: ShardSlot, ref: CheckpointRef, inspection: Inspection) -> None:
        assert inspection.problem is not None
        await self.ports.db.save_checkpoint(ref, "rejected")
        await self.audit.append("result_rejected", worker=ref.worker_id, job_id=ref.job_id, cid=ref.cid,
                                round=self.round, reason=inspection.problem, slashable=inspection.slashable)
        if inspection.slashable and ref.signature:
            await self.reassign.slash(ref.worker_id, ref.cid, ref.signature, ref.round)
        await self._drop_worker(slot, ref.worker_id, f"result rejected: {inspection.problem}")

    async def _check_resends(self) -> None:
        for ref, late in self.resends.overdue(time.monotonic(), self._awaits_result):
            slot = self._slot_of(ref.job_id)
            assert slot is not None  # it awaits a result
            await self._reject(slot, ref, late)

    # -- health ----------------------------------------------------------------------------
    async def _check_liveness(self) -> None:
        await self.liveness.follow({job.worker_id for slot in self.slots.values() for job in slot.jobs.values()})
        now = time.monotonic()
        for slot in self.slots.values():
            for job in list(slot.jobs.values()):
                if not slot.waiting:
                    break
                worker = job.worker_id
                last = self._last_heard(worker, slot.sent_at[job.job_id])
                if now - last <= self.policy.heartbeat_timeout_s:
                    continue
                if await self.liveness.ping(worker, self.policy.ping_timeout_s):
                    continue
                if self._last_heard(worker, last) > last:  # its beats waited behind this loop's own work
                    continue
                detected = time.monotonic() - last
                await self.audit.append("worker_failed", worker=worker, job_id=job.job_id, round=self.round,
                                        reason="no heartbeat and no pong", silent_s=round(detected, 3),
                                        heartbeat_timeout_s=self.policy.heartbeat_timeout_s)
                await self._drop_worker(slot, worker, f"silent for {detected:.1f}s")

    def _last_heard(self, worker: str, since: float) -> float:
        """When ``worker`` was last heard here (a heartbeat, a pong or any message), or ``since``."""
        return max(self.liveness.last_seen.get(worker, 0.0), self.listener.last_heard.get(worker, 0.0), since)

    async def _check_stragglers(self) -> None:
        now = time.monotonic()
        waiting = [s for s in self.slots.values() if s.waiting and not s.straggling]
        if not waiting:
            return
        late = set(confirmed_stragglers(
            {i: self._progress(s) for i, s in self.slots.items()},
            {i: now - s.sent_at[j.job_id] for i, s in self.slots.items() if (j := s.job_of(s.holder))},
            [s.finished_s for s in self.slots.values() if s.finished_s is not None], self.policy))
        overdue: set[int] = set()  # past the adaptive deadline, not just behind the others
        for index, slot in self.slots.items():
            job = slot.job_of(slot.holder)
            if job is None or not slot.waiting:
                continue
            if now - slot.sent_at[job.job_id] > self._deadline(slot):
                overdue.add(index)
        late |= overdue
        for index in sorted(late):
            slot = self.slots[index]
            if slot.straggling or not slot.waiting:
                continue
            if not slot.reported:
                slot.reported = True
                await self.audit.append("straggler_detected", worker=slot.holder, round=self.round,
                                        progress=self._progress(slot), deadline_s=self._deadline(slot))
            spare = await self._free_spare()
            if spare is None and index in overdue and not slot.market_tried:
                # Past its deadline and no spare free: look for one on the market rather than
                # wait for the round to time out (once per slot and round: discovery takes seconds).
                slot.market_tried = True
                try:
                    spare = await self._new_spare()
                except NotEnoughWorkersError:
                    spare = None
            if spare is None:
                continue  # every spare is busy: try again on a later tick
            try:  # a provider works only in a slot funded on chain, so the copy gets one
                await self.ports.money.fund_spare(self.tid, spare.worker_id)
            except InsufficientFundsError as exc:
                log.warning("no speculative copy for shard %d: %s", index, exc)
                continue
            await self._dispatch(slot, spare)  # the spare's job on the shard: the slot is straggling now
            await self.audit.append("speculative_job", worker=spare.worker_id, straggler=slot.holder,
                                    round=self.round, shard_index=index)

    def _deadline(self, slot: ShardSlot) -> float:
        """The holder's deadline: its own past rounds here, or the shard's work at the assumed speed."""
        work = job_work(slot.shard.samples, self.inputs.record.spec.job.epochs)
        return job_deadline(work, self.ports.round_times.of(self.tid, slot.holder), self.policy)

    def _progress(self, slot: ShardSlot) -> float:
        if not slot.waiting:
            return 100.0
        job = slot.job_of(slot.holder)
        found = self.listener.latest.get(job.job_id) if job else None
        return found.progress if found else 0.0

    # -- replacing workers -----------------------------------------------------------------
    async def _drop_worker(self, slot: ShardSlot, worker: str, reason: str) -> None:
        """``worker`` will not deliver this shard: cancel its job, and replace it if it holds the slot."""
        job = slot.job_of(worker)
        if job is not None:
            del slot.jobs[job.job_id]
            await self.reassign.cancel_job(worker, job.job_id, reason)
        if worker != slot.holder:
            self.unusable.add(worker)  # a spare that failed its speculative job (gone: another may take the copy)
            return
        running_spare = next((j.worker_id for j in slot.jobs.values()), None)
        if running_spare is not None:
            await self._replace(slot, running_spare, reason)
            return
        spare = await self._free_spare() or await self._new_spare()
        await self._replace(slot, spare.worker_id, reason)
        await self._dispatch(slot, slot.contract)

    async def _replace(self, slot: ShardSlot, replacement: str, reason: str) -> None:
        replaced = [c for c in await self.ports.db.contracts(self.tid, "replaced")]
        if len(replaced) >= self.policy.max_replacements:
            raise TrainingError(f"{len(replaced)} workers replaced already; giving up (max_replacements)")
        contracts = {c.worker_id: c for c in await self.ports.db.contracts(self.tid) if c.role != "replaced"}
        old = contracts[slot.holder]
        promoted = await self.reassign.take_over_slot(old, contracts[replacement], reason)
        self.unusable.add(slot.holder)
        slot.contract = promoted
        slot.reported = False  # a new holder, not reported yet

    async def _free_spare(self) -> WorkerContract | None:
        busy = {j.worker_id for s in self.slots.values() for j in s.jobs.values()}
        busy |= {s.holder for s in self.slots.values()}
        for contract in await self.ports.db.contracts(self.tid, "spare"):
            if contract.worker_id not in busy and contract.worker_id not in self.unusable:
                return contract
        return None

    async def _new_spare(self) -> WorkerContract:
        known = {c.worker_id for c in await self.ports.db.contracts(self.tid)}
        contract = await self.ports.hire_spare(known)
        await self.audit.append("spare_hired", worker=contract.worker_id, price_wei=contract.price_wei)
        return contract

    async def _cancel(self, slot: ShardSlot, job: JobAssignment, reason: str) -> None:
        del slot.jobs[job.job_id]
        await self.reassign.cancel_job(job.worker_id, job.job_id, reason)

    def _verifiers(self) -> MarketVerifiers | None:
        """Verifiers hired among the round's workers, when the training's policy may ask for them."""
        if self.policy.verify_on == "coordinator":
            return None
        return MarketVerifiers(db=self.ports.db, store=self.ports.store, channel=self.ports.channel,
                               listener=self.listener, audit=self.audit, slash=self.reassign.slash,
                               timeout_s=self.policy.verify_timeout_s, canary_rate=self.policy.canary_rate,
                               state_limit=boundary_limit(self.inputs.checkpoint_limit), rng=random.SystemRandom(),
                               takes=self.policy.verified_on_market)

    # -- the round's norm check and aggregation --------------------------------------------
    async def _judge_norms(self) -> None:
        winners = {i: s.winner for i, s in self.slots.items()
                   if s.phase is SlotPhase.RECEIVED and s.winner is not None}
        if not winners:
            return
        if self.median_norm is None:
            if len(winners) < len(self.slots):
                return  # the median needs every shard's result
            self.median_norm = round_median([w.norm or 0.0 for w in winners.values()])
            self.work.set_median({w.job_id: w.norm or 0.0 for w in winners.values()})
        judged = judge_norms(winners, self.median_norm, self.policy)
        held = self.work.held([s.winner.job_id for s in self.slots.values() if s.winner is not None])
        for index, verdict in judged.items():
            slot = self.slots[index]
            if verdict.problem is not None:
                await self._reject_winner(slot, verdict)
                continue
            # Too small an update is missing work either way; its spot check says whether the worker also lied.
            slot.short = self.work.lower_bound(verdict.job_id, verdict.norm or 0.0)
            if held and verdict.job_id in held:
                await self.audit.append("held_for_checking", worker=verdict.worker_id, job_id=verdict.job_id,
                                        round=self.round, reason="its update (nearly) equals another's this round")
            settled = self.work.start_check(index, slot.jobs.get(verdict.job_id), slot.shard, verdict.job_id in held)
            if settled is None:
                slot.start_check()
            else:  # checks off (a pass), or nothing to check (unverifiable: fails closed)
                await self._settle_check(slot, settled.problem, settled.slashable)

    async def _collect_spot_checks(self) -> None:
        for index, verdict in self.work.finished():
            slot = self.slots[index]
            if slot.phase is SlotPhase.CHECKING:
                await self._settle_check(slot, verdict.problem, verdict.slashable)

    async def _settle_check(self, slot: ShardSlot, problem: str | None, slashable: bool) -> None:
        """The winner's last word: its spot check's ``problem``, else missing work by the norm, else accepted."""
        found = slot.winner
        assert found is not None
        short, slot.short = slot.short, None
        if problem is None or not slashable:  # a proven lie says most; else the norm's finding, else the check's
            problem, slashable = short or problem, False
        if problem is None:
            slot.accept()
            return
        await self._reject_winner(slot, Inspection(found.job_id, found.worker_id, found.cid, problem,
                                                   slashable=slashable, norm=found.norm))

    async def _reject_winner(self, slot: ShardSlot, verdict: Inspection) -> None:
        """The slot's winner failed a round-level check after all: reject it, and train the shard again."""
        ref = slot.reject()
        await self._reject(slot, ref, verdict)
        await self._ensure_running(slot)

    async def _ensure_running(self, slot: ShardSlot) -> None:
        if not slot.jobs:
            await self._dispatch(slot, slot.contract)

    async def _aggregate(self) -> RoundStats:
        await self.ports.update_phase(self.tid, P.AGGREGATING)
        slots = [self.slots[i] for i in sorted(self.slots)]
        strategy = strategy_for_round(self.inputs.record.spec.aggregation, len(slots), self.baseline.reference)
        strategy.begin()
        for slot in slots:
            ref = slot.mark_folded()
            # Weighted by the samples the coordinator put in the shard, not the worker's own claim.
            await fold(self.ports.store, strategy, ref, float(slot.shard.samples),
                       max_bytes=self.inputs.checkpoint_limit, decode=self.decode)
            await self.ports.db.save_checkpoint(ref, "accepted")
        await self.ports.receipts.issue(self.tid, [s.winner_ref.worker_id for s in slots if s.winner_ref])
        if self.market is not None and self.market.trained:  # the round's verifications, paid per check
            prices = {c.worker_id: c.price_wei for c in await self.ports.db.contracts(self.tid)}
            await self.ports.money.pay_verifiers(self.tid, self.market.fees(prices))
        new = await outer_step(self.ports.store, self.inputs.record, self.baseline.reference, strategy)
        seconds = time.monotonic() - self.started
        return RoundStats(
            model_cid=new.model_cid, record_update=new.record_update(self.inputs.model_cid), bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received, seconds=seconds, samples=sum(s.shard.samples for s in slots),
            slowest_s=max(s.winner_ref.train_seconds for s in slots if s.winner_ref),
            worker_seconds={s.holder: s.finished_s or 0.0 for s in slots},
            worker_samples={s.holder: s.shard.samples for s in slots})
