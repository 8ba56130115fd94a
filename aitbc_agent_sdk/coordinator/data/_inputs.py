"""A round's inputs, read once when the round starts and passed down to every step that needs them.

Before this, each job sent read the training record four times and fetched the manifest from the
store (an HTTP call with Kubo), and each round start fetched the manifest three times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
import secrets
from dataclasses import dataclass, replace

import torch

from ...errors import NotFoundError
from ...records import (
    FaultPolicy, JobAssignment, JobConfig, ModelSpec, Shard, ShardManifest, TaskRef, TrainingRecord, TrainingSpec,
    WeightsDelta, WorkerContract, new_id,
)
from ...storage import ContentStore
from ...data._datasets import LabeledData
from ...wire._checkpoint import decode_state
from ...tasks._bound_task import BoundTask
from ...tasks._networks import MODEL_NAMES
from ...data._shard_files import drawn_samples
from ._datasets import DatasetStore
from ._tasks import TaskCache
from .._training_db import TrainingDatabase
from ..checks._verification import validation_loss

CHECKPOINT_HEADER_SLACK = 64 * 1024  # safetensors headers differ in offsets' digits and metadata


@dataclass(frozen=True)
class RoundBaseline:
    """What every result of the round is checked against."""

    reference: dict[str, torch.Tensor]  # the round's starting model
    validation: LabeledData
    start_loss: float
    earlier_cids: frozenset[str]  # results of earlier rounds: a replay of one is rejected
    checker: BoundTask  # the task with the round's secret draw of test samples or tokens (checking_params)
    seed: int  # that draw's seed: never sent, so no result can be tuned to what it is scored on


def round_checker(task: BoundTask, policy: FaultPolicy, seed: int) -> BoundTask:
    """``task`` as a result's check runs it: a fixed budget of test tokens, drawn with ``seed``."""
    return replace(task, params=task.task.checking_params(task.params, policy.val_tokens, seed))


@dataclass(frozen=True)
class RoundInputs:
    record: TrainingRecord  # as the round started; its phase moves on, so re-read it before writing it
    manifest: ShardManifest
    test: LabeledData
    model: ModelSpec
    task: BoundTask  # the training's task with its parameters: builds, scores and checks models
    contracts: tuple[WorkerContract, ...]  # the funded workers at round start, one per shard slot
    shards: Mapping[int, Shard]  # slot (shard index) -> the shard it trains this round
    sizes: Mapping[str, int]  # exact bytes of the round's model and shards: a provider fetches no more
    baseline: RoundBaseline
    holders_of_base: frozenset[str] = frozenset()  # workers that trained last round: they hold its model

    @property
    def training_id(self) -> str:
        return self.record.training_id

    @property
    def round(self) -> int:
        return self.record.round + 1

    @property
    def policy(self) -> FaultPolicy:
        return self.record.spec.faults

    @property
    def model_cid(self) -> str:
        assert self.record.model_cid is not None  # load_round_inputs checked it
        return self.record.model_cid

    @property
    def checkpoint_limit(self) -> int:
        """The most a result's checkpoint may hold: the current model's tensors, so its exact size
        plus room for a different safetensors header."""
        return self.sizes[self.model_cid] + CHECKPOINT_HEADER_SLACK


async def load_round_inputs(db: TrainingDatabase, store: ContentStore, datasets: DatasetStore, tasks: TaskCache,
                            training_id: str) -> RoundInputs:
    """One read of the record, one fetch of the manifest, one of the model: everything a round reads first."""
    record = await db.training(training_id)
    if record.manifest_cid is None or record.model_cid is None:
        raise NotFoundError(f"training {training_id} has no shards yet")
    manifest = ShardManifest.model_validate_json(await store.cat(record.manifest_cid))
    test = await datasets.load(manifest.test_cid)
    task = await tasks.bound(record.spec)
    model = task.model_spec(test)
    contracts = tuple(await db.contracts(training_id, "worker"))
    shards = round_shards(manifest, await db.shards(training_id), contracts)
    wanted = {record.model_cid, *(s.cid for s in shards.values()), *([record.model_delta_cid] if record.model_delta_cid
                                                                     else [])}
    sizes = {cid: await store.size(cid) for cid in sorted(wanted)}
    reference = decode_state(await store.cat(record.model_cid))
    seed = secrets.randbits(62)
    checker = round_checker(task, record.spec.faults, seed)
    validation = drawn_samples(test, record.spec.faults.val_samples, seed)
    start_loss = await asyncio.to_thread(validation_loss, model, reference, validation, checker)
    earlier = frozenset(c.cid for c in await db.checkpoints(training_id, None) if c.round <= record.round)
    holders = frozenset(j.worker_id for j in await db.jobs(training_id, record.round)) if record.round else frozenset()
    return RoundInputs(record, manifest, test, model, task, contracts, shards, sizes,
                       RoundBaseline(reference, validation, start_loss, earlier, checker, seed), holders)


def round_shards(manifest: ShardManifest, stored: Sequence[Shard],
                 contracts: Sequence[WorkerContract]) -> dict[int, Shard]:
    """Each worker's shard this round: the original one, or the one an elastic pool rebuilt for it."""
    original = {s.index: s for s in manifest.shards}
    derived = {s.shard_id: s for s in stored}
    shards = {}
    for contract in contracts:
        assert contract.shard_index is not None  # drive_training assigned every worker a shard
        shards[contract.shard_index] = (derived[contract.shard_id] if contract.shard_id
                                        else original[contract.shard_index])
    return shards


def new_job(record: TrainingRecord, contract: WorkerContract, shard: Shard, model: ModelSpec, config: JobConfig,
            *, shard_bytes: int, weights_bytes: int, delta_bytes: int | None = None) -> JobAssignment:
    """The job for ``contract``'s worker to train ``shard`` from the record's current model (no I/O)."""
    assert record.model_cid is not None  # create_shards stores the round-0 model
    round_ = record.round + 1
    delta = None
    if record.model_delta_cid and record.model_base_cid and delta_bytes:
        delta = WeightsDelta(base_cid=record.model_base_cid, delta_cid=record.model_delta_cid, delta_bytes=delta_bytes,
                             encoding=record.spec.upload_encoding)
    return JobAssignment(job_id=new_id("job"), training_id=record.training_id, round=round_,
                         worker_id=contract.worker_id, contract_id=contract.contract_id, shard_cid=shard.cid,
                         shard_bytes=shard_bytes, weights_cid=record.model_cid, weights_bytes=weights_bytes,
                         model=model, config=config.model_copy(update={"rounds": record.spec.rounds}),
                         task=job_task(record.spec), update_encoding=record.spec.upload_encoding, weights_delta=delta,
                         footprint=record.spec.footprint,
                         seed=(record.spec.seed * 7919 + round_ * 104729 + shard.index) % 2**31)


def job_task(spec: TrainingSpec) -> TaskRef | None:
    """The task a job names: the spec's; None for a registry classifier, which its model spec names
    (with its width); a built-in of another kind (the gpt) by name."""
    if spec.task is not None or spec.model_type in MODEL_NAMES:
        return spec.task
    return TaskRef(name=spec.model_type)
