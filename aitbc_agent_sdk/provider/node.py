"""The provider node on the bus: advertise an offer, accept contracts, run jobs in a separate process.

``provider.daemon`` runs one as a process; a job's records and files are in ``provider.jobs``.
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
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount

from ..errors import AitbcError
from ..messaging import Bus, SignedChannel, Verified, topics
from ..models import (
    ContractProposal, ContractReply, Hardware, Heartbeat, JobAssignment, JobCancel, JobResult, Offer, Ping, Pong,
    HardwareChallenge, Progress, ResendRequest, TrajectoryChallenge, TrajectoryOpening, id_path,
)
from ..storage import ContentStore
from .book import ContractBook
from .cache import ContentCache
from .config import ProviderConfig
from .hardware import detect_hardware
from .hardware_answer import HardwareAnswers
from .intake import MAX_JOBS_PER_CONTRACT, MAX_JOBS_PER_SLOT, ContractVerdicts, proposal_refusal, queue_problem
from .jobs import ActiveJob, EpochReporter, Server, TrainOutcome, epoch_fields, job_progress, remember, write_file
from .inputs import JobInputs
from .onchain import ProviderChain
from .process import CHECKPOINT_FILE, TrainingProcess
from .slots import TrainingSlots, plan_slots
from .tasks import ProviderTasks
from .trajectories import KeptTrajectories

__all__ = ["MAX_JOBS_PER_CONTRACT", "MAX_JOBS_PER_SLOT", "EpochReporter", "ProviderAgent", "ProviderConfig",
           "TrainOutcome"]

MAX_CONTRACTS = 1024  # accepted contracts remembered; past it, idle and then least recently used ones go
CONTRACT_IDLE_S = 24 * 3600.0  # a contract without a job for a day is forgotten first
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
        self.tasks = ProviderTasks(config.tasks, store, config.work_dir / "task-state",
                                   lambda job: self._contracts[job.contract_id].coordinator)
        self.inputs = JobInputs(store, ContentCache(config.cache_dir or config.work_dir / "cache", config.cache_bytes),
                                self.tasks, bytes(account.key))  # the job directory goes; the cache keeps inputs
        self._job_process: dict[str, TrainingProcess] = {}  # running job -> the slot's process it holds
        self._contracts: MutableMapping[str, ContractProposal] = ContractBook(
            MAX_CONTRACTS, CONTRACT_IDLE_S, pinned=self._contract_in_use,
            forget=self._verdicts.forget)
        self._busy = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._active_jobs: dict[str, ActiveJob] = {}  # queued or running, until the result is out
        # Jobs their coordinator cancelled, by job id: only active jobs get one, and it goes with the job.
        self._cancel_reasons: dict[str, str] = {}
        self._delivered: OrderedDict[str, tuple[JobAssignment, TrainOutcome, bytes]] = OrderedDict()
        self.trajectories = KeptTrajectories(config.work_dir / "trajectories", store)  # for spot checks
        self.hardware_answers = HardwareAnswers(self.channel, store, lambda: self.hardware)  # at hiring
        self.completed_jobs = 0
        self.jobs: OrderedDict[str, Progress] = OrderedDict()  # latest progress of the last MAX_JOB_HISTORY jobs
        self.dropped: Counter[str] = Counter()  # messages handled and dropped, by "loop: reason"

    @property
    def address(self) -> str:
        return self.channel.address

    def _contract_in_use(self, contract_id: str) -> bool:
        return (any(a.job.contract_id == contract_id for a in self._active_jobs.values())
                or any(job.contract_id == contract_id for job, _, _ in self._delivered.values()))

    @property
    def active_job_ids(self) -> frozenset[str]:
        """Jobs queued or running whose result is not out yet: the ones a cancel can still stop."""
        return frozenset(self._active_jobs)

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
        return Offer(provider=self.address, price_wei=self.config.price_wei, hardware=self.hardware,
                     slots=self.slots, free_slots=max(self.slots - self._busy, 0), tasks=self.config.tasks)

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
        await self.training.start()
        self._track(asyncio.create_task(self.hardware_answers.warm_up()))  # CUDA ready before a challenge
        servers = (Server("negotiations", topics.negotiate, ContractProposal, self._answer),
                   Server("jobs", topics.jobs, JobAssignment, self._take_job),
                   Server("cancels", topics.cancel, JobCancel, self._cancel),
                   Server("pings", topics.ping, Ping, self._answer_ping),
                   Server("resends", topics.resend, ResendRequest, self._resend),
                   Server("challenges", topics.challenge, TrajectoryChallenge, self._open_trajectory),
                   Server("hwchecks", topics.hardware_check, HardwareChallenge, self.hardware_answers))
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
            await asyncio.sleep(self.config.heartbeat_interval_s)
            beat = Heartbeat(provider=self.address, sent_at=time.time(), busy_jobs=self._busy)
            with contextlib.suppress(AitbcError):  # a failed beat is not the last one
                await self.channel.publish(topics.heartbeat(self.address), beat)
            if time.monotonic() - last_offer >= self.config.offer_refresh_s:
                await self._advertise_now()
                if self.chain is not None:  # off this loop: a slow chain must not delay a heartbeat
                    self._track(asyncio.create_task(self.tasks.sweep(self.chain.closed)))
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
                   or await self.tasks.refusal(proposal.task))
        if refusal is not None or self.chain is None:
            reply = ContractReply(contract_id=proposal.contract_id, accepted=False, reason=refusal)
        else:
            # No work is done until the chain shows the slot funded (checked before the first job).
            # The consent lets the escrow give it that slot.
            self._contracts[proposal.contract_id] = proposal
            reply = ContractReply(contract_id=proposal.contract_id, accepted=True,
                                  consent=self.chain.consent(self.account, proposal))
        await self.channel.publish(topics.negotiate_reply(proposal.coordinator, proposal.contract_id), reply)

    async def _take_job(self, verified: Verified[JobAssignment]) -> None:
        contract = self._contracts.get(verified.message.contract_id)
        if contract is None or contract.coordinator != verified.sender:
            log.warning("job %s without a contract from its sender dropped", verified.message.job_id)
            return
        if verified.message.training_id != contract.training_id:  # the chain backs the contract's training only
            log.warning("job %s names training %s, not its contract's %s: dropped", verified.message.job_id,
                        verified.message.training_id, contract.training_id)
            self.dropped["jobs: wrong training"] += 1
            return
        problem = ("the job's task is not the contract's" if verified.message.task != contract.task
                   else await self._verdicts.problem(contract, self.address))
        if problem is not None:
            log.warning("job %s refused: %s", verified.message.job_id, problem)
            with contextlib.suppress(AitbcError):
                await self._report(verified.message, "failed", error=f"refused: {problem}")
            return
        self._start_job(verified.message)

    def _start_job(self, job: JobAssignment) -> None:
        if job.job_id in self._active_jobs:
            log.warning("job %s is already queued or running; duplicate dropped", job.job_id)
            return
        id_path(self.config.work_dir / "jobs", job.job_id)  # refuse an id that is a path before it is queued
        if (problem := queue_problem(job, (a.job for a in self._active_jobs.values()), self.slots)) is not None:
            self.dropped["jobs: queue full"] += 1
            log.warning("job %s refused: %s", job.job_id, problem)
            self._track(asyncio.create_task(self._refuse(job, problem)))
            return
        if self._busy >= self.slots:  # it waits for a slot: its inputs can download meanwhile
            self.inputs.prefetch(job)
        task = asyncio.create_task(self._run_job(job))
        self._active_jobs[job.job_id] = ActiveJob(job, task)
        self._track(task)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)

    async def _refuse(self, job: JobAssignment, problem: str) -> None:
        with contextlib.suppress(AitbcError):
            await self._report(job, "failed", error=f"refused: {problem}")

    def _cancel(self, verified: Verified[JobCancel]) -> None:
        request = verified.message
        active = self._active_jobs.get(request.job_id)
        if active is None or active.job.training_id != request.training_id:
            return  # unknown, or already finished: nothing to stop
        contract = self._contracts.get(active.job.contract_id)
        if contract is None or contract.coordinator != verified.sender:
            log.warning("cancel of job %s from %s, who does not own its contract, ignored",
                        request.job_id, verified.sender)
            return
        self._cancel_reasons[request.job_id] = request.reason
        # A queued job never runs; a running one stops (TrainingProcess.train kills its process).
        active.task.cancel()

    async def _answer_ping(self, verified: Verified[Ping]) -> None:
        nonce = verified.message.nonce  # an Id: it names one topic level and reaches into no other
        with contextlib.suppress(AitbcError):
            await self.channel.publish(topics.pong(verified.sender, nonce),
                                       Pong(nonce=nonce, busy_jobs=self._busy))

    async def _resend(self, verified: Verified[ResendRequest]) -> None:
        request = verified.message
        found = self._delivered.get(request.job_id)
        if found is None or found[0].training_id != request.training_id:
            return
        job, outcome, checkpoint = found
        contract = self._contracts.get(job.contract_id)
        if contract is None or contract.coordinator != verified.sender:
            return  # only the job's coordinator may ask
        log.info("re-sending the checkpoint of %s: %s", job.job_id, request.reason)
        resend_dir = id_path(self.config.work_dir / "resend", job.job_id)
        path = resend_dir / CHECKPOINT_FILE
        await asyncio.to_thread(write_file, path, checkpoint)
        try:
            cid = await self.upload_checkpoint(job, path)
            await self._publish_result(job, cid, dataclasses.replace(outcome, checkpoint=path))
        finally:
            await asyncio.to_thread(shutil.rmtree, resend_dir, True)

    async def _open_trajectory(self, verified: Verified[TrajectoryChallenge]) -> None:
        """A spot check: upload the boundary states around the segments the job's coordinator names."""
        request = verified.message
        job = self.trajectories.job(request.job_id)
        contract = self._contracts.get(job.contract_id) if job is not None else None
        if job is None or contract is None or contract.coordinator != verified.sender \
                or job.training_id != request.training_id:
            return  # only the job's coordinator may ask, for a job this provider still holds
        opening = TrajectoryOpening(job_id=job.job_id, training_id=job.training_id, worker_id=self.address,
                                    round=job.round, states=await self.trajectories.open(request))
        await self.channel.publish(topics.openings(job.training_id), opening)

    async def _report(self, job: JobAssignment, status: str, **fields: Any) -> None:
        progress = job_progress(job, self.address, status, **fields)
        self.jobs[job.job_id] = progress
        self.jobs.move_to_end(job.job_id)
        while len(self.jobs) > MAX_JOB_HISTORY:
            self.jobs.popitem(last=False)
        await self.channel.publish(topics.progress(job.training_id, job.job_id), progress)

    async def _run_job(self, job: JobAssignment) -> None:
        try:
            assert self.training is not None
            async with self.training.slot() as process:
                self._job_process[job.job_id] = process
                try:
                    await self._run_in_slot(job)
                finally:
                    self._job_process.pop(job.job_id, None)
        except asyncio.CancelledError:
            reason = self._cancel_reasons.get(job.job_id)
            if reason is None:
                raise  # the daemon is shutting down, not a coordinator's cancel
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            log.info("job %s cancelled by its coordinator: %s", job.job_id, reason)
            last = self.jobs.get(job.job_id)
            await self._report(job, "cancelled", epoch=last.epoch if last else 0)
        finally:
            self._cancel_reasons.pop(job.job_id, None)
            self._forget(job)

    def _forget(self, job: JobAssignment) -> None:
        """From here on a cancel is a no-op: the job's outcome is decided."""
        active = self._active_jobs.get(job.job_id)
        if active is not None and active.task is asyncio.current_task():  # not a later job reusing the id
            del self._active_jobs[job.job_id]

    async def _run_in_slot(self, job: JobAssignment) -> None:
        job_dir = id_path(self.config.work_dir / "jobs", job.job_id)  # removed at the end: it must be ours
        self._busy += 1
        await self._advertise_now()
        try:
            await self._report(job, "running")
            await self.inputs.fetch(job, job_dir)
            speed: list[float] = []

            async def on_epoch(event: dict[str, Any]) -> None:
                speed.append(event["samples_per_s"])
                await self._report(job, "running", **epoch_fields(event))

            outcome = await self.train_job(job, job_dir, on_epoch)
            await self.tasks.keep(job, job_dir)
            await self.trajectories.keep(job, job_dir)
            checkpoint_cid = await self.upload_checkpoint(job, outcome.checkpoint)
            # Kept (the last few), so a checkpoint the coordinator could not fetch can be re-sent.
            remember(self._delivered, job, outcome, await asyncio.to_thread(outcome.checkpoint.read_bytes))
            await self._publish_result(job, checkpoint_cid, outcome)
            self._forget(job)  # the result is out: too late to cancel
            await self._report(job, "complete", epoch=job.config.epochs, loss=outcome.loss,
                               samples_per_s=speed[-1] if speed else None)
            self.completed_jobs += 1
        except AitbcError as exc:
            log.error("job %s failed: %s", job.job_id, exc)
            await self._report(job, "failed", error=str(exc))
        except Exception as exc:  # a bug, or input nothing above anticipated: still tell the coordinator
            log.exception("job %s failed unexpectedly", job.job_id)
            await self._report(job, "failed", error=f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self._forget(job)  # so no cancel interrupts the clean-up below
            self._busy -= 1
            await self._advertise_now()
            await asyncio.to_thread(shutil.rmtree, job_dir, True)
            self.inputs.release(job)  # its cache entries are no longer linked: evictable again

    async def _publish_result(self, job: JobAssignment, checkpoint_cid: str, outcome: TrainOutcome) -> None:
        await self.channel.publish(topics.results(job.training_id), JobResult(
            job_id=job.job_id, training_id=job.training_id, worker_id=self.address, round=job.round,
            checkpoint_cid=checkpoint_cid, samples=outcome.samples, loss=outcome.loss,
            train_seconds=outcome.seconds, signature=self.sign_checkpoint(job, checkpoint_cid),
            task_state=outcome.task_state))

    # --- the steps of a job; subclasses (e.g. the chaos tests' Byzantine providers) override one

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        """Train in the training process on the inputs in ``job_dir``; the checkpoint lands there too."""
        process = self._job_process.get(job.job_id) or self.process
        done = await process.train(job_dir, job_id=job.job_id, model=job.model, config=job.config, seed=job.seed,
                                   on_epoch=on_epoch, owner=job.training_id, task=job.task,
                                   update_encoding=job.update_encoding, worker=self.address)
        return TrainOutcome(checkpoint=job_dir / CHECKPOINT_FILE, samples=int(done["samples"]),
                            loss=float(done["loss"]), seconds=float(done["seconds"]),
                            task_state=done.get("task_state"))

    async def upload_checkpoint(self, job: JobAssignment, checkpoint: Path) -> str:
        """Store the checkpoint; the returned CID is the one the result announces."""
        return await self.store.add(checkpoint)

    def sign_checkpoint(self, job: JobAssignment, cid: str) -> str:
        """``0x``-hex ``sign_result`` over (chain, registry, training, round, CID): slashing evidence."""
        assert self.chain is not None  # no job runs without a contract the chain backs
        return self.chain.sign_result(self.account, self._contracts[job.contract_id], job.round, cid)
