"""Providers that skip work and still want to be paid: free riders, lazy workers and copycats.

Each is a ProviderAgent that replaces the honest training step; they train (when they do) in their
own process, as a cheater on its own machine would. Registered in ``byzantine.BEHAVIOURS``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import time
from pathlib import Path

import numpy as np
import torch

from aitbc_agent_sdk.coordinator.checks._work_checks import expected_steps
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import COMMITMENT_KEY, JobAssignment, JobResult, TrajectoryCommitment
from aitbc_agent_sdk.provider._node import EpochReporter, ProviderAgent, TrainOutcome
from aitbc_agent_sdk.provider._process import CHECKPOINT_FILE, TRAJECTORY_DIR, WEIGHTS_FILE
from aitbc_agent_sdk.provider._worker_process import warm_up
from aitbc_agent_sdk.wire._checkpoint import decode_state
from aitbc_agent_sdk.tasks._bound_task import BoundTask, bind_task, job_task_ref
from aitbc_agent_sdk.data._shard_files import load_shard
from aitbc_agent_sdk.proof._trajectory import (
    TrajectoryRecorder, boundary_hashes, boundary_name, encode_boundary, hash_batch, segment_steps, tensor_digest,
)
from aitbc_agent_sdk.wire._update_codec import encode_update

State = dict[str, torch.Tensor]
COPY_WAIT_S = 120.0  # how long a copycat waits for someone else's result before it trains itself


def _made_up() -> str:
    return secrets.token_hex(32)


def _write_checkpoint(job_dir: Path, job: JobAssignment, state: State, commitment: TrajectoryCommitment | None) -> None:
    reference = decode_state((job_dir / WEIGHTS_FILE).read_bytes())
    metadata = {"job_id": job.job_id, **({COMMITMENT_KEY: commitment.model_dump_json()} if commitment else {})}
    blob, _ = encode_update(state, reference, job.update_encoding, metadata=metadata)
    (job_dir / CHECKPOINT_FILE).write_bytes(blob)


def _job_task(job: JobAssignment) -> BoundTask:
    return bind_task(job_task_ref(job.model, job.task))


def honest_batch_hashes(task: BoundTask, data: object, job: JobAssignment, steps: int) -> list[str]:
    """The batch hashes an honest worker commits to: cheap, no training (a careful cheater computes them)."""
    k = segment_steps(steps, job.config.segments)
    generator = torch.Generator().manual_seed(job.seed)
    batch_size = min(job.config.batch_size, len(data))  # type: ignore[arg-type]
    hashes, hasher, step = [], hashlib.sha256(), 0
    for _ in range(job.config.epochs):
        for batch in task.task.batches(data, task.params, batch_size, generator, torch.device("cpu")):  # type: ignore[arg-type]
            hash_batch(hasher, batch)
            step += 1
            if step % k == 0 or step == steps:
                hashes.append(hasher.hexdigest())
                hasher = hashlib.sha256()
    return hashes


class SkippingProvider(ProviderAgent):
    """Replaces the honest training process with :meth:`skip_work`, run in its own thread here. It warms
    torch up before it advertises, as the honest training process does, and reports its epoch: a cheater
    that looked slow would be replaced as a straggler before its cheat is judged."""

    async def __aenter__(self) -> SkippingProvider:
        await asyncio.to_thread(warm_up)
        await super().__aenter__()
        return self

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        started = time.perf_counter()
        samples = await asyncio.to_thread(self.skip_work, job_dir, job)
        seconds = time.perf_counter() - started
        await on_epoch({"epoch": job.config.epochs, "loss": 1.0, "samples_per_s": samples / max(seconds, 1e-9)})
        return TrainOutcome(checkpoint=job_dir / CHECKPOINT_FILE, samples=samples, loss=1.0, seconds=seconds)

    def skip_work(self, job_dir: Path, job: JobAssignment) -> int:
        """Write the job's checkpoint (and any trajectory) into ``job_dir``; returns the shard's samples."""
        raise NotImplementedError


class FreeRiderProvider(SkippingProvider):
    """Trains nothing: announces the round's weights plus 1e-6 noise, with a commitment it made up
    (its ends match the weights it sent; nothing between them exists, so it can open nothing)."""

    def skip_work(self, job_dir: Path, job: JobAssignment) -> int:
        sent = decode_state((job_dir / WEIGHTS_FILE).read_bytes())
        noisy = {k: v + 1e-6 * torch.randn_like(v) if v.is_floating_point() else v for k, v in sent.items()}
        data = load_shard(job_dir)
        steps = expected_steps(_job_task(job), len(data), job.config)
        n = math.ceil(steps / segment_steps(steps, job.config.segments))
        commitment = TrajectoryCommitment(
            job_id=job.job_id, worker=self.address, steps=steps, segment_steps=segment_steps(steps, job.config.segments),
            device="cpu", model_hashes=(tensor_digest(sent), *(_made_up() for _ in range(n - 1)), tensor_digest(noisy)),
            state_hashes=tuple(_made_up() for _ in range(n + 1)), batch_hashes=tuple(_made_up() for _ in range(n)))
        _write_checkpoint(job_dir, job, noisy, commitment)
        return len(data)


class LazyProvider(SkippingProvider):
    """Trains a tenth of its steps, then commits to a made-up trajectory it can open: boundary ``i`` is the
    straight line from the round's model towards what it trained, with a fresh optimizer, and the batch
    hashes are the honest ones. Every file hashes to its commitment; no segment re-executes to the next."""

    FRACTION = 0.1

    def skip_work(self, job_dir: Path, job: JobAssignment) -> int:
        task, data = _job_task(job), load_shard(job_dir)
        sent = decode_state((job_dir / WEIGHTS_FILE).read_bytes())
        steps = expected_steps(task, len(data), job.config)
        k = segment_steps(steps, job.config.segments)
        n = math.ceil(steps / k)
        model = task.build(job.model, samples=len(data))
        model.load_state_dict(sent)
        part = data.subset(np.arange(max(1, int(len(data) * self.FRACTION))))
        task.train(model, part, job.config, seed=job.seed)
        trained = {key: v.detach().clone() for key, v in model.state_dict().items()}
        directory = job_dir / TRAJECTORY_DIR
        directory.mkdir(exist_ok=True)
        models, states = [], []
        for i in range(n + 1):
            point = trained if i == n else sent if i == 0 else {
                key: sent[key] + (i / n) * (trained[key] - sent[key]) if v.is_floating_point() else v
                for key, v in sent.items()}
            model.load_state_dict(point)
            optimizer, scheduler = task.task.configure_optimizer(model, task.params, job.config, steps)
            self.tamper(optimizer)
            blob = encode_boundary(model, optimizer, scheduler)
            (directory / boundary_name(i)).write_bytes(blob)
            model_hash, state_hash = boundary_hashes(blob)
            models.append(model_hash)
            states.append(state_hash)
        commitment = TrajectoryCommitment(job_id=job.job_id, worker=self.address, steps=steps, segment_steps=k,
                                          device="cpu", model_hashes=tuple(models), state_hashes=tuple(states),
                                          batch_hashes=tuple(honest_batch_hashes(task, data, job, steps)))
        _write_checkpoint(job_dir, job, trained, commitment)
        return len(data)

    def tamper(self, optimizer: torch.optim.Optimizer) -> None:
        """What the cheater changes in each boundary's optimizer before it commits to it: nothing here."""


