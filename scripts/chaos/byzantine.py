"""Byzantine providers for chaos tests: each is a ProviderAgent that cheats in one step of a job.

Pick one by name from :data:`BEHAVIOURS` (or :func:`byzantine_factory` for the daemon's
``agent_factory``). Checkpoints are read and written as safetensors only, never pickled.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from eth_account import Account

from aitbc_agent_sdk.records import ContractProposal, GpuInfo, Hardware, JobAssignment
from aitbc_agent_sdk.provider._node import EpochReporter, ProviderAgent, TrainOutcome
from aitbc_agent_sdk.provider._owners import TrainingOwner
from aitbc_agent_sdk.provider._process import CHECKPOINT_FILE, WEIGHTS_FILE
from aitbc_agent_sdk.storage import compute_cid
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state
from aitbc_agent_sdk.data._shard_files import load_shard
from aitbc_agent_sdk.wire._update_codec import decode_update, encode_update
from scripts.chaos.lazy import LAZY, DeviceLiarProvider
from scripts.chaos.verifiers import VERIFIERS

State = dict[str, torch.Tensor]

# How far the "scaled" provider pushes its update: w0 + SCALE * (w - w0).
SCALE = 100.0


def read_state(path: Path) -> State:
    return decode_state(path.read_bytes())


def write_state(path: Path, state: State) -> None:
    path.write_bytes(encode_state(state))


def read_trained(job_dir: Path, job: JobAssignment) -> State:
    """The weights the job's checkpoint stands for, whatever update encoding the job asked for."""
    sent = read_state(job_dir / WEIGHTS_FILE)
    return decode_update((job_dir / CHECKPOINT_FILE).read_bytes(), sent, job.update_encoding)


def write_trained(job_dir: Path, job: JobAssignment, state: State) -> None:
    """``state`` as the job's checkpoint, in the job's update encoding (a cheat the coordinator can decode)."""
    blob, _ = encode_update(state, read_state(job_dir / WEIGHTS_FILE), job.update_encoding)
    (job_dir / CHECKPOINT_FILE).write_bytes(blob)


def map_floating(state: State, change: Callable[[str, torch.Tensor], torch.Tensor]) -> State:
    """Apply ``change`` to every floating tensor; integer and bool buffers are kept as they are."""
    return {name: change(name, t) if t.is_floating_point() else t for name, t in state.items()}


class NanProvider(ProviderAgent):
    """Trains honestly, then fills every floating tensor of the checkpoint with NaN."""

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        outcome = await super().train_job(job, job_dir, on_epoch)
        await asyncio.to_thread(self._poison, job_dir, job)
        return outcome

    @staticmethod
    def _poison(job_dir: Path, job: JobAssignment) -> None:
        state = read_trained(job_dir, job)
        write_trained(job_dir, job, map_floating(state, lambda _, t: torch.full_like(t, math.nan)))


class ScaledProvider(ProviderAgent):
    """Trains honestly, then announces ``w0 + SCALE * (w - w0)``: a boosted (model-replacement) update."""

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        outcome = await super().train_job(job, job_dir, on_epoch)
        await asyncio.to_thread(self._boost, job_dir, job)
        return outcome

    @staticmethod
    def _boost(job_dir: Path, job: JobAssignment) -> None:
        sent, trained = read_state(job_dir / WEIGHTS_FILE), read_trained(job_dir, job)
        write_trained(job_dir, job, map_floating(trained, lambda name, w: sent[name] + SCALE * (w - sent[name])))


class RandomProvider(ProviderAgent):
    """Skips training and announces standard-normal weights of the right shapes."""

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        started = time.perf_counter()
        samples, num_classes = await asyncio.to_thread(self._fake_checkpoint, job_dir, job)
        # Report what an honest first epoch might: the loss of a uniform guess.
        return TrainOutcome(checkpoint=job_dir / CHECKPOINT_FILE, samples=samples, loss=math.log(num_classes),
                            seconds=time.perf_counter() - started)

    @staticmethod
    def _fake_checkpoint(job_dir: Path, job: JobAssignment) -> tuple[int, int]:
        sent = read_state(job_dir / WEIGHTS_FILE)
        write_trained(job_dir, job, map_floating(sent, lambda _, t: torch.randn_like(t)))
        shard = load_shard(job_dir)
        return len(shard), shard.num_classes


