"""Spot checks: re-execute a few segments of a worker's committed trajectory from its committed start.

After a result passed every other check, the coordinator draws segments with the OS's randomness
(after the commitment arrived, so the worker cannot know which), asks the worker to open the
boundary states around them, checks each opened state against the commitment's hash, and trains
each segment again on the shard the job named, with the job's seed. The end state must equal the
committed one bit for bit when the worker trained on a CPU, or lie within a tolerance relative to
the segment's own change when it trained on a GPU (whose kernels are not bit-reproducible here).

A mismatch, or a batch order that is not the job's, contradicts the trajectory the worker signed
(inside the checkpoint's CID): slashable. A worker that does not open its trajectory in time is
unpaid for the round, but not slashed: it may just be gone. In time follows the work: a worker keeps
only a few boundary states (:func:`~aitbc_agent_sdk.proof._trajectory.kept_boundaries`) and trains
segments again to open the others, so its deadline grows with those steps at its measured speed
(:func:`opening_deadline_s`).

A check that cannot decide fails closed. Every opened state must be one the task's own model,
optimizer and scheduler could be in (:mod:`~aitbc_agent_sdk.proof._opened_state`) before anything
is replayed; one that is not, and any error while checking (a hostile state that slipped through, or
the coordinator's own failure), makes the result unverifiable: unpaid, not slashed, and the audit
log says why.

With ``verify_on`` market the segments go to verifiers instead (:mod:`._market_verification`), and a
disagreement is narrowed to one step that this machine trains (:mod:`._disputes`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import torch

from ...errors import AitbcError
from ...messaging import SignedChannel, topics
from ...records import (
    UNCONFIRMED_CLASS, JobAssignment, Shard, ToleranceTable, TrajectoryChallenge, TrajectoryCommitment,
    TrajectoryOpening, VerifyReport, boundaries_opened,
)
from ...wire._checkpoint import decode_state
from ...proof._tolerances import Comparison, comparison_for, precision_of, shipped_tolerances
from ...proof._trajectory import boundary_hashes, recompute_segments
from ...proof._bisection import Wrong
from ...tasks._trajectory_replay import Reexecution, reexecute_segments, relative_distance, replay_step, unfit_states
from ..round._deadlines import job_deadline, job_work
from ...storage import ContentStore
from ..data._datasets import DatasetStore
from ..data._inputs import RoundInputs
from .._listener import TrainingListener
from .._logbook import AuditSink
from ..round._round_times import RoundTimes
from .._training_db import TrainingDatabase
from ._market_verification import Asked, MarketVerifiers, Referee, SegmentVerdict
from ._work_checks import (
    PASS, WorkVerdict, bounded, check_crashed, pick_segments, reexecution_verdict, unverifiable,
)

log = logging.getLogger(__name__)
BOUNDARY_SLACK = 1 << 20  # a boundary file's header and the optimizer's scalars
RECOMPUTE_SLACK = 2.0  # a worker recomputes at half its measured training speed or better (a busy host)
VERIFIERS_PER_SEGMENT = 3  # verifiers a segment goes to while each is shown wrong in turn; then the referee
T = TypeVar("T")


def measured_step_s(train_seconds: float, steps: int, limit_s: float) -> float:
    """Seconds per step of a job as its worker reported its training time, counted at most ``limit_s`` (the
    job's deadline): claiming a slower job buys no more time than the deadline allowed."""
    return min(max(train_seconds, 0.0), limit_s) / max(steps, 1)


def opening_deadline_s(floor_s: float, step_s: float, recompute_steps: int, slack: float = RECOMPUTE_SLACK) -> float:
    """Seconds a worker has to open a spot check: ``floor_s`` (fetch, upload, a process to start) plus the
    steps it trains again to recompute the boundaries it did not keep, at ``slack`` times ``step_s``."""
    return floor_s + slack * step_s * recompute_steps


def boundary_limit(checkpoint_limit: int) -> int:
    """Optimizer moments are about twice the model: four times its size bounds any boundary file."""
    return 4 * checkpoint_limit + BOUNDARY_SLACK


UNDECIDED = Comparison(exact=True, tolerance=0.0, source="undecided: the check failed before it compared")


@dataclass
class Spent:
    """What one check cost beyond the worker's opening: seconds re-executing here, verifiers' reports taken."""

    local_seconds: float = 0.0
    verifiers: int = 0
    on_market: bool = False  # verifiers were asked: only the refereed segments ran here


@dataclass(frozen=True)
class SpotCheck:
    verdict: WorkVerdict
    segments: tuple[int, ...]
    seconds: float  # re-execution time on the coordinator: the verification's compute


def model_part(blob: bytes) -> dict[str, torch.Tensor]:
    """The model tensors of a boundary file (``model/<name>``)."""
    return {k.removeprefix("model/"): v for k, v in decode_state(blob).items() if k.startswith("model/")}


# torch's intra-op thread count is process-wide, and a CPU's sums depend on it: re-executions take turns.
_THREADS = threading.Lock()


def with_threads(threads: int, replay: Callable[..., T], *args: Any) -> T:
    """``replay(*args)`` with as many intra-op threads as the worker trained with (bit-exact on a CPU)."""
    with _THREADS:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return replay(*args)
        finally:
            torch.set_num_threads(before)


def reexecute_with_threads(threads: int, *args: Any) -> dict[int, Reexecution]:
    """:func:`reexecute_segments` with as many intra-op threads as the worker trained with."""
    return with_threads(threads, reexecute_segments, *args)


Unverified = Callable[[JobAssignment, int, Referee], Awaitable[SegmentVerdict]]


@dataclass(frozen=True)
class _CheckInputs:
    """What re-executing any drawn segment of one check needs: the job, its commitment, the shard's data,
    the opened states' CIDs and how ends are compared."""

    job: JobAssignment
    commitment: TrajectoryCommitment
    data: Any
    opened: Mapping[int, str]
    comparison: Comparison
    step_s: float  # the worker's measured seconds per step: how long a verifier may take to train a segment

    def work_s(self, segment: int) -> float:
        """The time a verifier may spend training ``segment``, on top of the policy's ``verify_timeout_s``."""
        first, last = self.commitment.segment_steps_of(segment)
        return RECOMPUTE_SLACK * self.step_s * (last - first)


class SpotChecker:
    """Spot checks for one round; the shards it re-executes on are loaded once and kept for the round."""

    def __init__(self, inputs: RoundInputs, audit: AuditSink, *, db: TrainingDatabase, store: ContentStore,
                 data: DatasetStore, channel: SignedChannel, listener: TrainingListener, round_times: RoundTimes,
                 turn: asyncio.Semaphore, rng: random.Random | None = None,
                 tolerances: ToleranceTable | None = None, market: MarketVerifiers | None = None) -> None:
        self.db, self.store, self.data, self.channel = db, store, data, channel
        self.listener = listener  # the round's own: challenges' openings arrive on it
        self.round_times = round_times
        self.turn = turn  # shared by every round of the coordinator, so checks take turns across trainings
        self.inputs = inputs
        self.audit = audit
        self.rng = rng or random.SystemRandom()
        self.policy = inputs.policy
        self.tolerances = tolerances if tolerances is not None else shipped_tolerances()
        self.market = market  # verifiers, for the checks they take (MarketVerifiers.takes); None: all run here
        self.max_bytes = boundary_limit(inputs.checkpoint_limit)

    async def check(self, job: JobAssignment, shard: Shard, commitment: TrajectoryCommitment,
                    checks: int) -> SpotCheck:
        segments = pick_segments(commitment.segments, checks, self.rng)
        cids: dict[str, str] = {}
        started = time.perf_counter()
        comparison = UNDECIDED
        spent = Spent()
        try:
            device_class = await self._device_class(job)
            comparison = self._comparison(commitment, device_class)
            parameters = job.footprint.parameters if job.footprint is not None else 0
            market = self.market if self.market is not None and self.market.takes(device_class, parameters) else None
            spent.on_market = market is not None
            step_s = await self._step_s(job, shard, commitment)
            ends = market is not None or not comparison.exact  # bit for bit here: the start alone, hash the end
            opened = await self._open(job, segments, ends,
                                      self._opening_timeout(commitment, boundaries_opened(segments, ends=ends), step_s))
            started = time.perf_counter()
            if isinstance(opened, WorkVerdict):
                verdict = opened
            else:
                cids = {str(b): cid for b, cid in opened.items()}
                verdict = await self._reexecute(job, shard, commitment, segments, opened, comparison,
                                                device_class, spent, market, step_s)
        except Exception as exc:  # fail closed: an error is a verdict, never a pass (cancelling still works)
            log.warning("spot check of job %s could not run", job.job_id, exc_info=True)
            verdict = check_crashed(exc)
        verdict = bounded(verdict)
        # Re-executing here is the verification's cost to the customer: all of it, or only the refereed segments.
        seconds = spent.local_seconds if spent.on_market else time.perf_counter() - started
        # The evidence trail: which segments, and the verdict (the opened states are in the store by CID).
        await self.audit.append("spot_check", worker=job.worker_id, job_id=job.job_id, round=job.round,
                                segments=list(segments), passed=verdict.problem is None, reason=verdict.problem,
                                slashable=verdict.slashable, opened=cids, seconds=round(seconds, 3),
                                exact=comparison.exact, tolerance=comparison.tolerance,
                                tolerance_source=comparison.source, verifiers=spent.verifiers,
                                verified_on="market" if spent.on_market else "coordinator")
        return SpotCheck(verdict, segments, seconds)

    async def _device_class(self, job: JobAssignment) -> str:
        """The device class the worker was hired as (its contract), never what its result claims."""
        hired = [c for c in await self.db.contracts(job.training_id) if c.worker_id == job.worker_id]
        return hired[-1].device_class if hired else UNCONFIRMED_CLASS

    def _comparison(self, commitment: TrajectoryCommitment, device_class: str) -> Comparison:
        """Bit for bit or within which tolerance, by the device class the worker was hired as; re-executed on a
        CPU (the coordinator's, or a verifier's of a CPU class)."""
        return comparison_for(self.tolerances, device_class=device_class, committed_device=commitment.device,
                              precision=precision_of(commitment.device, getattr(self.inputs.task.task, "bf16", True)),
                              reference="cpu", default=self.policy.reexec_tolerance)

    async def _step_s(self, job: JobAssignment, shard: Shard, commitment: TrajectoryCommitment) -> float:
        """The worker's seconds per step, as its checkpoint says it trained, within the job's deadline."""
        found = await self.db.checkpoint(job.job_id)
        limit = job_deadline(job_work(shard.samples, job.config.epochs),
                             self.round_times.of(job.training_id, job.worker_id), self.policy)
        return measured_step_s(found[0].train_seconds if found is not None else 0.0, commitment.steps, limit)

    def _opening_timeout(self, commitment: TrajectoryCommitment, wanted: list[int], step_s: float) -> float:
        """The opening's deadline: the policy's floor, plus the worker's recomputation at its measured speed."""
        steps = recompute_segments(len(commitment.state_hashes), set(wanted)) * commitment.segment_steps
        return opening_deadline_s(self.policy.opening_timeout_s, step_s, steps)

    async def _open(self, job: JobAssignment, segments: tuple[int, ...], ends: bool, timeout: float
                    ) -> dict[int, str] | WorkVerdict:
        """The CIDs of the boundary states of ``segments`` (starts, and with ``ends`` ends), as the worker
        opened them."""
        challenge = TrajectoryChallenge(job_id=job.job_id, training_id=job.training_id, round=job.round,
                                        segments=segments, deadline_s=timeout, ends=ends)
        waiting = self.listener.expect_opening(job.job_id)
        try:
            await self.channel.publish(topics.challenge(job.worker_id), challenge)
            opening: TrajectoryOpening = await asyncio.wait_for(waiting, timeout)
        except (TimeoutError, AitbcError) as exc:
            self.listener.forget_opening(job.job_id)
            why = "in time" if isinstance(exc, TimeoutError) else f"({exc})"
            return WorkVerdict(f"missing work: did not open its committed trajectory {why} "
                               f"(segments {list(segments)}, {timeout:g}s)")
        cids = {s.boundary: s.cid for s in opening.states}
        wanted = challenge.boundaries()
        if missing := [b for b in wanted if b not in cids]:
            return WorkVerdict(f"missing work: the opening lacks boundaries {missing}")
        return {b: cids[b] for b in wanted}

    async def _fetch(self, cids: Mapping[int, str]) -> dict[int, bytes] | WorkVerdict:
        """The opened boundary states, checked against nothing yet."""
        blobs = {}
        try:
            async with asyncio.timeout(self.policy.fetch_timeout_s * len(cids)):
                for boundary, cid in cids.items():
                    blobs[boundary] = await self.store.cat(cid, max_bytes=self.max_bytes)
        except Exception as exc:  # missing, too big, corrupt or slow: the worker did not open it
            return WorkVerdict(f"missing work: opened boundary states could not be fetched ({exc})")
        return blobs

    async def _reexecute(self, job: JobAssignment, shard: Shard, commitment: TrajectoryCommitment,
                         segments: tuple[int, ...], opened: Mapping[int, str], comparison: Comparison,
                         device_class: str, spent: Spent, market: MarketVerifiers | None,
                         step_s: float) -> WorkVerdict:
        """Each drawn segment in turn: fetch its opened start and end, check them against the commitment and
        the task, re-execute (here or by a verifier), compare; then let them go. A proven contradiction ends
        the check at once; any other problem of a re-execution is kept while the remaining segments may
        still prove one."""
        data = await self.data.load(shard.cid)
        check = _CheckInputs(job, commitment, data, opened, comparison, step_s)
        first_problem: WorkVerdict | None = None
        for segment in segments:
            if market is None:
                # One check at a time, one segment at a time: the coordinator holds two opened states (each up
                # to four models) whatever the number of workers checked or segments drawn.
                async with self.turn:
                    verdict, final = await self._here(check, segment)
            else:
                verdict, final = await self._on_market(check, segment, device_class, spent, market)
            if final:
                return verdict
            if verdict.problem is not None and first_problem is None:
                first_problem = verdict
        return first_problem or PASS

    async def _here(self, check: _CheckInputs, segment: int, unverified: Unverified | None = None,
                    spent: Spent | None = None) -> tuple[WorkVerdict, bool]:
        """The segment re-executed on this machine (with ``unverified``: because no verifier was eligible);
        its verdict, and whether that ends the check."""
        blobs = await self._load(check, segment, fit=True)
        if isinstance(blobs, WorkVerdict):
            return blobs, True
        replay = partial(self._replay, check, segment, blobs[segment])
        if unverified is None:
            return await self._judged(check, segment, blobs, await replay())
        found = await unverified(check.job, segment, replay)
        assert found.referee is not None and spent is not None
        spent.local_seconds += found.local_seconds
        return await self._judged(check, segment, blobs, found.referee)

    async def _on_market(self, check: _CheckInputs, segment: int, device_class: str, spent: Spent,
                         market: MarketVerifiers) -> tuple[WorkVerdict, bool]:
        """The segment re-executed by a verifier, which fetches the opened start and checks it against the
        commitment itself. This machine fetches the start only to make a canary of it. A report that
        disagrees bit for bit is disputed: narrowed to one step, which this machine trains; a verifier shown
        wrong there is replaced by another. Both states are fetched here, and the segment replayed, only
        for the referee: a class compared within a tolerance, no answer, or a dispute left undecided."""
        asked: Asked | None = None
        report: VerifyReport | None = None
        for _ in range(VERIFIERS_PER_SEGMENT):
            # The verifier first, the turn second: a check holding the turn never waits for a verifier another
            # check holds (and that check may need the turn to judge its report).
            async with market.reserved(check.job, device_class) as verifier:
                if verifier is None:
                    break
                sent = await self._send(check, segment, verifier, market)
                if isinstance(sent, WorkVerdict):
                    return sent, True
                asked, start_bytes = sent
                report = await market.answer(asked)
            spent.verifiers += asked.reports
            if await market.agreed(check.job, check.commitment, segment, report):
                return PASS, False
            if asked.verifier.worker_id in market.caught:  # by its canary: another verifier checks the segment
                asked = report = None
                continue
            if not (check.comparison.exact and market.disputable(report)):
                break
            assert report is not None
            async with market.holding(asked.verifier.worker_id, check.job.worker_id):
                settled = await market.dispute(check.job, check.commitment, segment, asked.verifier, report,
                                               check.opened[segment], start_bytes, partial(self._one_step, check),
                                               check.work_s(segment))
            spent.verifiers += settled.requests
            spent.local_seconds += settled.local_seconds
            if settled.wrong in (Wrong.WORKER, Wrong.BOTH):
                return WorkVerdict(f"spot check: {settled.reason}", slashable=True), True
            if settled.wrong is None:
                break  # undecided: the referee below
            asked = report = None  # that verifier lied and is never drawn again: another checks the segment
        async with self.turn:
            if asked is None:  # no verifier eligible (or every one asked lied)
                return await self._here(check, segment, market.unverified, spent)
            blobs = await self._load(check, segment, fit=True)
            if isinstance(blobs, WorkVerdict):
                return blobs, True
            found = await market.judge(check.job, check.commitment, segment, blobs, check.comparison, asked, report,
                                       partial(self._replay, check, segment, blobs[segment]))
            spent.local_seconds += found.local_seconds
            if found.agreed:
                return PASS, False
            assert found.referee is not None
            return await self._judged(check, segment, blobs, found.referee)

    async def _send(self, check: _CheckInputs, segment: int, verifier: JobAssignment,
                    market: MarketVerifiers) -> tuple[Asked, int] | WorkVerdict:
        """Ask ``verifier`` for ``segment`` (and, at the canary rate, a canary made of its start); the asked
        requests, and the start state's size."""
        start_cid = check.opened[segment]
        size = await self._declared_size(start_cid)
        if size is not None and not market.draws_canary():
            return await market.ask(verifier, check.job, check.commitment, segment, start_cid, size, None,
                                    check.work_s(segment)), size
        async with self.turn:
            blobs = await self._load(check, segment, fit=False, boundaries=(segment,))
            if isinstance(blobs, WorkVerdict):
                return blobs
            start = blobs[segment]
            asked = await market.ask(verifier, check.job, check.commitment, segment, start_cid, len(start),
                                     start if size is not None else None, check.work_s(segment))
            return asked, len(start)

    async def _one_step(self, check: _CheckInputs, step: int, state: bytes) -> Reexecution:
        """A dispute's one step, trained here from the state both sides agree precedes it."""
        job = check.job
        async with self.turn:
            return await asyncio.to_thread(with_threads, check.commitment.threads, replay_step, self.inputs.task,
                                           job.model, check.data, job.config, job.seed, check.commitment, step, state)

    async def _declared_size(self, cid: str) -> int | None:
        """What an opened state's root block says it holds, within the bound; None when it cannot be read
        in time or is beyond the bound (then the state is fetched here, and judged as any other)."""
        try:
            size = await asyncio.wait_for(self.store.size(cid), self.policy.fetch_timeout_s)
        except Exception:  # unreadable: fetched here, where a problem is the worker's verdict
            return None
        return size if 0 < size <= self.max_bytes else None

    async def _load(self, check: _CheckInputs, segment: int, fit: bool,
                    boundaries: tuple[int, ...] | None = None) -> dict[int, bytes] | WorkVerdict:
        """The opened start and end of ``segment`` (the start alone if only it was opened, or only
        ``boundaries``), each hashing as committed and (with ``fit``) a state the task could be in."""
        wanted = boundaries if boundaries is not None else tuple(b for b in (segment, segment + 1)
                                                                 if b in check.opened)
        blobs = await self._fetch({b: check.opened[b] for b in wanted})
        if isinstance(blobs, WorkVerdict):
            return blobs
        for boundary, blob in blobs.items():
            try:
                _, state_hash = await asyncio.to_thread(boundary_hashes, blob)
            except Exception as exc:  # not a boundary file at all
                return WorkVerdict(f"missing work: opened boundary {boundary} is malformed ({exc})")
            if state_hash != check.commitment.state_hashes[boundary]:
                return WorkVerdict(f"missing work: opened boundary {boundary} does not match the commitment")
        if fit:  # both opened states must be ones the task could be in before anything is replayed
            job = check.job
            unfit = await asyncio.to_thread(unfit_states, self.inputs.task, job.model, check.data, job.config, blobs)
            if unfit:
                boundary, problem = next(iter(unfit.items()))
                return unverifiable(f"opened boundary {boundary} is not a state of this task: {problem}")
        return blobs

    async def _replay(self, check: _CheckInputs, segment: int, start: bytes) -> Reexecution:
        job = check.job
        again = await asyncio.to_thread(reexecute_with_threads, check.commitment.threads, self.inputs.task, job.model,
                                        check.data, job.config, job.seed, check.commitment, {segment: start})
        return again[segment]

    async def _judged(self, check: _CheckInputs, segment: int, blobs: Mapping[int, bytes],
                      again: Reexecution) -> tuple[WorkVerdict, bool]:
        verdict = await self._compare(check.commitment, (segment,), blobs, {segment: again}, check.comparison)
        return verdict, verdict.slashable

    async def _compare(self, commitment: TrajectoryCommitment, segments: tuple[int, ...],
                       blobs: Mapping[int, bytes], again: Mapping[int, Reexecution],
                       comparison: Comparison) -> WorkVerdict:
        """Each re-executed segment against its committed end; a proven contradiction first."""
        problems = [(s, again[s]) for s in segments if again[s].problem is not None]
        if lie := next((found for _, found in problems if found.contradicts), None):
            return WorkVerdict(f"spot check: {lie.problem}", slashable=True)
        if problems:
            segment, found = problems[0]
            return unverifiable(f"segment {segment} could not be re-executed: {found.problem}")
        exact = comparison.exact
        for segment in segments:
            distance = None
            if not exact:
                distance = await asyncio.to_thread(relative_distance, again[segment].model,
                                                   model_part(blobs[segment + 1]), model_part(blobs[segment]))
            verdict = reexecution_verdict(segment, exact=exact, reexecuted_hash=again[segment].state_hash,
                                          committed_hash=commitment.state_hashes[segment + 1], distance=distance,
                                          tolerance=comparison.tolerance)
            if verdict.problem is not None:
                return verdict
        return PASS