class LazyHonestProvider(SkippingProvider):
    """Trains half of its steps and commits honestly to what it did (a shorter trajectory)."""

    FRACTION = 0.5

    def skip_work(self, job_dir: Path, job: JobAssignment) -> int:
        task, data = _job_task(job), load_shard(job_dir)
        model = task.build(job.model, samples=len(data))
        model.load_state_dict(decode_state((job_dir / WEIGHTS_FILE).read_bytes()))
        part = data.subset(np.arange(max(1, int(len(data) * self.FRACTION))))
        recorder = TrajectoryRecorder(job_dir / TRAJECTORY_DIR, job.config.segments)
        task.train(model, part, job.config, seed=job.seed, trajectory=recorder)
        state = {key: v.detach().clone() for key, v in model.state_dict().items()}
        _write_checkpoint(job_dir, job, state, recorder.commitment(job.job_id, self.address, "cpu"))
        return len(data)


class DriftingRecorder(TrajectoryRecorder):
    """Records every boundary, each nudged 1 % further along its segment's change before it is committed:
    the committed trajectory is not one the job's steps produce, but each segment ends within 0.01 (relative
    to its own change) of where re-executing it from its committed start lands."""

    def __init__(self, directory: Path | None, segments: int, drift: float = 0.01) -> None:
        super().__init__(directory, segments)
        self.drift = drift

    def start(self, total_steps, seed, device, model, optimizer, scheduler) -> None:  # type: ignore[no-untyped-def]
        super().start(total_steps, seed, device, model, optimizer, scheduler)  # writes boundary 0
        self.kept = tuple(range(math.ceil(total_steps / self.segment_steps) + 1))  # every one, to open any
        self._from = self._floats(model)

    def stepped(self, model, optimizer, scheduler) -> None:  # type: ignore[no-untyped-def]
        if (self.steps + 1) % self.segment_steps == 0 or self.steps + 1 == self.total_steps:
            with torch.no_grad():
                for name, value in model.named_parameters():
                    value.add_(self.drift * (value - self._from[name]))
            self._from = self._floats(model)
        super().stepped(model, optimizer, scheduler)

    @staticmethod
    def _floats(model: torch.nn.Module) -> State:
        return {name: value.detach().clone() for name, value in model.named_parameters()}