class StaleProvider(ProviderAgent):
    """Honest in its first job; afterwards skips training and replays that first checkpoint.

    The replayed bytes are the same, so the honest upload announces the first job's CID again.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._first: tuple[bytes, TrainOutcome] | None = None

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        checkpoint = job_dir / CHECKPOINT_FILE
        if self._first is None:
            outcome = await super().train_job(job, job_dir, on_epoch)
            self._first = (await asyncio.to_thread(checkpoint.read_bytes), outcome)
            return outcome
        blob, first = self._first
        await asyncio.to_thread(checkpoint.write_bytes, blob)
        return TrainOutcome(checkpoint=checkpoint, samples=first.samples, loss=first.loss, seconds=first.seconds)


class ForgedProvider(ProviderAgent):
    """Honest checkpoint, signed with a throwaway key: the signature names someone else."""

    def sign_checkpoint(self, job: JobAssignment, cid: str, contract: ContractProposal) -> str:
        throwaway = Account.create()
        assert self.chain is not None
        return self.chain.sign_result(throwaway, contract, job.round, cid)


class CidMismatchProvider(ProviderAgent):
    """Uploads its honest checkpoint but announces the CID of other bytes, which it never stores."""

    async def upload_checkpoint(self, owner: TrainingOwner, job: JobAssignment, checkpoint: Path) -> str:
        await super().upload_checkpoint(owner, job, checkpoint)
        other = await asyncio.to_thread(checkpoint.read_bytes)
        return compute_cid(other + b"\0")  # hash only: no block is written


class QuarterSpeedProvider(ProviderAgent):
    """Honest, but takes about four times as long as it needs: a throttled GPU, slow but alive."""

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        started = time.perf_counter()
        outcome = await super().train_job(job, job_dir, on_epoch)
        await asyncio.sleep(3 * (time.perf_counter() - started) + 0.5)
        return outcome


class ThrottledProvider(ProviderAgent):
    """Honest, but its first two jobs each stall for eight seconds (a throttled GPU that recovers).

    ``stall_s`` and ``stalled_jobs`` change both; a test on a busy host sizes the stall from the
    round time it measured there, so "slow" and "fast" rounds differ by a known factor.
    """

    THROTTLED_JOBS = 2
    STALL_S = 8.0

    def __init__(self, *args: object, stall_s: float | None = None, stalled_jobs: int | None = None,
                 **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._jobs_done = 0
        self._stall_s = self.STALL_S if stall_s is None else stall_s
        self._stalled_jobs = self.THROTTLED_JOBS if stalled_jobs is None else stalled_jobs

    async def train_job(self, job: JobAssignment, job_dir: Path, on_epoch: EpochReporter) -> TrainOutcome:
        outcome = await super().train_job(job, job_dir, on_epoch)
        self._jobs_done += 1
        if self._jobs_done <= self._stalled_jobs:
            await asyncio.sleep(self._stall_s)
        return outcome


class LossyProvider(ProviderAgent):
    """Honest, but its first upload of each checkpoint is lost: it announces the right CID without
    storing the block. It uploads for real when the coordinator asks it to re-send."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lost: set[str] = set()

    async def upload_checkpoint(self, owner: TrainingOwner, job: JobAssignment, checkpoint: Path) -> str:
        if job.job_id in self._lost:
            return await super().upload_checkpoint(owner, job, checkpoint)
        self._lost.add(job.job_id)
        return compute_cid(await asyncio.to_thread(checkpoint.read_bytes))  # hash only: no block is written


class FakeGpuProvider(ProviderAgent):
    """Claims one H100 its host does not have. It trains honestly (on the CPU) and answers the hardware
    challenge honestly too, computed on its CPU: so the answer comes late, and the offer is flagged."""

    FAKE_GPU = GpuInfo(name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 << 30, driver_version="550.54.15",
                       cuda_version="12.4")

    def __init__(self, *args: object, hardware: Hardware | None = None, **kwargs: object) -> None:
        from aitbc_agent_sdk.provider._hardware import detect_hardware

        real = hardware or detect_hardware()
        super().__init__(*args, hardware=real.model_copy(update={"gpus": (self.FAKE_GPU,)}),  # type: ignore[arg-type]
                         **kwargs)
        self.hardware_answers.device = "cpu"  # whatever the host has: the claim is the lie, not the arithmetic


class GpuNoiseProvider(DeviceLiarProvider):
    """An honest GPU worker's noise, emulated on a CPU (no GPU here): it offers a GPU, commits that it
    trained on one, and its states drift 0.1 % per segment, as a GPU's non-deterministic kernels make
    them differ from a re-execution. Within the tolerance: paid, never slashed."""

    DRIFT = 0.001

    def __init__(self, *args: object, hardware: Hardware | None = None, **kwargs: object) -> None:
        from aitbc_agent_sdk.provider._hardware import detect_hardware

        real = hardware or detect_hardware()
        super().__init__(*args, hardware=real.model_copy(update={"gpus": (FakeGpuProvider.FAKE_GPU,)}),  # type: ignore[arg-type]
                         **kwargs)
        self.hardware_answers.device = "cpu"


# Honest but troubled providers: for the elastic pool and re-send tests, not the Byzantine suite.
TROUBLED: dict[str, type[ProviderAgent]] = {
    "quarter-speed": QuarterSpeedProvider,
    "throttled": ThrottledProvider,
    "lossy": LossyProvider,
    "gpu-noise": GpuNoiseProvider,
}

BEHAVIOURS: dict[str, type[ProviderAgent]] = {
    "nan": NanProvider,
    "scaled": ScaledProvider,
    "random": RandomProvider,
    "stale": StaleProvider,
    "forged": ForgedProvider,
    "cid-mismatch": CidMismatchProvider,
    **LAZY,  # missing work: free riders, lazy workers, copycats (scripts/chaos/lazy.py)
}


# Providers that lie about their hardware: the chaos suite's own scenario each (fake-gpu), flagged at hiring.
IMPOSTORS: dict[str, type[ProviderAgent]] = {
    "fake-gpu": FakeGpuProvider,
}


def byzantine_factory(name: str) -> Callable[..., ProviderAgent]:
    """The ``agent_factory`` for ``serve_provider`` that builds a provider with behaviour ``name``."""
    kinds = BEHAVIOURS | TROUBLED | IMPOSTORS | VERIFIERS
    try:
        return kinds[name]
    except KeyError:
        raise ValueError(f"unknown behaviour {name!r}; choose one of {', '.join(kinds)}") from None
