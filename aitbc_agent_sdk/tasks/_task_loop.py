"""The SDK's side of a task: the training loop, evaluation and the result check's loss.

The loop owns what users should not have to get right on a stranger's machine: the device,
bf16 autocast on a GPU, gradient clipping, stepping the scheduler, a seeded shuffle that does
not touch the global RNG, progress per epoch and a clear error when the loss diverges.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.tasks._task import Batch, Scheduler, TaskParams, TrainingTask
from aitbc_agent_sdk.wire._task_state import encode_task_state, restore_task_state
from aitbc_agent_sdk.proof._trajectory import TrajectoryRecorder, isolated_rng


@dataclass(frozen=True)
class EpochStats:
    epoch: int  # 1-based
    epochs: int
    loss: float  # mean per-sample loss over this epoch
    samples_per_s: float


@dataclass(frozen=True)
class LocalTrainResult:
    samples: int  # samples in the shard: the FedAvg weight
    loss: float  # mean loss of the last epoch
    seconds: float
    task_state: bytes | None = None  # a keep_state task's optimizer and scheduler after the job
    resumed: bool = False  # the job started from the state kept after the last round


def training_device(prefer: str = "auto") -> torch.device:
    """``cuda`` when one is visible and allowed (the provider passes one GPU per process), else ``cpu``."""
    if prefer != "cpu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def autocast_for(task: TrainingTask, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on a GPU where the task allows it; full precision on a CPU (bf16 there is slower)."""
    if device.type == "cuda" and task.bf16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_task(task: TrainingTask, model: nn.Module, data: LabeledData, params: TaskParams, config: JobConfig, *,
               seed: int, device: torch.device | None = None, on_epoch: Callable[[EpochStats], None] | None = None,
               kept_state: bytes | None = None, trajectory: TrajectoryRecorder | None = None) -> LocalTrainResult:
    """Train ``model`` in place for ``config.epochs`` epochs of the task's loss and optimizer.

    A ``keep_state`` task resumes its optimizer from ``kept_state`` (the last round's, when there
    is one) and returns the new state in the result. A ``trajectory`` recorder commits the job's
    states and batches as it goes (and seeds the global RNG per segment, restored afterwards)."""
    if len(data) == 0:
        raise TrainingError("cannot train on an empty shard")
    device = device or next(model.parameters()).device
    model.to(device)
    generator = torch.Generator().manual_seed(seed)  # own stream: results do not depend on the global RNG
    batch_size = min(config.batch_size, len(data))
    steps = config.epochs * task.steps_per_epoch(data, params, batch_size)
    optimizer, scheduler = task.configure_optimizer(model, params, config, steps)
    resumed = task.keep_state and kept_state is not None
    if resumed:
        assert kept_state is not None
        restore_task_state(kept_state, optimizer, scheduler)
    clip = task.grad_clip_norm(params)
    model.train()
    started, epoch_loss = time.perf_counter(), math.nan
    with isolated_rng(device) if trajectory is not None else contextlib.nullcontext():
        if trajectory is not None:
            trajectory.start(steps, seed, device, model, optimizer, scheduler)
        try:
            for epoch in range(1, config.epochs + 1):
                # The loss is summed on the device and read once per epoch: no host sync per step on a GPU.
                epoch_start, seen = time.perf_counter(), 0
                loss_sum = torch.zeros((), dtype=torch.float64, device=device)
                for batch in task.batches(data, params, batch_size, generator, device):
                    if trajectory is not None:
                        trajectory.consume(batch)
                    loss = train_step(task, model, batch, params, optimizer, scheduler, device, clip)
                    if trajectory is not None:
                        trajectory.stepped(model, optimizer, scheduler)
                    loss_sum += loss.double() * len(batch[1])
                    seen += len(batch[1])
                epoch_loss = float(loss_sum) / max(seen, 1)
                if not math.isfinite(epoch_loss):
                    raise TrainingError(f"loss diverged to {epoch_loss} in epoch {epoch}; lower the learning rate")
                if on_epoch is not None:
                    on_epoch(EpochStats(epoch, config.epochs, epoch_loss,
                                        seen / max(time.perf_counter() - epoch_start, 1e-9)))
        except BaseException:
            if trajectory is not None:
                trajectory.close()  # its hashing thread stops with the job
            raise
        if trajectory is not None:
            trajectory.finish()
    kept = encode_task_state(optimizer, scheduler) if task.keep_state else None
    return LocalTrainResult(samples=len(data), loss=epoch_loss, seconds=time.perf_counter() - started,
                            task_state=kept, resumed=resumed)


def train_step(task: TrainingTask, model: nn.Module, batch: Batch, params: TaskParams,
               optimizer: torch.optim.Optimizer, scheduler: Scheduler | None, device: torch.device,
               clip: float | None) -> torch.Tensor:
    """One step of the job: the task's loss (autocast), clipped gradients, the optimizer's and the
    scheduler's step. A spot check's re-execution takes the same step, so it is shared."""
    loss = _step(task, model, batch, params, optimizer, device, clip)
    if scheduler is not None:
        scheduler.step()
    return loss


def _step(task: TrainingTask, model: nn.Module, batch: Batch, params: TaskParams,
          optimizer: torch.optim.Optimizer, device: torch.device, clip: float | None) -> torch.Tensor:
    with autocast_for(task, device):
        loss = task.loss(model, batch, params)
    if loss.ndim != 0:
        raise TrainingError(f"task {task.name!r}: loss() must return a scalar, got shape {tuple(loss.shape)}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.detach()


def evaluate_task(task: TrainingTask, model: nn.Module, data: LabeledData, params: TaskParams,
                  device: torch.device | None = None) -> dict[str, float]:
    """The task's metrics in eval mode; the model's mode is left as it was. Checks the task's answer."""
    metrics = task_metrics(task, model, data, params, device)
    task = task.for_target(getattr(data, "target", "classes"))  # a regression's default metric is mse
    if not isinstance(metrics, dict) or not {task.metric, "loss"} <= metrics.keys():  # rounds report both
        raise TrainingError(f"task {task.name!r}: evaluate() must return a dict with 'loss' and its metric "
                            f"{task.metric!r}")
    return {str(k): float(v) for k, v in metrics.items()}


def task_metrics(task: TrainingTask, model: nn.Module, data: LabeledData, params: TaskParams,
                 device: torch.device | None = None) -> object:
    """What the task's ``evaluate`` returns in eval mode, unchecked; the model's mode is left as it was."""
    if len(data) == 0:
        raise ValueError("cannot evaluate on an empty dataset")
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast_for(task, device):
            return task.evaluate(model, data, params, device)
    finally:
        model.train(was_training)


@torch.no_grad()
def task_loss(task: TrainingTask, model: nn.Module, data: LabeledData, params: TaskParams) -> float:
    """The task's mean loss over ``data`` in eval mode: how the coordinator checks a result (data the SDK
    cannot batch, a token stream or files, by the task's own ``evaluate``)."""
    if not isinstance(data, LabeledData):
        return float(evaluate_task(task, model, data, params)["loss"])
    model.eval()
    device = next(model.parameters()).device
    inputs, targets = data.features.to(device), data.labels.to(device)
    return float(task.loss(model, (inputs, targets), params))
