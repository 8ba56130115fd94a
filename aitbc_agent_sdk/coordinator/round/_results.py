"""Results outside the round loop, and folding one result into an aggregation.

The seed's ``collect_checkpoint``, ``checkpoint_fits`` and ``federated_average`` take results one by
one and decode them as their jobs asked (whole weights, or changes from the job's model in any update
encoding). :class:`SeedResults` does them with the ports it uses; :class:`~._service.Coordinator`
holds one and keeps the seed's methods as calls to it. :func:`fold` is shared with the round loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import ConfigError, NotFoundError, TrainingError
from ...records import AggregateResult, CheckpointRef
from ...storage import DEFAULT_MAX_BYTES, ContentStore
from ...aggregate._aggregation import AggregationStrategy, sample_weights
from ...wire._checkpoint import decode_state, encode_state
from ..data._inputs import CHECKPOINT_HEADER_SLACK
from .._logbook import AuditLogs
from ..money._receipts import ReceiptIssuer
from ._round_model import decoded
from ..money._settlement import EscrowAccount
from .._training_db import TrainingDatabase
from ..checks._verification import checkpoint_problem, result_signer

Decode = Callable[[bytes], dict[str, Any]]


async def fold(store: ContentStore, strategy: AggregationStrategy, ref: CheckpointRef, weight: float, *,
               max_bytes: int, decode: Decode = decode_state) -> None:
    """Fetch one checkpoint (at most ``max_bytes``) and fold it into ``strategy``; only this one is decoded
    at a time. ``decode`` turns the result's bytes into weights (the round's update encoding)."""
    blob = await store.cat(ref.cid, max_bytes=max_bytes)
    await asyncio.to_thread(lambda: strategy.accumulate(decode(blob), weight))


async def checkpoint_limit(db: TrainingDatabase, store: ContentStore, training_id: str) -> int:
    """The most a result's checkpoint may hold: it has the current model's tensors, so its size
    (exact: the coordinator stored that model) plus room for a different safetensors header."""
    try:
        model_cid = (await db.training(training_id)).model_cid
    except NotFoundError:  # refs folded outside a stored training (the seed's federated_average)
        model_cid = None
    if model_cid is None:
        return DEFAULT_MAX_BYTES
    return await store.size(model_cid) + CHECKPOINT_HEADER_SLACK


class SeedResults:
    """The seed's checks of single results and its aggregation over them."""

    def __init__(self, *, store: ContentStore, db: TrainingDatabase, escrow: EscrowAccount, logs: AuditLogs,
                 receipts: ReceiptIssuer, aggregation: Callable[[], AggregationStrategy]) -> None:
        self.store = store
        self.db = db
        self.escrow = escrow  # who signed a result: its evidence domain and the training's key
        self.logs = logs
        self.receipts = receipts
        self.aggregation = aggregation

    async def collect(self, worker_id: str, job_id: str) -> CheckpointRef:
        """Fetch the job's checkpoint by CID (integrity-checked), check it fits the model, accept it."""
        found = await self.db.checkpoint(job_id)
        if found is None or found[0].worker_id != worker_id:
            raise NotFoundError(f"no result from {worker_id} for job {job_id} yet")
        ref, status = found
        if status == "accepted":
            return ref
        record = await self.db.training(ref.training_id)
        assert record.model_cid is not None
        reference = decode_state(await self.store.cat(record.model_cid))
        blob = await self.store.cat(ref.cid, max_bytes=await checkpoint_limit(self.db, self.store, ref.training_id))
        try:
            problem = checkpoint_problem(decoded(record.spec.upload_encoding, reference)(blob), reference)
        except TrainingError as exc:
            problem = str(exc)
        if problem is None and await self._signer(ref) != worker_id:
            problem = "result is not signed by the worker"
        if problem is not None:
            await self.db.save_checkpoint(ref, "rejected")
            await self.logs.note(ref.training_id, "result_rejected", worker=worker_id, job_id=job_id, cid=ref.cid,
                                 round=ref.round, reason=problem)
            raise TrainingError(f"checkpoint {ref.cid} from {worker_id} rejected: {problem}")
        await self.db.save_checkpoint(ref, "accepted")
        await self.receipts.issue(ref.training_id, [worker_id])  # redeemable even if it is never paid
        return ref

    async def fits(self, ref: CheckpointRef) -> bool:
        """True when ``ref`` is fetched intact, signed by its worker and fits the current model."""
        record = await self.db.training(ref.training_id)
        assert record.model_cid is not None
        reference = decode_state(await self.store.cat(record.model_cid))
        try:
            limit = await checkpoint_limit(self.db, self.store, ref.training_id)
            state = decoded(record.spec.upload_encoding, reference)(await self.store.cat(ref.cid, max_bytes=limit))
        except Exception:  # missing, corrupt, or not a checkpoint at all
            return False
        return (checkpoint_problem(state, reference) is None
                and await self._signer(ref) == ref.worker_id)

    async def _signer(self, ref: CheckpointRef) -> str | None:
        """Who signed the result's evidence (canonically, for this chain, registry, training and round)."""
        return result_signer(await self.escrow.evidence_domain(), self.escrow.key(ref.training_id), ref.round,
                             ref.cid, ref.signature)

    async def average(self, checkpoints: Sequence[CheckpointRef],
                      weights: Sequence[float] | None = None) -> AggregateResult:
        """Fold checkpoints one at a time (about two models in memory), store the average."""
        if not checkpoints:
            raise ConfigError("no checkpoints to aggregate")
        weights = list(weights) if weights is not None else sample_weights([c.samples for c in checkpoints])
        if len(weights) != len(checkpoints):
            raise ConfigError(f"{len(weights)} weights for {len(checkpoints)} checkpoints")
        strategy = self.aggregation()
        strategy.begin()
        for ref, weight in zip(checkpoints, weights, strict=True):
            decode = await self._decoder(ref)
            await fold(self.store, strategy, ref, weight, decode=decode,
                       max_bytes=await checkpoint_limit(self.db, self.store, ref.training_id))
        model = await asyncio.to_thread(lambda: encode_state(strategy.result()))
        cid = await self.store.add(model)  # the seed uploads ``model`` again: same bytes, same CID
        total = sum(weights)
        loss = sum(w * c.loss for c, w in zip(checkpoints, weights, strict=True)) / total if total else None
        return AggregateResult(model_id=cid, model=model, round=max(c.round for c in checkpoints),
                               samples=sum(c.samples for c in checkpoints), loss=loss,
                               contributors=tuple(c.worker_id for c in checkpoints))

    async def _decoder(self, ref: CheckpointRef) -> Decode:
        """How a result's bytes become weights: as its job asked, from the model the job started from."""
        try:
            job = await self.db.job(ref.job_id)
        except NotFoundError:  # a result outside a stored training: whole weights
            return decode_state
        if job.update_encoding == "weights":
            return decode_state
        return decoded(job.update_encoding, decode_state(await self.store.cat(job.weights_cid)))
