"""A training task: the user's model, data loading, loss, optimizer and evaluation, in one small class.

The split follows the frameworks users know. Like Lightning's ``LightningModule`` the task
names the loss (``loss``, Lightning's ``training_step``) and the optimizer
(``configure_optimizer``); like torchtitan's train spec the model is built from a config
(``build_model``) and data loading is the task's (``batches``); like Flower's ``ClientApp``
evaluation returns named metrics (``evaluate``). The loop itself (epochs, device, bf16
autocast, gradient clipping, scheduler steps, progress) belongs to the SDK
(:func:`~aitbc_agent_sdk.tasks._task_loop.train_task`), so a task never sees a socket, a
key or a path outside its shard.

A task runs in three places: on the coordinator (``build_model`` + ``prepare`` make the round-0
weights; ``evaluate`` scores the test split; ``loss`` checks each result on validation data),
and on each provider, in the sandboxed training process (``build_model``, ``batches``,
``configure_optimizer``, ``loss``). Hyper-parameters of its own are a pydantic model
(``Params``) validated on both sides.

    class FocalTabular(TrainingTask):
        name = "focal-tabular"
        class Params(TaskParams):
            gamma: float = 2.0
        def build_model(self, info, params): ...
        def loss(self, model, batch, params): ...
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.records._datasets import TargetKind
from aitbc_agent_sdk.data._datasets import LabeledData

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), on the training device
Scheduler = torch.optim.lr_scheduler.LRScheduler


class TaskParams(BaseModel):
    """A task's own hyper-parameters: subclass it and add typed, bounded fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class DataInfo:
    """What a task may know about the data before it builds its model."""

    feature_shape: tuple[int, ...]  # one sample's inputs, without the batch dimension
    num_classes: int  # classes: how many; values and none: 0
    samples: int  # in the data the model is built for (the training split or one shard)
    target: TargetKind = "classes"  # class labels, regression values, or none (self-supervised)
    target_width: int = 1  # values: floats per row (a regression head's width)


