"""The provider node on the bus: advertise an offer, accept contracts, run jobs in a separate process.

``flow.provider_daemon`` runs one as a process; a job's records and files are in ``provider.jobs``.

Long because: one agent answers nine topics of the market (proposals, jobs, cancels, pings,
re-sends, challenges, verifications, hardware checks, receipts) over state they share (the running jobs and the
contracts); what is not about serving lives beside it (``intake``, ``book``, ``holdings``, ``kept``,
``receipts``, ``inputs``, ``tasks``, ``process``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount

from ..errors import AitbcError
from ..messaging import Bus, SignedChannel, Verified, topics
from ..records import (
    ContractProposal, ContractReply, Hardware, Heartbeat, JobAssignment, JobCancel, JobResult, Offer, Ping, Pong,
    HardwareChallenge, PaymentReceipt, Progress, ResendRequest, TrajectoryChallenge, TrajectoryOpening,
    VerifyReport, VerifyRequest, declared_parameters, id_path,
)
from ..storage import ContentStore
from ._book import ContractBook, contract_key
from ._cache import ContentCache
from ._config import ProviderConfig
from ._hardware import detect_hardware
from ._hardware_answer import HardwareAnswers
from ._intake import (
    MAX_JOBS_PER_CONTRACT, MAX_JOBS_PER_SLOT, ContractVerdicts, disk_free, fit_refusal, job_size_problem,
    proposal_refusal, queue_problem,
)
from ._jobs import ActiveJob, EpochReporter, HeldJob, Server, TrainOutcome, epoch_fields, job_progress
from ._inputs import JobInputs
from ._holdings import CHAIN_READ_S, TrainingHoldings
from ._kept import KeptJob, KeptResults
from ._onchain import ProviderChain
from ._owners import JobIdLedger, TrainingOwner
from ._pins import TrainingPins
from ._process import CHECKPOINT_FILE, TrainingProcess
from ._recompute import recompute_kept_job
from ._receipts import ProviderReceipts
from ._slots import TrainingSlots, plan_slots
from ._tasks import ProviderTasks
from ._verifier import MAX_WAITING_VERIFICATIONS, Reexecuted, reexecute_for, remove_dir

__all__ = ["MAX_JOBS_PER_CONTRACT", "MAX_JOBS_PER_SLOT", "EpochReporter", "ProviderAgent", "ProviderConfig",
           "TrainOutcome"]

MAX_JOB_HISTORY = 256  # latest progress kept per job (status.json); older jobs are forgotten

log = logging.getLogger(__name__)


class ProviderAgent:
    """``async with ProviderAgent(...)`` serves the market until the block exits."""

    def __init__(self, account: LocalAccount, bus: Bus, store: ContentStore, config: ProviderConfig,
                 *, hardware: Hardware | None = None, chain: ProviderChain | None = None) -> None:
        self.account = account  # signs results (slashing evidence); the channel signs envelopes
        # The escrow it checks every contract against; without one it accepts no contract.
        self.chain = chain
        self._verdicts = ContractVerdicts(chain)
        self.channel = SignedChannel(bus, account)
        self.store = store
        self.config = config
        self.hardware = hardware
        self.training: TrainingSlots | None = None  # built once the hardware is known (__aenter__)
        # Everything kept per training is keyed by its on-chain identity (TrainingOwner), and per job by
        # (that identity, job id): an id string is anybody's to reuse.
        self.tasks = ProviderTasks(config.tasks, store, config.work_dir / "task-state")
        self.inputs = JobInputs(store, ContentCache(config.cache_dir or config.work_dir / "cache", config.cache_bytes),
                                self.tasks, bytes(account.key))  # the job directory goes; the cache keeps inputs
        self._job_process: dict[tuple[str, str], TrainingProcess] = {}  # running job -> the slot's process it holds
        self._contracts = ContractBook(config.contract_limits, forget=self._verdicts.forget)
        self._busy = 0
        self._set_to_work = asyncio.Event()  # wakes the idle advertise loop: a job or verification came in
        self._tasks: list[asyncio.Task[None]] = []
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._active_jobs: dict[tuple[str, str], ActiveJob] = {}  # queued or running, until the result is out
        # Jobs their coordinator cancelled: only active jobs get one, and it goes with the job.
        self._cancel_reasons: dict[tuple[str, str], str] = {}
        self.job_ids = JobIdLedger()  # a job id is used once per training
        # Delivered checkpoints (for re-sends) and boundary states (for spot checks), until the training closes.
        self.pins = TrainingPins(store)  # what it adds for a training: results, openings, verifiers' ends
        self.kept = KeptResults(config.work_dir / "kept", self.pins, max_bytes=config.kept_bytes)
        self.holdings = TrainingHoldings(self.tasks, self.kept, self.job_ids, self._contracts,  # until it closes
                                         self.pins)
        self.hardware_answers = HardwareAnswers(self.channel, store, lambda: self.hardware)  # at hiring
        # The coordinator's signed payment receipts: kept, counted against its jobs, redeemed when it does not pay.
        self.receipts = ProviderReceipts(chain, account, config.max_unreceipted_rounds, work_dir=config.work_dir)
        self.completed_jobs = 0
        self.verifications = 0  # segments re-executed for another worker's coordinator, reported
        self._verifying = 0  # running or waiting
        # The latest progress of the last MAX_JOB_HISTORY jobs, by (training key, job id).
        self.jobs: OrderedDict[tuple[str, str], Progress] = OrderedDict()
        self.dropped: Counter[str] = Counter()  # messages handled and dropped, by "loop: reason"

    @property
    def address(self) -> str:
        return self.channel.address

    @property
    def active_job_ids(self) -> frozenset[str]:
        """Jobs queued or running whose result is not out yet: the ones a cancel can still stop."""
        return frozenset(job_id for _, job_id in self._active_jobs)

    def progress(self, job_id: str) -> Progress | None:
        """The latest progress of a job of that id (of any training: for status views and tests)."""
        return next((p for (_, j), p in reversed(self.jobs.items()) if j == job_id), None)

    @property
    def at_work(self) -> bool:
        """Holding a job (queued for a slot, or running) or a verification: only then does it heartbeat, so
        a coordinator whose job waits behind another still hears it."""
        return bool(self._active_jobs or self._busy or self._verifying)

    @property
    def slots(self) -> int:
        gpus = len(self.hardware.gpus) if self.hardware is not None else 0
        return self.config.slots or max(gpus, 1)

    @property
    def process(self) -> TrainingProcess:  # the first slot's
        assert self.training is not None, "the provider is not started"
        return self.training.processes[0]

    def offer(self) -> Offer:
        assert self.hardware is not None
        hardware = self.hardware.model_copy(update={"disk_free_bytes": disk_free(self.config.work_dir)})
        return Offer(provider=self.address, price_wei=self.config.price_wei, hardware=hardware,
                     slots=self.slots, free_slots=max(self.slots - self._busy, 0), tasks=self.config.tasks,
                     max_unreceipted_rounds=self.config.max_unreceipted_rounds)

    def offer_metadata(self) -> str:
        """What the registry's metadata hash commits to: the price and hardware, canonical JSON."""
        assert self.hardware is not None
        return json.dumps({"price_wei": self.config.price_wei, "slots": self.slots,
                           "hardware": self.hardware.model_dump(mode="json")}, sort_keys=True, separators=(",", ":"))

    async def __aenter__(self) -> ProviderAgent:
        if self.hardware is None:
            self.hardware = await asyncio.to_thread(detect_hardware)
        plans = plan_slots(self.slots, self.hardware, self.config.worker_threads)
        await self.inputs.open()  # first: a cache dir the sandbox hides must exist when it starts
        self.training = TrainingSlots(self.config.work_dir, plans, self.config.sandbox)
        if self.config.warm_start:
            await self.training.start()
        self._track(asyncio.create_task(self.hardware_answers.warm_up()))  # CUDA ready before a challenge
        servers = (Server("negotiations", topics.negotiate, ContractProposal, self._answer),
                   Server("jobs", topics.jobs, JobAssignment, self._take_job),
                   Server("cancels", topics.cancel, JobCancel, self._cancel),
                   Server("pings", topics.ping, Ping, self._answer_ping),
                   Server("resends", topics.resend, ResendRequest, self._resend),
                   Server("challenges", topics.challenge, TrajectoryChallenge, self._open_trajectory),
                   Server("verifications", topics.verify, VerifyRequest, self._verify),
                   Server("hwchecks", topics.hardware_check, HardwareChallenge, self.hardware_answers),
                   Server("receipts", topics.receipts, PaymentReceipt, self._take_receipt))
        ready = [asyncio.Event() for _ in servers]
        self._tasks = [asyncio.create_task(self._serve(server, event)) for server, event in zip(servers, ready)]
        await asyncio.gather(*(e.wait() for e in ready))
        # Advertise only once we can answer, so no proposal is lost.
        await self.channel.publish(topics.offer(self.address), self.offer(), retain=True)
        self._tasks.append(asyncio.create_task(self._advertise()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(AitbcError):
            await self.channel.clear_retained(topics.offer(self.address))
        for task in [*self._tasks, *self._job_tasks]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._job_tasks, return_exceptions=True)
        await self.inputs.close()
        if self.training is not None:
            await self.training.stop()

    async def _advertise(self) -> None:
        last_offer = time.monotonic()
        while True:
            if self.at_work:
                await asyncio.sleep(self.config.heartbeat_interval_s)
            else:  # idle: nothing to say until the offer is due or work comes in (then a first beat at once)
                self._set_to_work.clear()
                due = self.config.offer_refresh_s - (time.monotonic() - last_offer)
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the inner result when work comes
                # in as the daemon is cancelled, and the cancel is lost (a shutdown then hung in gather).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(due, 0.0)):
                        await self._set_to_work.wait()
            # Only a provider at work beats, for the coordinators that wait on it: an idle one's presence is
            # its retained offer, which its last will clears (docs/scale.md, "Presence").
            if self.at_work:
                beat = Heartbeat(provider=self.address, sent_at=time.time(), busy_jobs=self._busy)
                with contextlib.suppress(AitbcError):  # a failed beat is not the last one
                    await self.channel.publish(topics.heartbeat(self.address), beat)
            if time.monotonic() - last_offer >= self.config.offer_refresh_s:
                await self._advertise_now()
                if self.chain is not None:  # off this loop: a slow chain must not delay a heartbeat
                    self._track(asyncio.create_task(self._sweep()))
                    self._track(asyncio.create_task(self.receipts.redeem()))  # closed or overdue trainings
                last_offer = time.monotonic()

    async def _advertise_now(self) -> None:
        """Re-publish the retained offer so its free slots match what this daemon is doing now."""
        with contextlib.suppress(AitbcError):
            await self.channel.publish(topics.offer(self.address), self.offer(), retain=True)

    async def _each(self, loop: str, handle: Callable[[Verified[Any]], Awaitable[None] | None],
                    verified: Verified[Any]) -> None:
        """Handle one message; whatever it raises is logged, counted and dropped, so the loop goes on.
        (Messages that fail their signature or validation never get here: ``channel.verifier.dropped``.)"""
        try:
            outcome = handle(verified)
            if outcome is not None:
                await outcome
        except Exception as exc:  # no message, however malformed, may end a serving loop
            self.dropped[f"{loop}: {type(exc).__name__}"] += 1
            log.warning("%s: message from %s dropped: %s", loop, verified.sender, exc)

    async def _serve(self, server: Server, ready: asyncio.Event) -> None:
        async with self.channel.subscribe(server.topic(self.address), server.record) as messages:
            ready.set()
            async for verified in messages:
                await self._each(server.name, server.handle, verified)

    async def _answer(self, verified: Verified[ContractProposal]) -> None:
        proposal = verified.message
        if verified.sender != proposal.coordinator:
            return  # someone proposing on another coordinator's behalf
        refusal = (proposal_refusal(proposal, has_chain=self.chain is not None, ask_wei=self.config.price_wei)
                   or fit_refusal(proposal, self.hardware, self.config.work_dir)
                   or await self.tasks.refusal(proposal.task))
        if refusal is None and self.chain is not None:
            # Agreeing is free, so it only takes a place in the bounded, rate-limited unfunded pool.
            refusal = self._contracts.admit(proposal)
            if refusal is None:
                await self._contracts.trim(self._funded_on_chain)
        if refusal is not None or self.chain is None:
            self.dropped["negotiations: declined"] += 1
            reply = ContractReply(contract_id=proposal.contract_id, accepted=False, reason=refusal)
        else:
            # No work is done until the chain shows the slot funded (checked before the first job).
            # The consent lets the escrow give it that slot.
            reply = ContractReply(contract_id=proposal.contract_id, accepted=True,
                                  consent=self.chain.consent(self.account, proposal))
        await self.channel.publish(topics.negotiate_reply(proposal.coordinator, proposal.contract_id), reply)

    async def _funded_on_chain(self, proposal: ContractProposal) -> bool:
        assert self.chain is not None
        with contextlib.suppress(AitbcError, TimeoutError):
            async with asyncio.timeout(CHAIN_READ_S):
                return await self.chain.check(proposal, self.address) is None
        return False

    async def _take_job(self, verified: Verified[JobAssignment]) -> None:
        job = verified.message
        owner = TrainingOwner(verified.sender, job.training_id)  # the only training this sender can name
        key = contract_key(verified.sender, job.contract_id)
        contract = self._contracts.get(key)
        if contract is None:
            return await self._refuse(owner, job, f"no contract {job.contract_id} from {verified.sender} "
                                                  "(never agreed, or forgotten before its slot was funded)")
        if job.training_id != contract.training_id:  # the chain backs the contract's training only
            return await self._refuse(owner, job, f"the job names training {job.training_id}, "
                                                  f"not its contract's {contract.training_id}")
        problem = ("the job's task is not the contract's" if job.task != contract.task
                   else job_size_problem(job, contract, self.hardware)
                   or await self._verdicts.problem(contract, self.address)) or self._contracts.fund(key) \
            or self.receipts.refusal(owner.key)
        if problem is not None:
            return await self._refuse(owner, job, problem)
        held = HeldJob(job, owner, contract)
        if held.key in self._active_jobs:
            log.warning("job %s is already queued or running; duplicate dropped", job.job_id)
            self.dropped["jobs: duplicate"] += 1
            return
        id_path(self.config.work_dir / "jobs", job.job_id)  # refuse an id that is a path before it is queued
        active = (contract_key(a.held.contract.coordinator, a.job.contract_id) for a in self._active_jobs.values())
        if (problem := queue_problem(key, active, self.slots)) is not None:
            self.dropped["jobs: queue full"] += 1
            return await self._refuse(owner, job, problem)
        if not self.job_ids.claim(owner, job.job_id):  # kept results and challenges name jobs by id
            return await self._refuse(owner, job, f"job id {job.job_id} was already used in this training")
        self._start_job(held)

    def _start_job(self, held: HeldJob) -> None:
        if self._busy >= self.slots:  # it waits for a slot: its inputs can download meanwhile
            self.inputs.prefetch(held.job)
        task = asyncio.create_task(self._run_job(held))
        self._active_jobs[held.key] = ActiveJob(held, task)
        self._set_to_work.set()
        self._track(task)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)

    async def _refuse(self, owner: TrainingOwner, job: JobAssignment, problem: str) -> None:
        """A job dropped for any reason gets a signed refusal, so its coordinator replaces the worker at once."""
        log.warning("job %s refused: %s", job.job_id, problem)
        self.dropped["jobs: refused"] += 1
        with contextlib.suppress(AitbcError):
            await self._report(owner, job, "failed", error=f"refused: {problem}")

    def _held_of(self, job: JobAssignment) -> HeldJob:
        """The running job whose record ``job`` is (the object itself: two trainings' jobs may be equal)."""
        return next(a.held for a in self._active_jobs.values() if a.job is job)

    def _cancel(self, verified: Verified[JobCancel]) -> None:
        request = verified.message
        owner = TrainingOwner(verified.sender, request.training_id)  # a sender cancels its own jobs only
        active = self._active_jobs.get((owner.hex, request.job_id))
        if active is None:  # unknown, another coordinator's, or already finished: nothing to stop
            if request.job_id in self.active_job_ids:
                log.warning("cancel of job %s from %s, who does not own its training, ignored",
                            request.job_id, verified.sender)
            return
        self._cancel_reasons[active.held.key] = request.reason
        # A queued job never runs; a running one stops (TrainingProcess.train kills its process).
        active.task.cancel()

    async def _take_receipt(self, verified: Verified[PaymentReceipt]) -> None:
        if (ignored := await self.receipts.take(verified)) is not None:
            self.dropped[f"receipts: {ignored}"] += 1

    async def _answer_ping(self, verified: Verified[Ping]) -> None:
        nonce = verified.message.nonce  # an Id: it names one topic level and reaches into no other
        with contextlib.suppress(AitbcError):
            await self.channel.publish(topics.pong(verified.sender, nonce),
                                       Pong(nonce=nonce, busy_jobs=self._busy))

    async def _resend(self, verified: Verified[ResendRequest]) -> None:
        request = verified.message
        kept = self.kept.get(TrainingOwner(verified.sender, request.training_id), request.job_id)
        if kept is None or not kept.outcome.checkpoint.is_file():
            return  # not this sender's job, or not kept (any more)
        log.info("re-sending the checkpoint of %s: %s", request.job_id, request.reason)
        contract = self._contracts.get(contract_key(verified.sender, kept.job.contract_id))
        if contract is None:
            return  # the training closed on chain: nothing is owed for it any more
        cid = await self.upload_checkpoint(kept.owner, kept.job, kept.outcome.checkpoint)
        await self._publish_result(HeldJob(kept.job, kept.owner, contract), cid, kept.outcome)

    async def _open_trajectory(self, verified: Verified[TrajectoryChallenge]) -> None:
        """A spot check: upload the boundary states around the segments the job's coordinator names."""
        request = verified.message
        kept = self.kept.get(TrainingOwner(verified.sender, request.training_id), request.job_id)
        if kept is None:
            return  # only the job's coordinator may ask, for a job of its training this provider still holds
        job = kept.job
        opening = TrajectoryOpening(job_id=job.job_id, training_id=job.training_id, worker_id=self.address,
                                    round=job.round, states=await self.kept.open(kept, request, self._recompute))
        await self.channel.publish(topics.openings(job.training_id), opening)

    def _verify(self, verified: Verified[VerifyRequest]) -> None:
        """Verification work, from a coordinator this provider holds a contract with, for that training only."""
        request = verified.message
        job = request.job
        contract = self._contracts.get(contract_key(verified.sender, job.contract_id))
        if contract is None or job.training_id != contract.training_id or job.worker_id != self.address:
            self.dropped["verifications: no contract of the sender for it"] += 1
            return
        if job.task != contract.task or job_size_problem(job, contract, self.hardware) is not None:
            self.dropped["verifications: the job is not its contract's"] += 1
            return
        if self._verifying > MAX_WAITING_VERIFICATIONS:
            # Its coordinator holds a contract with us: say so at once rather than let it wait out the deadline.
            self.dropped["verifications: too many waiting"] += 1
            busy = VerifyReport(request_id=request.request_id, training_id=job.training_id, verifier_id=self.address,
                                round=job.round, segment=request.segment,
                                problem=f"busy: {self._verifying} verifications waiting here")
            self._track(asyncio.create_task(self._publish_quietly(topics.verified(job.training_id), busy)))
            return
        self._verifying += 1
        self._set_to_work.set()
        self._track(asyncio.create_task(self._run_verification(TrainingOwner(verified.sender, job.training_id),
                                                               request, contract)))

    async def _publish_quietly(self, topic: str, message: VerifyReport) -> None:
        with contextlib.suppress(AitbcError):
            await self.channel.publish(topic, message)

    async def _run_verification(self, owner: TrainingOwner, request: VerifyRequest, contract: ContractProposal) -> None:
        job = request.job
        job_dir = id_path(id_path(self.config.work_dir / "verify", owner.hex), request.request_id)
        report = VerifyReport(request_id=request.request_id, training_id=job.training_id, verifier_id=self.address,
                              round=job.round, segment=request.segment, problem="not re-executed")
        try:
            async with asyncio.timeout(request.deadline_s):
                assert self.training is not None
                async with self.training.slot() as process:
                    found = await self.verify_segment(process, owner, request, job_dir)
                if found.end is None:
                    report = report.model_copy(update={"problem": found.problem})
                else:
                    cid = await self.pins.add(owner, found.end)
                    report = VerifyReport(
                        request_id=request.request_id, training_id=job.training_id, verifier_id=self.address,
                        round=job.round, segment=request.segment, end_cid=cid, state_hash=found.state_hash,
                        model_hash=found.model_hash, signature=self.sign_checkpoint(job, cid, contract),
                        trace=found.trace)
        except (AitbcError, TimeoutError) as exc:
            log.warning("verification %s failed: %s", request.request_id, exc)
            report = report.model_copy(update={"problem": f"could not re-execute: {str(exc)[:200]}"})
        finally:
            self._verifying -= 1
            await asyncio.shield(asyncio.to_thread(remove_dir, job_dir))
            self.inputs.release(owner, job)
        self.verifications += report.problem is None
        with contextlib.suppress(AitbcError):
            await self.channel.publish(topics.verified(job.training_id), report)

    async def _recompute(self, kept: KeptJob, boundaries: tuple[int, ...], into: Path) -> None:
        """Boundary states the job did not keep, recomputed in a training slot (``recompute``)."""
        assert self.training is not None
        async with self.training.slot() as process:
            await recompute_kept_job(process, self.inputs, kept, boundaries, into)

    async def _report(self, owner: TrainingOwner, job: JobAssignment, status: str, **fields: Any) -> None:
        progress = job_progress(job, self.address, status, **fields)
        key = (owner.hex, job.job_id)
        self.jobs[key] = progress
        self.jobs.move_to_end(key)
        while len(self.jobs) > MAX_JOB_HISTORY:
            self.jobs.popitem(last=False)
        await self.channel.publish(topics.progress(job.training_id, job.job_id), progress)

    async def _run_job(self, held: HeldJob) -> None:
        job = held.job
        try:
            assert self.training is not None
            async with self.training.slot() as process:
                self._job_process[held.key] = process
                try:
                    await self._run_in_slot(held)
                finally:
                    self._job_process.pop(held.key, None)
        except asyncio.CancelledError:
            reason = self._cancel_reasons.get(held.key)
            if reason is None:
                raise  # the daemon is shutting down, not a coordinator's cancel
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            log.info("job %s cancelled by its coordinator: %s", job.job_id, reason)
            last = self.jobs.get(held.key)
            await self._report(held.owner, job, "cancelled", epoch=last.epoch if last else 0)
        finally:
            self._cancel_reasons.pop(held.key, None)
            self._forget(held)

    def _forget(self, held: HeldJob) -> None:
        """From here on a cancel is a no-op: the job's outcome is decided."""
        active = self._active_jobs.get(held.key)
        if active is not None and active.task is asyncio.current_task():
            del self._active_jobs[held.key]

    async def _run_in_slot(self, held: HeldJob) -> None:
        job, owner = held.job, held.owner
        # Removed at the end: it must be ours, and no other training's job of the same id may share it.
        job_dir = id_path(id_path(self.config.work_dir / "jobs", owner.hex), job.job_id)
        self._busy += 1
        await self._advertise_now()
        try:
            await self._report(owner, job, "running")
            await self.inputs.fetch(owner, job, job_dir)
            speed: list[float] = []

            async def on_epoch(event: dict[str, Any]) -> None:
                speed.append(event["samples_per_s"])
                await self._report(owner, job, "running", **epoch_fields(event))

            outcome = await self.train_job(job, job_dir, on_epoch)
            await self.tasks.keep(owner, job, job_dir)
            checkpoint_cid = await self.upload_checkpoint(owner, job, outcome.checkpoint)
            # Kept until the training closes: a checkpoint the coordinator could not fetch can be re-sent,
            # and a spot check opens the boundary states.
            kept = await self.kept.keep(owner, job, job_dir, outcome)
            await self._publish_result(held, checkpoint_cid, kept.outcome)
            self.receipts.delivered(owner.key, owner.training_id, owner.coordinator, job.round,  # unreceipted so far
                                    held.contract.price_wei)
            self._forget(held)  # the result is out: too late to cancel
            await self._report(owner, job, "complete", epoch=job.config.epochs, loss=outcome.loss,
                               samples_per_s=speed[-1] if speed else None)
            self.completed_jobs += 1
        except AitbcError as exc:
            log.error("job %s failed: %s", job.job_id, exc)
            await self._report(owner, job, "failed", error=str(exc))
        except Exception as exc:  # a bug, or input nothing above anticipated: still tell the coordinator
            log.exception("job %s failed unexpectedly", job.job_id)
            await self._report(owner, job, "failed", error=f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self._forget(held)  # so no cancel interrupts the clean-up below
            self._busy -= 1
            # Shielded: a daemon shutting down during the clean-up still removes the job's files (the
            # thread runs to its end); the leases it would then not release go with the cache's close.
            await asyncio.shield(asyncio.to_thread(_remove_job_dir, job_dir))
            self.inputs.release(owner, job)  # its cache entries are no longer linked: evictable again
            await self._advertise_now()

    async def _publish_result(self, held: HeldJob, checkpoint_cid: str, outcome: TrainOutcome) -> None:
        job = held.job
        await self.channel.publish(topics.results(job.training_id), JobResult(
            job_id=job.job_id, training_id=job.training_id, worker_id=self.address, round=job.round,
            checkpoint_cid=checkpoint_cid, samples=outcome.samples, loss=outcome.loss,
            train_seconds=outcome.seconds, signature=self.sign_checkpoint(job, checkpoint_cid, held.contract),
            task_state=outcome.task_state))

    async def _sweep(self) -> None:
        """Let go of what trainings the chain shows closed left here."""
        assert self.chain is not None
        chain = self.chain
        await self.holdings.sweep(lambda owner: chain.closed(owner.training_id, owner.coordinator),
                                  busy={a.held.owner for a in self._active_jobs.values()})

    # --- the steps of a job; subclasses (e.g. the chaos tests' Byzantine providers) override one

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        """Train in the training process on the inputs in ``job_dir``; the checkpoint lands there too."""
        held = self._held_of(job)
        process = self._job_process.get(held.key) or self.process
        # The process's owner is the training's on-chain identity: another coordinator's training of the
        # same id string gets a process of its own.
        done = await process.train(job_dir, job_id=job.job_id, model=job.model, config=job.config, seed=job.seed,
                                   on_epoch=on_epoch, owner=held.owner.hex, task=job.task,
                                   update_encoding=job.update_encoding, worker=self.address,
                                   max_parameters=declared_parameters(job.footprint))
        return TrainOutcome(checkpoint=job_dir / CHECKPOINT_FILE, samples=int(done["samples"]),
                            loss=float(done["loss"]), seconds=float(done["seconds"]),
                            task_state=done.get("task_state"))

    async def verify_segment(self, process: TrainingProcess, owner: TrainingOwner, request: VerifyRequest,
                             job_dir: Path) -> Reexecuted:
        """As a verifier: re-execute the requested segment in ``process``; its end state lands in ``job_dir``."""
        return await reexecute_for(process, self.inputs, self.store, owner, request, job_dir)

    async def upload_checkpoint(self, owner: TrainingOwner, job: JobAssignment, checkpoint: Path) -> str:
        """Store the checkpoint, pinned until the training closes; the returned CID is the one the result
        announces."""
        return await self.pins.add(owner, checkpoint)

    def sign_checkpoint(self, job: JobAssignment, cid: str, contract: ContractProposal) -> str:
        """``0x``-hex ``sign_result`` over (chain, registry, training, round, CID): slashing evidence."""
        assert self.chain is not None  # no job runs without a contract the chain backs
        return self.chain.sign_result(self.account, contract, job.round, cid)


def _remove_job_dir(job_dir: Path) -> None:
    """The job's directory, and its training's parent directory once that holds no other job."""
    shutil.rmtree(job_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        job_dir.parent.rmdir()
