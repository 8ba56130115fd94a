"""The provider daemon: advertise an offer, accept contracts, run jobs in a separate process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import shutil
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, ConfigDict, Field

from ..errors import AitbcError
from ..limits import TEXT_MAX_LENGTH
from ..messaging import Bus, SignedChannel, Verified, topics
from ..models import (
    ContractProposal, ContractReply, Hardware, Heartbeat, JobAssignment, JobCancel, JobResult, Offer, Ping, Pong,
    Progress, ResendRequest, Wei, id_path,
)
from ..storage import ContentStore, fetch_timeout_s
from .book import ContractBook
from .hardware import detect_hardware
from .onchain import ProviderChain
from .process import CHECKPOINT_FILE, SHARD_FILE, WEIGHTS_FILE, TrainingProcess
from .sandbox import TrainingSandbox

DELIVERED_KEPT = 8  # recent checkpoints kept in memory for re-send requests
MAX_CONTRACTS = 1024  # accepted contracts remembered; past it, idle and then least recently used ones go
CONTRACT_IDLE_S = 24 * 3600.0  # a contract without a job for a day is forgotten first
MAX_JOBS_PER_CONTRACT = 4  # queued or running under one contract: one per round, plus a duplicate or two
MAX_JOBS_PER_SLOT = 8  # queued or running in all, per slot; a job beyond either bound is refused at once
MAX_JOB_HISTORY = 256  # latest progress kept per job (status.json); older jobs are forgotten

log = logging.getLogger(__name__)

EpochReporter = Callable[[dict[str, Any]], Awaitable[None]]
"""Called with each ``epoch`` event of the training process; reports progress on the bus."""


@dataclass(frozen=True)
class TrainOutcome:
    """What training a job produced: the checkpoint file and the numbers the result reports."""

    checkpoint: Path
    samples: int
    loss: float
    seconds: float


@dataclass(frozen=True)
class _ActiveJob:
    job: JobAssignment
    task: asyncio.Task[None]


class ProviderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price_wei: Wei
    work_dir: Path
    slots: int = Field(default=1, ge=1)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    offer_refresh_s: float = Field(default=30.0, gt=0)
    worker_threads: int = Field(default=1, ge=1)
    # The training process parses strangers' data: bwrap or refuse to start. None is --no-sandbox.
    sandbox: TrainingSandbox | None = TrainingSandbox()


class ProviderAgent:
    """``async with ProviderAgent(...)`` serves the market until the block exits."""

    def __init__(self, account: LocalAccount, bus: Bus, store: ContentStore, config: ProviderConfig,
                 *, hardware: Hardware | None = None, chain: ProviderChain | None = None) -> None:
        self.account = account  # signs results (slashing evidence); the channel signs envelopes
        # The escrow it checks every contract against; without one it accepts no contract.
        self.chain = chain
        self._verdicts: dict[str, str | None] = {}  # contract id -> why the chain does not back it (None: it does)
        self.channel = SignedChannel(bus, account)
        self.store = store
        self.config = config
        self.hardware = hardware
        self.process = TrainingProcess(config.work_dir, threads=config.worker_threads, sandbox=config.sandbox)
        self._contracts: MutableMapping[str, ContractProposal] = ContractBook(
            MAX_CONTRACTS, CONTRACT_IDLE_S, pinned=self._contract_in_use,
            forget=lambda contract_id: self._verdicts.pop(contract_id, None))
        self._busy = 0
        self._slots = asyncio.Semaphore(config.slots)
        self._tasks: list[asyncio.Task[None]] = []
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._active_jobs: dict[str, _ActiveJob] = {}  # queued or running, until the result is out
        # Jobs their coordinator cancelled, by job id: only active jobs get one, and it goes with the job.
        self._cancel_reasons: dict[str, str] = {}
        self._delivered: OrderedDict[str, tuple[JobAssignment, TrainOutcome, bytes]] = OrderedDict()
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

    def offer(self) -> Offer:
        assert self.hardware is not None
        return Offer(provider=self.address, price_wei=self.config.price_wei, hardware=self.hardware,
                     slots=self.config.slots, free_slots=max(self.config.slots - self._busy, 0))

    def offer_metadata(self) -> str:
        """What the registry's metadata hash commits to: the price and hardware, canonical JSON."""
        assert self.hardware is not None
        return json.dumps({"price_wei": self.config.price_wei, "slots": self.config.slots,
                           "hardware": self.hardware.model_dump(mode="json")}, sort_keys=True, separators=(",", ":"))

    async def __aenter__(self) -> ProviderAgent:
        if self.hardware is None:
            self.hardware = await asyncio.to_thread(detect_hardware)
        await self.process.start()
        servers = (self._serve_negotiations, self._serve_jobs, self._serve_cancels, self._serve_pings,
                   self._serve_resends)
        ready = [asyncio.Event() for _ in servers]
        self._tasks = [asyncio.create_task(serve(event)) for serve, event in zip(servers, ready)]
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
        await self.process.stop()

    async def _advertise(self) -> None:
        last_offer = time.monotonic()
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            beat = Heartbeat(provider=self.address, sent_at=time.time(), busy_jobs=self._busy)
            with contextlib.suppress(AitbcError):  # a failed beat is not the last one
                await self.channel.publish(topics.heartbeat(self.address), beat)
            if time.monotonic() - last_offer >= self.config.offer_refresh_s:
                await self._advertise_now()
                last_offer = time.monotonic()

    async def _advertise_now(self) -> None:
        """Re-publish the retained offer so its free slots match what this daemon is doing now."""
        with contextlib.suppress(AitbcError):
            await self.channel.publish(topics.offer(self.address), self.offer(), retain=True)

    async def _each(self, loop: str, handle: Callable[[Verified[Any]], Awaitable[None] | None],
                    verified: Verified[Any]) -> None:
        """Handle one message; whatever it raises is logged, counted and dropped, so the loop goes on.

        Messages that fail their signature or their record's validation never get here: the
        channel drops them and counts them in ``channel.verifier.dropped``.
        """
        try:
            outcome = handle(verified)
            if outcome is not None:
                await outcome
        except Exception as exc:  # no message, however malformed, may end a serving loop
            self.dropped[f"{loop}: {type(exc).__name__}"] += 1
            log.warning("%s: message from %s dropped: %s", loop, verified.sender, exc)

    async def _serve_negotiations(self, ready: asyncio.Event) -> None:
        async with self.channel.subscribe(topics.negotiate(self.address), ContractProposal) as proposals:
            ready.set()
            async for proposal in proposals:
                await self._each("negotiations", self._answer, proposal)

    async def _answer(self, verified: Verified[ContractProposal]) -> None:
        proposal = verified.message
        if verified.sender != proposal.coordinator:
            return  # someone proposing on another coordinator's behalf
        if self.chain is None:
            reply = ContractReply(contract_id=proposal.contract_id, accepted=False,
                                  reason="this provider has no chain to check a contract against")
        elif proposal.price_wei < self.config.price_wei:
            reply = ContractReply(contract_id=proposal.contract_id, accepted=False,
                                  reason=f"price below ask of {self.config.price_wei} wei")
        else:
            # Agreeing costs nothing: no work is done until the chain shows the slot funded
            # (checked before the first job). The consent lets the escrow give it that slot.
            self._contracts[proposal.contract_id] = proposal
            reply = ContractReply(contract_id=proposal.contract_id, accepted=True,
                                  consent=self.chain.consent(self.account, proposal))
        await self.channel.publish(topics.negotiate_reply(proposal.coordinator, proposal.contract_id), reply)

    async def _serve_jobs(self, ready: asyncio.Event) -> None:
        async with self.channel.subscribe(topics.jobs(self.address), JobAssignment) as jobs:
            ready.set()
            async for verified in jobs:
                await self._each("jobs", self._take_job, verified)

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
        if (problem := await self._contract_problem(contract)) is not None:
            log.warning("job %s refused: %s", verified.message.job_id, problem)
            with contextlib.suppress(AitbcError):
                await self._report(verified.message, "failed", error=f"refused: {problem}")
            return
        self._start_job(verified.message)

    async def _contract_problem(self, contract: ContractProposal) -> str | None:
        """Why the chain does not back ``contract`` (None: it does); read before its first job, then cached.

        A refusal is cached too, except when the chain could not be read at all.
        """
        if contract.contract_id in self._verdicts:
            return self._verdicts[contract.contract_id]
        if self.chain is None:
            return "this provider has no chain to check a contract against"
        try:
            problem = await self.chain.check(contract, self.address)
        except AitbcError as exc:
            return f"the escrow could not be read: {exc}"
        self._verdicts[contract.contract_id] = problem
        return problem

    def _queue_problem(self, job: JobAssignment) -> str | None:
        """Why the queue takes no more jobs like this one, or None."""
        same = sum(1 for a in self._active_jobs.values() if a.job.contract_id == job.contract_id)
        if same >= MAX_JOBS_PER_CONTRACT:
            return f"queue full: {same} jobs of contract {job.contract_id} queued or running"
        if len(self._active_jobs) >= MAX_JOBS_PER_SLOT * self.config.slots:
            return f"queue full: {len(self._active_jobs)} jobs queued or running"
        return None

    def _start_job(self, job: JobAssignment) -> None:
        if job.job_id in self._active_jobs:
            log.warning("job %s is already queued or running; duplicate dropped", job.job_id)
            return
        id_path(self.config.work_dir / "jobs", job.job_id)  # refuse an id that is a path before it is queued
        if (problem := self._queue_problem(job)) is not None:
            self.dropped["jobs: queue full"] += 1
            log.warning("job %s refused: %s", job.job_id, problem)
            self._track(asyncio.create_task(self._refuse(job, problem)))
            return
        task = asyncio.create_task(self._run_job(job))
        self._active_jobs[job.job_id] = _ActiveJob(job, task)
        self._track(task)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)

    async def _refuse(self, job: JobAssignment, problem: str) -> None:
        with contextlib.suppress(AitbcError):
            await self._report(job, "failed", error=f"refused: {problem}")

    async def _serve_cancels(self, ready: asyncio.Event) -> None:
        async with self.channel.subscribe(topics.cancel(self.address), JobCancel) as cancels:
            ready.set()
            async for verified in cancels:
                await self._each("cancels", self._cancel, verified)

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

    async def _serve_pings(self, ready: asyncio.Event) -> None:
        async with self.channel.subscribe(topics.ping(self.address), Ping) as pings:
            ready.set()
            async for verified in pings:
                await self._each("pings", self._answer_ping, verified)

    async def _answer_ping(self, verified: Verified[Ping]) -> None:
        nonce = verified.message.nonce
        if not nonce or any(c in nonce for c in "/+#"):
            return  # the nonce names a topic level; it must not reach into another topic
        with contextlib.suppress(AitbcError):
            await self.channel.publish(topics.pong(verified.sender, nonce),
                                       Pong(nonce=nonce, busy_jobs=self._busy))

    def _remember(self, job: JobAssignment, outcome: TrainOutcome, checkpoint: bytes) -> None:
        """Keep the last few results, so a checkpoint the coordinator could not fetch can be re-sent."""
        self._delivered[job.job_id] = (job, outcome, checkpoint)
        while len(self._delivered) > DELIVERED_KEPT:
            self._delivered.popitem(last=False)

    async def _serve_resends(self, ready: asyncio.Event) -> None:
        async with self.channel.subscribe(topics.resend(self.address), ResendRequest) as requests:
            ready.set()
            async for verified in requests:
                await self._each("resends", self._resend, verified)

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
        await asyncio.to_thread(_write_file, path, checkpoint)
        try:
            cid = await self.upload_checkpoint(job, path)
            await self._publish_result(job, cid, dataclasses.replace(outcome, checkpoint=path))
        finally:
            await asyncio.to_thread(shutil.rmtree, resend_dir, True)

    async def _report(self, job: JobAssignment, status: str, *, epoch: int = 0, loss: float | None = None,
                      samples_per_s: float | None = None, error: str | None = None) -> None:
        percent = 100.0 if status == "complete" else 100.0 * epoch / job.config.epochs
        progress = Progress(
            job_id=job.job_id, training_id=job.training_id, worker_id=self.address, round=job.round,
            status=status, epoch=epoch, epochs=job.config.epochs, progress=percent, loss=_finite(loss),
            samples_per_s=_finite(samples_per_s), error=error[:TEXT_MAX_LENGTH] if error else error)
        self.jobs[job.job_id] = progress
        self.jobs.move_to_end(job.job_id)
        while len(self.jobs) > MAX_JOB_HISTORY:
            self.jobs.popitem(last=False)
        await self.channel.publish(topics.progress(job.training_id, job.job_id), progress)

    async def _run_job(self, job: JobAssignment) -> None:
        try:
            async with self._slots:
                await self._run_in_slot(job)
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
            await self._fetch_inputs(job, job_dir)
            speed: list[float] = []

            async def on_epoch(event: dict[str, Any]) -> None:
                speed.append(event["samples_per_s"])
                await self._report(job, "running", epoch=event["epoch"], loss=event["loss"],
                                   samples_per_s=event["samples_per_s"])

            outcome = await self.train_job(job, job_dir, on_epoch)
            checkpoint_cid = await self.upload_checkpoint(job, outcome.checkpoint)
            self._remember(job, outcome, await asyncio.to_thread(outcome.checkpoint.read_bytes))
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

    async def _fetch_inputs(self, job: JobAssignment, job_dir: Path) -> None:
        # The signed job declares both sizes: a DAG that holds more (or is too deep, too wide or
        # too slow) is a FetchLimitError after one block, not gigabytes in this key-holding daemon.
        shard, weights = await asyncio.gather(
            self.store.cat(job.shard_cid, max_bytes=job.shard_bytes, timeout_s=fetch_timeout_s(job.shard_bytes)),
            self.store.cat(job.weights_cid, max_bytes=job.weights_bytes,
                           timeout_s=fetch_timeout_s(job.weights_bytes)))
        await asyncio.to_thread(_write_inputs, job_dir, shard, weights)

    async def _publish_result(self, job: JobAssignment, checkpoint_cid: str, outcome: TrainOutcome) -> None:
        await self.channel.publish(topics.results(job.training_id), JobResult(
            job_id=job.job_id, training_id=job.training_id, worker_id=self.address, round=job.round,
            checkpoint_cid=checkpoint_cid, samples=outcome.samples, loss=outcome.loss,
            train_seconds=outcome.seconds, signature=self.sign_checkpoint(job, checkpoint_cid)))

    # --- the steps of a job; subclasses (e.g. the chaos tests' Byzantine providers) override one

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        """Train in the training process on the inputs in ``job_dir``; the checkpoint lands there too."""
        done = await self.process.train(job_dir, job_id=job.job_id, model=job.model, config=job.config,
                                        seed=job.seed, on_epoch=on_epoch, owner=job.training_id)
        return TrainOutcome(checkpoint=job_dir / CHECKPOINT_FILE, samples=int(done["samples"]),
                            loss=float(done["loss"]), seconds=float(done["seconds"]))

    async def upload_checkpoint(self, job: JobAssignment, checkpoint: Path) -> str:
        """Store the checkpoint; the returned CID is the one the result announces."""
        return await self.store.add(checkpoint)

    def sign_checkpoint(self, job: JobAssignment, cid: str) -> str:
        """``0x``-hex ``sign_result`` over (chain, registry, training, round, CID): the evidence a
        coordinator can slash with, good for this one training and round only."""
        assert self.chain is not None  # no job runs without a contract the chain backs
        return self.chain.sign_result(self.account, self._contracts[job.contract_id], job.round, cid)


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _write_inputs(job_dir: Path, shard: bytes, weights: bytes) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / SHARD_FILE).write_bytes(shard)
    (job_dir / WEIGHTS_FILE).write_bytes(weights)