def regression_metrics(predictions: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Mean squared error, mean absolute error and R² of ``predictions`` against ``targets`` (same shape),
    averaged over every value. Pure."""
    error = predictions.float() - targets.float()
    mse = float(error.pow(2).mean())
    spread = float((targets.float() - targets.float().mean(dim=0)).pow(2).mean())
    r2 = 1.0 - mse / spread if spread > 0 else 0.0
    return {"mse": mse, "mae": float(error.abs().mean()), "r2": r2}


class TrainingTask:
    """Subclass and override ``build_model``; every other method has a classifier's default.

    Class attributes: ``name`` (shown to users and providers), ``Params`` (the task's
    hyper-parameters), ``metric`` and ``higher_is_better`` (the metric that says which model is
    better, one of the keys ``evaluate`` returns), ``loss_name`` (what ``loss`` computes, as plots
    and reports label it), ``bf16`` (whether bf16 autocast may be used on
    a GPU), ``requires`` (Python packages and PEP 440 versions the task needs on a provider) and
    ``keep_state`` (keep the optimizer's and scheduler's state on the provider from one round to the
    same worker's next; off, every round starts a fresh optimizer, as FedAvg classically does).
    """

    name: ClassVar[str] = "task"
    Params: ClassVar[type[TaskParams]] = TaskParams
    metric: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True
    loss_name: ClassVar[str] = "cross-entropy"
    bf16: ClassVar[bool] = True
    requires: ClassVar[dict[str, str]] = {}
    keep_state: ClassVar[bool] = False

    def for_target(self, target: TargetKind) -> TrainingTask:
        """This task on data with a ``target`` of that kind: on values, the default ``evaluate`` and ``loss`` are
        the regression ones, so a task that kept them reports ``mse`` (lower is better) and labels its loss
        "mse"; a task that defines its own keeps what it says."""
        if target != "values":
            return self
        cls = type(self)
        keeps_metric = _defining(cls, "metric") is TrainingTask and _defining(cls, "evaluate") is TrainingTask
        keeps_loss = _defining(cls, "loss_name") is TrainingTask and _defining(cls, "loss") is TrainingTask
        if not keeps_metric and not keeps_loss:
            return self
        variant = copy.copy(self)
        if keeps_metric:
            variant.metric, variant.higher_is_better = "mse", False  # type: ignore[misc]  # per data, not per class
        if keeps_loss:
            variant.loss_name = "mse"  # type: ignore[misc]
        return variant

    def params(self, raw: dict[str, Any] | None = None) -> TaskParams:
        """``raw`` (from the spec or the wire) validated against ``Params``."""
        return self.Params.model_validate(raw or {})

    def rehearsal_params(self, params: TaskParams) -> TaskParams:
        """The parameters of the dry run before funding (every step once, on the coordinator's CPU): a task
        whose epoch is a fixed number of draws from a stream shrinks them here. The default: ``params``."""
        return params

    def checking_params(self, params: TaskParams, tokens: int, seed: int) -> TaskParams:
        """The parameters a result's check evaluates with: a budget of ``tokens`` test tokens drawn with the
        coordinator's secret ``seed``, for a task whose ``evaluate`` draws from a stream (labelled data is
        drawn by the SDK: see coordinator.inputs)."""
        return params

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must define build_model(info, params)")

    def prepare(self, model: nn.Module, train: LabeledData, params: TaskParams) -> None:
        """On the coordinator, before round 1: fit whatever the model takes from the training split."""

    def batches(self, data: LabeledData, params: TaskParams, batch_size: int, generator: torch.Generator,
                device: torch.device) -> Iterator[Batch]:
        """One epoch of shuffled mini-batches (``generator`` is seeded per job: reproducible; augment here)."""
        features, labels = data.features.to(device), data.labels.to(device)
        order = torch.randperm(len(data), generator=generator).to(device)
        for start in range(0, len(data), batch_size):
            idx = order[start : start + batch_size]
            yield features[idx], labels[idx]

    def steps_per_epoch(self, data: Any, params: TaskParams, batch_size: int) -> int:
        """How many batches ``batches`` yields per epoch (the scheduler's horizon); a task that draws a fixed
        number of windows from a token stream says so here."""
        return math.ceil(len(data) / batch_size)

    def loss(self, model: nn.Module, batch: Batch, params: TaskParams) -> torch.Tensor:
        """Mean loss of one batch (the training step's objective, and the result check's): cross-entropy on
        class labels, mean squared error on float values."""
        inputs, targets = batch
        if targets.is_floating_point():
            return F.mse_loss(model(inputs).float(), targets.float())
        return F.cross_entropy(model(inputs), targets)

    def configure_optimizer(self, model: nn.Module, params: TaskParams, config: JobConfig,
                            total_steps: int) -> tuple[torch.optim.Optimizer, Scheduler | None]:
        """The optimizer of one job (and a scheduler stepped once per batch, or None)."""
        return torch.optim.Adam(model.parameters(), lr=config.learning_rate), None

    def grad_clip_norm(self, params: TaskParams) -> float | None:
        """Clip the gradients' global L2 norm to this before each step; None: no clipping."""
        return None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: LabeledData, params: TaskParams,
                 device: torch.device) -> dict[str, float]:
        """Named metrics of ``model`` on ``data``, with ``loss`` and ``metric`` among them; the default:
        accuracy and mean cross-entropy on classes, mse (the loss too), mae and r2 on values."""
        if data.target == "values":
            predictions = torch.cat([model(data.features[start : start + 1024].to(device)).float().cpu()
                                     for start in range(0, len(data), 1024)])
            found = regression_metrics(predictions.reshape(data.labels.shape), data.labels)
            return {**found, "loss": found["mse"]}
        correct, loss_sum = 0, 0.0
        for start in range(0, len(data), 1024):
            inputs = data.features[start : start + 1024].to(device)
            targets = data.labels[start : start + 1024].to(device)
            logits = model(inputs).float()
            loss_sum += F.cross_entropy(logits, targets, reduction="sum").item()  # sum: short last batch
            correct += int((logits.argmax(dim=1) == targets).sum())
        return {"accuracy": correct / len(data), "loss": loss_sum / len(data)}


def _defining(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO that defines ``name``."""
    return next((c for c in cls.__mro__ if name in vars(c)), cls)
