"""The checks a result passes when it arrives, in order: one small interface, applied by the round.

The round (:class:`~._rounds.RoundRunner`) fetches a result and decodes it (a result it cannot fetch
may be re-sent; one it cannot decode is rejected), then runs :func:`check_arrival` over its list of
:class:`ResultCheck` objects. The first that rejects decides and the later ones do not run (the work
check records a result's commitment only for results that got that far). The pure rules are in
:mod:`._verification` and :mod:`._work_checks`; what needs the whole round (the norm, the lower bound,
near copies) or runs beside the loop (the spot check) follows in ``rounds`` and ``round_work``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ...records import CheckpointRef, JobAssignment, Shard
from ..data._inputs import RoundInputs
from ..round._round_work import RoundWork
from ..money._settlement import EscrowAccount
from ._verification import Inspection, inspect_result
from ._work_checks import no_improvement

State = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Arrival:
    """One fetched and decoded result, with the job it answers."""

    ref: CheckpointRef
    job: JobAssignment
    shard: Shard
    blob: bytes
    state: State
    shard_jobs: Collection[str]  # the jobs live on its shard (its own, and a speculative copy's)


@dataclass(frozen=True)
class Verdict:
    """Accepted (``problem`` None) or rejected with a reason; measurements taken on the way ride along."""

    problem: str | None = None
    slashable: bool = False
    norm: float | None = None  # the update's norm: the round's norm check needs it
    val_loss: float | None = None


ACCEPT = Verdict()


class ResultCheck(Protocol):
    async def verdict(self, result: Arrival) -> Verdict: ...


async def check_arrival(checks: Sequence[ResultCheck], result: Arrival) -> Inspection:
    """``result`` through ``checks`` in order, up to the first rejection."""
    ref, norm, val_loss = result.ref, None, None
    for check in checks:
        found = await check.verdict(result)
        norm = found.norm if found.norm is not None else norm
        val_loss = found.val_loss if found.val_loss is not None else val_loss
        if found.problem is not None:
            return Inspection(ref.job_id, ref.worker_id, ref.cid, found.problem, slashable=found.slashable,
                              norm=norm, val_loss=val_loss)
    return Inspection(ref.job_id, ref.worker_id, ref.cid, None, norm=norm, val_loss=val_loss)


class SoundResult:
    """Signed by its worker, not a replay, shaped like the model, finite, and no worse on validation data
    (:func:`~._verification.inspect_result`). A label-skewed (dirichlet) training judges a result on a
    sample of its own shard instead, where it must also lower the loss."""

    def __init__(self, escrow: EscrowAccount, inputs: RoundInputs, work: RoundWork) -> None:
        self.escrow, self.inputs, self.work = escrow, inputs, work
        self.own = inputs.record.spec.partition == "dirichlet"

    async def verdict(self, result: Arrival) -> Verdict:
        ref, base = result.ref, self.inputs.baseline
        domain, key = await self.escrow.evidence_domain(), self.escrow.key(self.inputs.training_id)
        validation, start_loss = (await self.work.own_shard(result.shard) if self.own
                                  else (base.validation, base.start_loss))
        found = await asyncio.to_thread(
            lambda: inspect_result(
                job_id=ref.job_id, worker_id=ref.worker_id, domain=domain, key=key, round=ref.round, cid=ref.cid,
                signature=ref.signature, state=result.state, reference=base.reference,
                seen_before=ref.cid in base.earlier_cids, spec=self.inputs.model,
                validation=validation, start_loss=start_loss, policy=self.inputs.policy, task=base.checker))
        if found.problem is None and self.own and (short := no_improvement(found.val_loss or 0.0, start_loss)):
            return Verdict(short, norm=found.norm, val_loss=found.val_loss)
        return Verdict(found.problem, found.slashable, found.norm, found.val_loss)


class NotACopy:
    """Not a checkpoint another worker published first this round (signed by this one, but not its work).
    ``first_published`` (CID -> job) is the round's, filled in arrival order."""

    def __init__(self, first_published: Mapping[str, str]) -> None:
        self.first_published = first_published

    async def verdict(self, result: Arrival) -> Verdict:
        first = self.first_published.get(result.ref.cid, result.ref.job_id)
        if first != result.ref.job_id and first not in result.shard_jobs:
            return Verdict("a copy of a checkpoint another worker published first in this round", slashable=True)
        return ACCEPT


class CommittedWork:
    """The trajectory commitment inside the checkpoint matches its job (:meth:`.RoundWork.inspect`, which
    also keeps the result's work for the round's later checks)."""

    def __init__(self, work: RoundWork) -> None:
        self.work = work

    async def verdict(self, result: Arrival) -> Verdict:
        found = await asyncio.to_thread(self.work.inspect, result.job, result.shard, result.blob, result.state)
        return Verdict(found.problem, found.slashable)


def arrival_checks(escrow: EscrowAccount, inputs: RoundInputs, work: RoundWork,
                   first_published: Mapping[str, str]) -> list[ResultCheck]:
    """The round's checks on arrival, in the order they run."""
    return [SoundResult(escrow, inputs, work), NotACopy(first_published), CommittedWork(work)]
