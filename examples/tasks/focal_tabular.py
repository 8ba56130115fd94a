"""A tabular classifier with a focal loss, AdamW and a warm-up + cosine schedule: a task to copy.

Run it on a CSV with a label column (``make_data.py`` writes one from scikit-learn's bundled
breast-cancer table)::

    python examples/tasks/make_data.py cancer.csv
    aitbc distributed-training run --task examples/tasks/focal_tabular.py --data-path cancer.csv \
        --label-column diagnosis --task-param gamma=2 --target-workers 2 --rounds 3 --yes

What it shows:
- ``prepare`` fits the model's own input standardisation on the training split (once, on the
  coordinator); the mean and scale are buffers, so they travel with the weights to every worker;
- ``loss`` is the focal loss of Lin et al. (2017): cross-entropy scaled by ``(1 - p_true)^gamma``,
  which down-weights the easy rows and lets the hard (often the minority-class) ones count;
- ``configure_optimizer`` returns AdamW and a per-batch schedule: linear warm-up, then cosine decay;
- ``evaluate`` adds macro-F1 (the metric that says which model is better when classes are
  imbalanced) and plain cross-entropy to accuracy and the task's loss.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class FocalParams(TaskParams):
    gamma: float = Field(default=2.0, ge=0.0, le=10.0, description="focusing exponent; 0 is plain cross-entropy")
    hidden: int = Field(default=64, ge=1, le=4096, description="width of the hidden layers")
    depth: int = Field(default=2, ge=1, le=8, description="hidden layers")
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=1e-2, ge=0.0, le=1.0, description="AdamW's decoupled weight decay")
    warmup_fraction: float = Field(default=0.1, ge=0.0, le=0.5,
                                   description="share of a job's steps spent warming the learning rate up")
    min_lr_ratio: float = Field(default=0.05, ge=0.0, le=1.0, description="the cosine's floor, as a share of --lr")


class StandardizedMLP(nn.Module):
    """An MLP whose first step is ``(x - mean) / scale``, with both fitted by ``FocalTabular.prepare``."""

    def __init__(self, features: int, classes: int, params: FocalParams) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("scale", torch.ones(features))
        layers: list[nn.Module] = []
        width = features
        for _ in range(params.depth):
            layers += [nn.Linear(width, params.hidden), nn.GELU(), nn.Dropout(params.dropout)]
            width = params.hidden
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.scale)


def focal_loss(logits: torch.Tensor, targets: torch.Tensor, gamma: float) -> torch.Tensor:
    """Mean focal loss: ``-(1 - p_t)^gamma * log p_t``, computed from log-probabilities (stable)."""
    log_p = F.log_softmax(logits.float(), dim=1).gather(1, targets[:, None]).squeeze(1)
    return (-((1.0 - log_p.exp()) ** gamma) * log_p).mean()


def warmup_cosine(step: int, total: int, warmup: int, floor: float) -> float:
    """The learning-rate factor at ``step``: linear from ~0 to 1 over ``warmup``, then cosine to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def macro_f1(predicted: torch.Tensor, targets: torch.Tensor, classes: int) -> float:
    """The unweighted mean of each present class's F1 (a class absent from both is skipped)."""
    scores = []
    for c in range(classes):
        tp = int(((predicted == c) & (targets == c)).sum())
        fp = int(((predicted == c) & (targets != c)).sum())
        fn = int(((predicted != c) & (targets == c)).sum())
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / max(len(scores), 1)


class FocalTabular(TrainingTask):
    name = "focal-tabular"
    Params = FocalParams
    metric = "macro_f1"
    higher_is_better = True

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, FocalParams)
        if len(info.feature_shape) != 1:
            raise ValueError(f"focal-tabular expects rows of features, got samples of shape {info.feature_shape}")
        return StandardizedMLP(info.feature_shape[0], info.num_classes, params)

    def prepare(self, model, train, params) -> None:
        # Fitted on the coordinator's training split only: the test split stays unseen.
        mean = train.features.mean(dim=0)
        scale = train.features.std(dim=0).clamp_min(1e-6)  # a constant column divides by ~0 otherwise
        with torch.no_grad():
            model.mean.copy_(mean)
            model.scale.copy_(scale)

    def loss(self, model, batch, params) -> torch.Tensor:
        inputs, targets = batch
        return focal_loss(model(inputs), targets, params.gamma)

    def configure_optimizer(self, model, params, config, total_steps):
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=params.weight_decay)
        # One job is one round's epochs: the schedule runs over the job's steps and starts again next round.
        warmup = math.floor(params.warmup_fraction * total_steps)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, total_steps, warmup, params.min_lr_ratio))
        return optimizer, schedule

    @torch.no_grad()
    def evaluate(self, model, data, params, device) -> dict[str, float]:
        logits = model(data.features.to(device)).float()
        targets = data.labels.to(device)
        predicted = logits.argmax(dim=1)
        return {
            "accuracy": float((predicted == targets).float().mean()),
            "loss": float(focal_loss(logits, targets, params.gamma)),
            "cross_entropy": float(F.cross_entropy(logits, targets)),
            "macro_f1": macro_f1(predicted, targets, data.num_classes),
        }
