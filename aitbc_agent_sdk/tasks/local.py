"""One worker's local training on its shard. Reads top to bottom: setup, data, optimizer, loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.data.datasets import LabeledData


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


def train_local(
    model: nn.Module,
    data: LabeledData,
    config: JobConfig,
    *,
    seed: int,
    on_epoch: Callable[[EpochStats], None] | None = None,
) -> LocalTrainResult:
    """Train ``model`` in place for ``config.epochs`` epochs of Adam + cross-entropy."""
    if len(data) == 0:
        raise TrainingError("cannot train on an empty shard")
    # -- setup: batches follow the model's device; shuffling uses its own seeded generator
    # so results do not depend on (or disturb) the global torch RNG.
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    features = data.features.to(device)
    labels = data.labels.to(device)
    n = len(data)
    batch_size = min(config.batch_size, n)
    # -- optimizer: fresh Adam per call, i.e. per federated round (moments are not shared).
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    model.train()

    # -- loop
    started = time.perf_counter()
    epoch_loss = math.nan
    for epoch in range(1, config.epochs + 1):
        epoch_start = time.perf_counter()
        order = torch.randperm(n, generator=generator).to(device)
        loss_sum = 0.0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            logits = model(features[idx])
            loss = F.cross_entropy(logits, labels[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(idx)
        epoch_loss = loss_sum / n
        if not math.isfinite(epoch_loss):
            raise TrainingError(f"loss diverged to {epoch_loss} in epoch {epoch}; lower the learning rate")
        if on_epoch is not None:
            elapsed = max(time.perf_counter() - epoch_start, 1e-9)
            on_epoch(EpochStats(epoch, config.epochs, epoch_loss, n / elapsed))
    return LocalTrainResult(samples=n, loss=epoch_loss, seconds=time.perf_counter() - started)
