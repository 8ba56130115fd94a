"""Held-out evaluation of a (global) classifier; a regression is scored by its task's ``evaluate``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk.data._datasets import LabeledData


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # fraction in [0, 1]
    loss: float  # mean per-sample cross-entropy
    samples: int


@torch.no_grad()
def evaluate(model: nn.Module, data: LabeledData, batch_size: int = 1024) -> EvalResult:
    if len(data) == 0:
        raise ValueError("cannot evaluate on an empty dataset")
    if data.target != "classes":  # a regression is scored by its task: TrainingTask.for_target(...).evaluate
        raise ValueError(f"evaluate() scores classifiers; this data's target is {data.target}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(data), batch_size):
        x = data.features[start : start + batch_size].to(device)
        y = data.labels[start : start + batch_size].to(device)
        logits = model(x)
        # Sum, not mean, so a short last batch is weighted correctly.
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == y).sum())
    model.train(was_training)  # leave the caller's mode as it was
    return EvalResult(accuracy=correct / len(data), loss=loss_sum / len(data), samples=len(data))
