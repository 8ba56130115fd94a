"""A spot check's dispute on the market, narrowed to one step that the coordinator trains.

A verifier's end of a segment differs bit for bit from the worker's committed end (a CPU class). Rather
than re-execute the whole segment, the coordinator asks both the worker (its own job) and the verifier to
trace it: the state hashes after chosen steps, in rounds (:mod:`~aitbc_agent_sdk.proof._bisection`), until
the first step where they differ follows one they agree on. It then gets the agreed state (the opened start,
or a side's upload that hashes as agreed), trains that one step and sees whose hash it reaches. The side it
does not reach is wrong: the worker's result is refused with a slashable verdict, or the verifier is
slashed by its signed report. A side that does not trace in time, or no agreed state to be had, leaves the
dispute undecided: the segment is then replayed here as before (the referee), so a dispute never passes
work nobody checked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from ...proof._bisection import Disputed, Wrong, narrow, step_verdict, trace_points
from ...proof._trajectory import boundary_hashes
from ...records import MAX_TRACE_POINTS, JobAssignment, TrajectoryCommitment, VerifyReport
from ...storage import ContentStore
from ...tasks._trajectory_replay import Reexecution
from .._logbook import AuditSink

log = logging.getLogger(__name__)

# (a side's own job this round, the steps to trace, the steps to train) -> its report; None: no answer in time
AskSide = Callable[[JobAssignment, tuple[int, ...], int | None], Awaitable[VerifyReport | None]]
StepReplay = Callable[[int, bytes], Awaitable[Reexecution]]  # (the job's step, the state before it) -> after it


@dataclass(frozen=True)
class Settled:
    """How a dispute ended: who is ``wrong`` (None: undecided, the segment goes to the referee), at which of
    the job's steps, the requests it sent, and this machine's seconds (one step's training at most)."""

    wrong: Wrong | None
    step: int | None
    requests: int
    local_seconds: float
    reason: str


class Bisection:
    """Settles disputes between a worker and a verifier over one segment."""

    def __init__(self, *, store: ContentStore, audit: AuditSink, state_limit: int, timeout_s: float,
                 limit: int = MAX_TRACE_POINTS) -> None:
        self.store, self.audit = store, audit
        self.state_limit, self.timeout_s, self.limit = state_limit, timeout_s, limit

    async def settle(self, job: JobAssignment, verifier: JobAssignment, commitment: TrajectoryCommitment,
                     segment: int, report: VerifyReport, start_cid: str, ask: AskSide,
                     replay: StepReplay) -> Settled:
        first, last = commitment.segment_steps_of(segment)
        assert report.state_hash is not None
        dispute = Disputed(0, commitment.state_hashes[segment], last - first, commitment.state_hashes[segment + 1],
                           report.state_hash)
        settled = partial(self._settled, job, verifier, segment, last - first)
        requests = rounds = 0
        while not dispute.narrowed:
            points = trace_points(dispute, self.limit)
            # each side trains up to the disputed step only: the steps after it are not in dispute
            traces = await asyncio.gather(ask(job, points, dispute.disputed), ask(verifier, points, dispute.disputed))
            requests, rounds = requests + 2, rounds + 1
            for side, traced in zip(("worker", "verifier"), traces):
                if traced is None or traced.problem is not None or len(traced.trace) != len(points):
                    why = "no answer" if traced is None else traced.problem or f"{len(traced.trace)} hashes"
                    return await settled(None, None, requests, 0.0, rounds, 0,
                                         f"the {side} did not trace steps {points[0]}..{points[-1]} ({why})")
            worker_trace, verifier_trace = (t.trace for t in traces if t is not None)
            dispute = narrow(dispute, points, worker_trace, verifier_trace)
        step = first + dispute.agreed  # the one step in dispute, counted from the job's first
        state, asked = await self._agreed_state(job, verifier, dispute, start_cid, ask)
        requests += asked
        if state is None:
            return await settled(None, step, requests, 0.0, rounds, 0,
                                 f"neither side opened the state before step {step} that both traced")
        started = time.perf_counter()
        again = await replay(step, state)
        seconds = time.perf_counter() - started
        del state
        if again.problem is not None:
            return await settled(None, step, requests, seconds, rounds, 1,
                                 f"step {step} could not be trained here: {again.problem}")
        wrong = step_verdict(dispute, again.state_hash)
        reached = {Wrong.WORKER: "the verifier's", Wrong.VERIFIER: "the worker's", Wrong.BOTH: "neither side's"}
        reason = (f"segment {segment}'s step {step}: bisected against verifier {verifier.worker_id}, the step "
                  f"trained here from the state both traced before it reaches {reached[wrong]} hash, so the "
                  f"{wrong.value}'s does not follow")
        return await settled(wrong, step, requests, seconds, rounds, 1, reason)

    async def _agreed_state(self, job: JobAssignment, verifier: JobAssignment, dispute: Disputed, start_cid: str,
                            ask: AskSide) -> tuple[bytes | None, int]:
        """The state both sides traced before the disputed step, hashing as they said, and the requests it
        took: the opened start, or a side's upload of it (the verifier's first, the worker's if not)."""
        if dispute.agreed == 0:
            return await self._state(start_cid, dispute.agreed_hash), 0
        requests = 0
        for side in (verifier, job):
            opened = await ask(side, (), dispute.agreed)
            requests += 1
            if opened is not None and opened.end_cid is not None and opened.state_hash == dispute.agreed_hash:
                if (state := await self._state(opened.end_cid, dispute.agreed_hash)) is not None:
                    return state, requests
        return None, requests

    async def _state(self, cid: str, expected: str) -> bytes | None:
        try:
            blob = await asyncio.wait_for(self.store.cat(cid, max_bytes=self.state_limit), self.timeout_s)
            state_hash = (await asyncio.to_thread(boundary_hashes, blob))[1]
        except Exception as exc:  # missing, too big, malformed: not the state agreed on
            log.info("dispute state %s unusable: %s", cid, exc)
            return None
        return blob if state_hash == expected else None

    async def _settled(self, job: JobAssignment, verifier: JobAssignment, segment: int, steps: int,
                       wrong: Wrong | None,
                       step: int | None, requests: int, seconds: float, rounds: int, trained: int,
                       reason: str) -> Settled:
        await self.audit.append("dispute", worker=job.worker_id, job_id=job.job_id, round=job.round, segment=segment,
                                verifier=verifier.worker_id, step=step, segment_steps=steps, rounds=rounds,
                                requests=requests,
                                outcome=wrong.value if wrong is not None else "undecided", reason=reason,
                                steps_trained_here=trained, seconds=round(seconds, 3))
        return Settled(wrong, step, requests, seconds, reason)