class DeviceLiarProvider(SkippingProvider):
    """Hired as a CPU, it commits that it trained on a GPU, where re-executions are compared within a
    tolerance and not bit for bit, and drifts within that tolerance (:class:`DriftingRecorder`). Its work
    is compared by the device class it was hired as, so the drift is a contradiction of what it signed."""

    DRIFT = 0.01

    def skip_work(self, job_dir: Path, job: JobAssignment) -> int:
        task, data = _job_task(job), load_shard(job_dir)
        model = task.build(job.model, samples=len(data))
        model.load_state_dict(decode_state((job_dir / WEIGHTS_FILE).read_bytes()))
        recorder = DriftingRecorder(job_dir / TRAJECTORY_DIR, job.config.segments, self.DRIFT)
        task.train(model, data, job.config, seed=job.seed, trajectory=recorder)
        state = {key: v.detach().clone() for key, v in model.state_dict().items()}
        _write_checkpoint(job_dir, job, state, recorder.commitment(job.job_id, self.address, "cuda"))
        return len(data)


class CopycatProvider(ProviderAgent):
    """Waits for another worker's result in the same round, then announces that checkpoint as its own
    (fetched by CID: the same bytes) under its own signature."""

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        started = time.perf_counter()
        try:
            theirs = await asyncio.wait_for(self._someone_elses(job), COPY_WAIT_S)
        except TimeoutError:  # alone in the round: nothing to copy
            return await super().train_job(job, job_dir, on_epoch)
        blob = await self.store.cat(theirs.checkpoint_cid)
        await asyncio.to_thread((job_dir / CHECKPOINT_FILE).write_bytes, blob)
        return TrainOutcome(checkpoint=job_dir / CHECKPOINT_FILE, samples=theirs.samples, loss=theirs.loss,
                            seconds=time.perf_counter() - started)

    async def _someone_elses(self, job: JobAssignment) -> JobResult:
        async with self.channel.subscribe(topics.results(job.training_id), JobResult) as results:
            async for verified in results:
                result = verified.message
                if result.worker_id != self.address and result.round == job.round:
                    return result
        raise TimeoutError


LAZY: dict[str, type[ProviderAgent]] = {
    "free-rider": FreeRiderProvider,
    "lazy": LazyProvider,
    "lazy-honest": LazyHonestProvider,
    "copycat": CopycatProvider,
    "device-liar": DeviceLiarProvider,
}

__all__ = ["LAZY", "CopycatProvider", "DeviceLiarProvider", "DriftingRecorder", "FreeRiderProvider", "LazyHonestProvider", "LazyProvider",
           "honest_batch_hashes"]
