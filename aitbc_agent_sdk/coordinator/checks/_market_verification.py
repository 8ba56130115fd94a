"""Spot checks re-executed by verifiers on the market rather than on the coordinator's CPU.

For each drawn segment the coordinator hires a verifier at random among the training's other workers of the
checked worker's device class (its contract's, confirmed at hiring), unknown to the worker until then. The
verifier fetches the opened start state, trains the segment again and reports the end state, uploaded and
signed. When its end agrees with the committed one (bit for bit on a CPU, within the class's tolerance on a
GPU) the segment passes and the coordinator trained nothing. When they disagree bit for bit (a CPU class),
the dispute narrows to one step that the coordinator trains (:mod:`._disputes`); the side shown wrong pays
(the worker by the spot check's slashable verdict, the verifier by its signed report), and a verifier shown
wrong is replaced by another. When the verifier does not answer, the class compares within a tolerance, or
the dispute stays undecided, the coordinator re-executes the segment itself as the referee.

Canaries keep verifiers honest about the agreements nobody disputes: at a secret rate the coordinator also
sends the verifier a perturbed copy of the start state, whose true end cannot be the committed one. A
verifier that reports the committed end for it did not train: it is slashed, and its other report that
round counts for nothing. Its requests look alike (a request id, a start CID, a commitment whose start hash
is that of the state sent), so it cannot tell which to skip without comparing against the worker's public
commitment; one that does so and copies the committed end on real checks approves skipped work until a
dispute or the coordinator's own check catches the worker (see docs/threat-model.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import torch

from ...errors import AitbcError
from ...messaging import SignedChannel, topics
from ...proof._bisection import Wrong
from ...proof._tolerances import Comparison
from ...proof._trajectory import boundary_hashes
from ...records import JobAssignment, TrajectoryCommitment, VerifyReport, VerifyRequest
from ...storage import ContentStore
from ...tasks._trajectory_replay import Reexecution, relative_distance
from ...wire._checkpoint import decode_metadata, decode_state, encode_state
from .._listener import TrainingListener
from .._logbook import AuditSink
from .._training_db import TrainingDatabase
from ..money._settlement import VerifierFee, verification_fee_wei
from ._disputes import Bisection, Settled, StepReplay

log = logging.getLogger(__name__)

Slash = Callable[[str, str, str, int], Awaitable[None]]  # worker, cid, signature, round
Referee = Callable[[], Awaitable[Reexecution]]  # the coordinator's own replay of the segment
CANARY_NOISE = 0.05  # relative: far beyond any segment's honest drift, well inside a state the task can be in


@dataclass(frozen=True)
class SegmentVerdict:
    """What verification of one segment found about the worker: ``agreed`` (a verifier's end matched the
    committed one), else the referee's replay to compare; and the coordinator's seconds spent on it."""

    agreed: bool
    referee: Reexecution | None
    local_seconds: float


@dataclass(frozen=True)
class Trained:
    """A request a verifier answered with an end state: ``steps`` of a job of ``job_steps`` trained again."""

    verifier: str
    steps: int
    job_steps: int
    request_id: str


@dataclass(frozen=True)
class Asked:
    """One segment's requests out to one verifier: the real check and, at the canary rate, a canary."""

    verifier: JobAssignment
    real: asyncio.Task[VerifyReport | None]
    canary: asyncio.Task[bool] | None  # True once the verifier is caught reporting the committed end for it

    @property
    def reports(self) -> int:
        return 1 + (self.canary is not None)


def perturbed_state(blob: bytes, rng: random.Random, noise: float = CANARY_NOISE) -> bytes:
    """A canary's start: the boundary state ``blob`` with every floating model tensor moved by ``noise``
    of its own scale (the optimizer's state and the metadata as they were)."""
    metadata = decode_metadata(blob)
    generator = torch.Generator().manual_seed(rng.getrandbits(63))
    tensors = {}
    for key, tensor in decode_state(blob).items():
        if key.startswith("model/") and tensor.is_floating_point() and tensor.numel():
            scale = float(tensor.detach().abs().mean()) or 1.0
            tensor = tensor + noise * scale * torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
        tensors[key] = tensor.contiguous()
    return encode_state(tensors, metadata)


def model_of(blob: bytes) -> dict[str, torch.Tensor]:
    return {k.removeprefix("model/"): v for k, v in decode_state(blob).items() if k.startswith("model/")}


def ends_agree(exact: bool, tolerance: float, state_hash: str, ended: Mapping[str, torch.Tensor] | None,
               other_hash: str, other: Mapping[str, torch.Tensor] | None, start: Mapping[str, torch.Tensor]) -> bool:
    """Two re-executions of a segment agree: equal state hashes; or, where the class is not compared bit for
    bit, ends within ``tolerance`` of each other relative to the segment's change from ``start``."""
    if state_hash == other_hash:
        return True
    if exact or ended is None or other is None:
        return False
    try:
        return relative_distance(ended, other, start) <= tolerance
    except ValueError:  # not the same tensors at all
        return False


class MarketVerifiers:
    """Hires, asks and judges verifiers for one round's spot checks."""

    def __init__(self, *, db: TrainingDatabase, store: ContentStore, channel: SignedChannel,
                 listener: TrainingListener, audit: AuditSink, slash: Slash, timeout_s: float, canary_rate: float,
                 state_limit: int, rng: random.Random, takes: Callable[[str, int], bool]) -> None:
        self.db, self.store, self.channel, self.listener, self.audit = db, store, channel, listener, audit
        self.takes = takes  # (device class, parameters) -> whether a check goes to verifiers
        self.slash = slash
        self.timeout_s, self.canary_rate, self.state_limit = timeout_s, canary_rate, state_limit
        self.rng = rng
        self.caught: set[str] = set()  # verifiers shown wrong in this training: never asked again
        self.busy: set[str] = set()  # verifiers a check of this round holds
        self.freed = asyncio.Condition()
        self.bisection = Bisection(store=store, audit=audit, state_limit=state_limit, timeout_s=timeout_s)
        self.trained: list[Trained] = []  # every verifier's answered request this round: its fee, if it stays honest

    @contextlib.asynccontextmanager
    async def reserved(self, job: JobAssignment, device_class: str) -> AsyncIterator[JobAssignment | None]:
        """A verifier for one segment of ``job``: its own job this round (its contract and wrapped key),
        drawn at random among the other workers hired as ``device_class`` that no other check of this round
        holds, and held until the block ends; None when none is eligible. Checks run at once, so this waits
        for one to be free rather than queue requests behind its own work (see docs/protocol.md)."""
        # A worker this training replaced (silent, failed, caught) is asked nothing more: it would only make a
        # check wait out the verifier's deadline (the market simulation found it: 125 s of a 150 s training).
        contracts = await self.db.contracts(job.training_id)
        classes = {c.worker_id: c.device_class for c in contracts if c.role != "replaced"}
        self.caught |= await self.db.struck_verifiers(job.training_id)  # in earlier rounds too
        latest: dict[str, JobAssignment] = {}
        for other in await self.db.jobs(job.training_id, job.round):
            latest[other.worker_id] = other
        eligible = sorted((w for w, own in latest.items() if w != job.worker_id and classes.get(w) == device_class),
                          key=str)
        async with self.freed:
            await self.freed.wait_for(lambda: not self._usable(eligible) or self._usable(eligible) - self.busy)
            free = sorted(self._usable(eligible) - self.busy, key=str)
            chosen = latest[self.rng.choice(free)] if free else None
            if chosen is not None:
                self.busy.add(chosen.worker_id)
        try:
            yield chosen
        finally:
            if chosen is not None:
                async with self.freed:
                    self.busy.discard(chosen.worker_id)
                    self.freed.notify_all()

    @contextlib.asynccontextmanager
    async def holding(self, *parties: str) -> AsyncIterator[None]:
        """Hold a dispute's worker and verifier (taken together, once neither is held: no check then holds
        one while it waits for another), so no other check of this round asks either of them meanwhile
        and their traces do not queue behind other work."""
        async with self.freed:
            await self.freed.wait_for(lambda: not self.busy.intersection(parties))
            self.busy.update(parties)
        try:
            yield
        finally:
            async with self.freed:
                self.busy.difference_update(parties)
                self.freed.notify_all()

    def _usable(self, eligible: list[str]) -> set[str]:
        return {w for w in eligible if w not in self.caught}

    def draws_canary(self) -> bool:
        """Whether this segment's request goes out with a canary (then the caller fetches its start)."""
        return self.rng.random() < self.canary_rate

    async def ask(self, verifier: JobAssignment, job: JobAssignment, commitment: TrajectoryCommitment,
                  segment: int, start_cid: str, start_bytes: int, canary_from: bytes | None,
                  work_s: float = 0.0) -> Asked:
        """Send ``segment`` to ``verifier`` (:meth:`reserved`), and with ``canary_from`` (the opened start) a
        canary made from it too; each may take ``work_s`` (the segment's training) beyond the policy's
        ``verify_timeout_s``. The answers are awaited apart (:meth:`answer`), so the caller need not hold
        the opened states, nor its turn, while verifiers work."""
        real = asyncio.create_task(self._ask(verifier, job, commitment, segment, start_cid, start_bytes, None,
                                             work_s=work_s))
        canary = None
        if canary_from is not None:
            try:
                blob = await asyncio.to_thread(perturbed_state, canary_from, self.rng)
                canary_hash = (await asyncio.to_thread(boundary_hashes, blob))[1]
                cid = await self.store.add(blob)
            except BaseException:
                real.cancel()
                raise
            canary = asyncio.create_task(self._canary(verifier, job, commitment, segment, cid, len(blob),
                                                      canary_hash, work_s))
        return Asked(verifier, real, canary)

    async def answer(self, asked: Asked) -> VerifyReport | None:
        """The verifier's report; None when it did not answer, or reported the committed end for a canary
        (then its agreement proves nothing)."""
        try:
            report = await asked.real
            if asked.canary is not None and await asked.canary:
                return None
            return report
        finally:  # a cancelled check leaves no request waiting
            for waiting in (asked.real, asked.canary):
                if waiting is not None:
                    waiting.cancel()

    async def agreed(self, job: JobAssignment, commitment: TrajectoryCommitment, segment: int,
                     report: VerifyReport | None) -> bool:
        """Whether ``report`` ends the segment where the worker committed, bit for bit; then it passes, and
        nothing more is fetched or trained here."""
        if report is None or report.problem is not None or report.state_hash != commitment.state_hashes[segment + 1]:
            return False
        if report.verifier_id in self.caught:  # shown wrong meanwhile (another check's canary): its word is worthless
            return False
        await self._record_agreement(job, segment, report)
        return True

    async def _record_agreement(self, job: JobAssignment, segment: int, report: VerifyReport) -> None:
        await self.audit.append("verification", worker=job.worker_id, job_id=job.job_id, round=job.round,
                                segment=segment, verifier=report.verifier_id, outcome="agreed", end_cid=report.end_cid)

    async def judge(self, job: JobAssignment, commitment: TrajectoryCommitment, segment: int,
                    blobs: Mapping[int, bytes], comparison: Comparison, asked: Asked, report: VerifyReport | None,
                    referee: Referee) -> SegmentVerdict:
        """A report that did not agree bit for bit: within the class's tolerance it still agrees; otherwise
        (or unanswered, or unusable) the coordinator referees, and a verifier its replay shows wrong pays."""
        start, end = blobs[segment], blobs[segment + 1]
        ended = None
        if report is not None and report.problem is None and not comparison.exact:
            ended = await self._ended(report)  # compared within a tolerance: its end state itself
            if ended is None:
                report = report.model_copy(update={"problem": "its end state could not be fetched or hashed"})
        if report is None or report.problem is not None:
            why = "no answer" if report is None else f"could not re-execute ({report.problem})"
            return await self._refereed(job, segment, None, f"verifier {asked.verifier.worker_id}: {why}", referee)
        assert report.state_hash is not None
        start_model = model_of(start)
        committed = None if comparison.exact else model_of(end)
        if ends_agree(comparison.exact, comparison.tolerance, report.state_hash, ended,
                      commitment.state_hashes[segment + 1], committed, start_model):
            await self._record_agreement(job, segment, report)
            return SegmentVerdict(True, None, 0.0)
        found = await self._refereed(job, segment, report, "disputed: re-executed here as the referee", referee)
        again = found.referee
        if again is not None and again.problem is None and not ends_agree(
                comparison.exact, comparison.tolerance, report.state_hash, ended, again.state_hash, again.model,
                start_model):
            await self._punish(report, job.round, "its re-execution disagrees with the referee's")
        return found

    @staticmethod
    def disputable(report: VerifyReport | None) -> bool:
        """A report with an end state of its own: a dispute can narrow it (a CPU class's)."""
        return report is not None and report.problem is None and report.state_hash is not None

    async def dispute(self, job: JobAssignment, commitment: TrajectoryCommitment, segment: int,
                      verifier: JobAssignment, report: VerifyReport, start_cid: str, start_bytes: int,
                      replay: StepReplay, work_s: float = 0.0) -> Settled:
        """Narrow the worker's and ``verifier``'s disagreement over ``segment`` to one step, trained by
        ``replay`` (:class:`~._disputes.Bisection`); a verifier shown wrong is slashed and not asked again."""
        def ask(side: JobAssignment, points: tuple[int, ...], stop: int | None) -> Awaitable[VerifyReport | None]:
            return self._ask(side, job, commitment, segment, start_cid, start_bytes, None, points, stop, work_s)
        settled = await self.bisection.settle(job, verifier, commitment, segment, report, start_cid, ask, replay)
        if settled.wrong in (Wrong.VERIFIER, Wrong.BOTH):
            await self._punish(report, job.round, f"bisected to step {settled.step}: its trace does not follow")
        return settled

    async def unverified(self, job: JobAssignment, segment: int, referee: Referee) -> SegmentVerdict:
        """No verifier was eligible: the coordinator re-executes the segment itself."""
        return await self._refereed(job, segment, None, "no eligible verifier: re-executed here", referee)

    async def _refereed(self, job: JobAssignment, segment: int, report: VerifyReport | None, why: str,
                        referee: Referee) -> SegmentVerdict:
        started = time.perf_counter()
        again = await referee()
        seconds = time.perf_counter() - started
        await self.audit.append("verification", worker=job.worker_id, job_id=job.job_id, round=job.round,
                                segment=segment, verifier=report.verifier_id if report else None, outcome="refereed",
                                reason=why, seconds=round(seconds, 3))
        return SegmentVerdict(False, again, seconds)

    async def _ask(self, verifier: JobAssignment, job: JobAssignment, commitment: TrajectoryCommitment, segment: int,
                   start_cid: str, start_bytes: int, canary_hash: str | None, points: tuple[int, ...] = (),
                   stop: int | None = None, work_s: float = 0.0) -> VerifyReport | None:
        """One request to ``verifier`` (in a dispute, to the worker too: ``verifier`` is then ``job``) and its
        report; None when it does not answer in time. A canary waits behind the real check on the
        verifier's slot: it gets twice the time."""
        timeout = (self.timeout_s + work_s) * (1 if canary_hash is None else 2)
        request_id = "v" + secrets.token_hex(12)
        hashes = list(commitment.state_hashes)
        if canary_hash is not None:
            hashes[segment] = canary_hash
        request = VerifyRequest(
            request_id=request_id, segment=segment, start_cid=start_cid, start_bytes=start_bytes,
            deadline_s=timeout, points=points, stop=stop,
            commitment=commitment.model_copy(update={"state_hashes": tuple(hashes)}),
            job=job.model_copy(update={"job_id": request_id, "worker_id": verifier.worker_id,
                                       "contract_id": verifier.contract_id, "data_key": verifier.data_key}))
        waiting = self.listener.expect_report(request_id, verifier.worker_id)
        try:
            await self.channel.publish(topics.verify(verifier.worker_id), request)
            report: VerifyReport = await asyncio.wait_for(waiting, timeout + 5.0)
        except (TimeoutError, AitbcError) as exc:
            self.listener.forget_report(request_id)
            log.info("verifier %s did not report %s: %s", verifier.worker_id, request_id, exc)
            return None
        if report.problem is None and verifier.worker_id != job.worker_id:  # a disputed worker's own trace is unpaid
            first, last = commitment.segment_steps_of(segment)
            self.trained.append(Trained(verifier.worker_id, stop or last - first, commitment.steps, request_id))
        return report

    def fees(self, prices: Mapping[str, int]) -> list[VerifierFee]:
        """What the round's verifications earned: each answered request of a verifier never shown wrong in
        this training, at its own per-round price (``prices``) for the share of the job it trained again."""
        return [VerifierFee(t.verifier, verification_fee_wei(prices[t.verifier], t.steps, t.job_steps), t.request_id)
                for t in self.trained if t.verifier not in self.caught and prices.get(t.verifier, 0) > 0]

    async def _canary(self, verifier: JobAssignment, job: JobAssignment, commitment: TrajectoryCommitment,
                      segment: int, cid: str, size: int, canary_hash: str, work_s: float) -> bool:
        """Ask for a canary (a perturbed start, already stored at ``cid``); True when the verifier reports the
        committed end for it (it did not train)."""
        report = await self._ask(verifier, job, commitment, segment, cid, size, canary_hash, work_s=work_s)
        lazy = report is not None and report.problem is None and (
            report.state_hash == commitment.state_hashes[segment + 1]
            or report.model_hash == commitment.model_hashes[segment + 1])
        await self.audit.append("canary", worker=verifier.worker_id, round=job.round, segment=segment,
                                answered=report is not None, passed=not lazy)
        if lazy and report is not None:
            await self._punish(report, job.round, "it reported the committed end for a canary it cannot reach")
        return lazy

    async def _ended(self, report: VerifyReport) -> dict[str, torch.Tensor] | None:
        """The verifier's end model, once its state hashes as the report says; None when it does not."""
        try:
            assert report.end_cid is not None
            blob = await asyncio.wait_for(self.store.cat(report.end_cid, max_bytes=self.state_limit), self.timeout_s)
            hashes = await asyncio.to_thread(boundary_hashes, blob)
        except Exception as exc:  # missing, too big, malformed: its report proves nothing
            log.info("verifier %s's end state unusable: %s", report.verifier_id, exc)
            return None
        if hashes != (report.model_hash, report.state_hash):
            return None
        return model_of(blob)

    async def _punish(self, report: VerifyReport, round: int, why: str) -> None:
        self.caught.add(report.verifier_id)
        await self.audit.append("verifier_wrong", worker=report.verifier_id, request_id=report.request_id,
                                round=round, reason=why, evidence=report.end_cid)
        await self.db.save_strike(report.training_id, report.verifier_id, report.request_id, f"verifier: {why}")
        assert report.end_cid is not None and report.signature is not None
        await self.slash(report.verifier_id, report.end_cid, report.signature, round)
