"""A small residual CNN on multi-channel images, with data augmentation in the task: a task to copy.

Run it on an ``.npz`` with ``x`` of shape ``[N, C, H, W]`` and integer labels ``y`` (``make_data.py``
writes one: scikit-learn's bundled digits, upsampled to 16x16 and coloured into 3 channels)::

    python examples/tasks/make_data.py digits.npz
    aitbc distributed-training run --task examples/tasks/resnet_small.py --data-path digits.npz \
        --lr 0.003 --target-workers 2 --rounds 3 --yes

Its defaults follow the image size (``for_images``): on small images (below 16 px, e.g. 8x8) one
stage and no augmentation, since a 2-pixel shift or a halving loses too much of the picture; from
16 px two stages and random crops of side/8 pixels; from 32 px horizontal flips too. Each choice
can be set with ``--task-param``: ``stages=N`` (1-4), ``pool=N`` (the head's pooled grid; 1 is
global average pooling), ``crop_padding=N`` (0: no crops), ``flip=true|false``, and ``width``,
``blocks``, ``weight_decay``, ``clip_norm``.

What it shows:
- ``build_model`` sizes the network from the data (channels, classes) and its own ``Params``;
- GroupNorm, not BatchNorm: each worker's batches come from its own shard, and FedAvg of
  BatchNorm's running statistics mixes statistics of different data;
- ``prepare`` fits a per-channel input standardisation on the training split (buffers: they
  travel with the weights);
- ``batches`` augments each epoch with random crops (zero padding, then a shifted window) and
  horizontal flips where the images are large enough, drawn from the ``generator`` the SDK seeds per job, so a job's
  batches are the same wherever and however often it runs;
- AdamW without weight decay on norms and biases, and gradient clipping through ``grad_clip_norm``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk import Batch, DataInfo, TaskParams, TrainingTask


class ResNetParams(TaskParams):
    """Unset (None), the architecture and the augmentations follow the image size: see ``for_images``."""

    width: int = Field(default=16, ge=4, le=256, description="channels of the first stage (doubled per stage)")
    stages: int | None = Field(default=None, ge=1, le=4, description=(
        "stages; each after the first halves the resolution [default: 1 below 16 px, else 2]"))
    blocks: int = Field(default=1, ge=1, le=8, description="residual blocks per stage")
    pool: int | None = Field(default=None, ge=1, le=16, description=(
        "side of the pooled grid the head reads (1: global average pooling) [default: 4, or the last stage's side]"))
    crop_padding: int | None = Field(default=None, ge=0, le=16, description=(
        "pixels of random shift (0: no crops) [default: side / 8 from 16 px up, none below]"))
    flip: bool | None = Field(default=None, description=(
        "random horizontal flips (off for digits and text) [default: on from 32 px up]"))
    weight_decay: float = Field(default=5e-4, ge=0.0, le=1.0)
    clip_norm: float = Field(default=1.0, ge=0.0, description="gradient clipping; 0: none")


SMALL_SIDE = 16  # below it a 2-pixel shift or a halving loses too much of the picture
FLIP_SIDE = 32  # flips pay off on natural photographs (CIFAR's 32 px and up), not on small glyphs


def for_images(params: ResNetParams, height: int, width: int) -> ResNetParams:
    """``params`` with every unset choice made for images of this size: on small images (8x8) one
    stage, no crops, no flips; from 16 px two stages and crops of side/8; from 32 px flips too."""
    side = min(height, width)
    stages = params.stages or (1 if side < SMALL_SIDE else 2)
    last_side = max(side >> (stages - 1), 1)
    return params.model_copy(update={
        "stages": stages,
        "pool": params.pool or min(4, last_side),
        "crop_padding": params.crop_padding if params.crop_padding is not None else (
            side // 8 if side >= SMALL_SIDE else 0),
        "flip": params.flip if params.flip is not None else side >= FLIP_SIDE,
    })


def _groups(channels: int) -> int:
    return next(g for g in (8, 4, 2, 1) if channels % g == 0)


class ResidualBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(_groups(outputs), outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(_groups(outputs), outputs)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:  # a 1x1 projection where the shapes change
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                                          nn.GroupNorm(_groups(outputs), outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, channels: int, classes: int, params: ResNetParams) -> None:
        super().__init__()
        assert params.stages is not None and params.pool is not None  # made by for_images
        self.register_buffer("mean", torch.zeros(1, channels, 1, 1))
        self.register_buffer("scale", torch.ones(1, channels, 1, 1))
        self.stem = nn.Sequential(nn.Conv2d(channels, params.width, 3, padding=1, bias=False),
                                  nn.GroupNorm(_groups(params.width), params.width), nn.ReLU())
        blocks, width = [], params.width
        for stage in range(params.stages):
            out = params.width * 2**stage
            for block in range(params.blocks):
                blocks.append(ResidualBlock(width, out, stride=2 if stage > 0 and block == 0 else 1))
                width = out
        self.blocks = nn.Sequential(*blocks)
        # A small pooled grid, not one global average: on small images where a stroke is says what it is.
        self.pool = nn.AdaptiveAvgPool2d(params.pool)
        self.head = nn.Linear(width * params.pool**2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem((x - self.mean) / self.scale))
        return self.head(self.pool(x).flatten(1))  # adaptive pooling: any input size works


def augment(images: torch.Tensor, generator: torch.Generator, padding: int, flip: bool) -> torch.Tensor:
    """Random crops and flips of a batch ``[B, C, H, W]``; the draws come from ``generator`` (on the CPU)."""
    count, _, height, width = images.shape
    if padding:
        padded = F.pad(images, (padding,) * 4)
        dy = torch.randint(0, 2 * padding + 1, (count,), generator=generator).to(images.device)
        dx = torch.randint(0, 2 * padding + 1, (count,), generator=generator).to(images.device)
        rows = (dy[:, None] + torch.arange(height, device=images.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(width, device=images.device))[:, None, None, :]
        samples = torch.arange(count, device=images.device)[:, None, None, None]
        chans = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
        images = padded[samples, chans, rows, cols]  # one gather: each sample its own window
    if flip:
        mirrored = torch.rand(count, generator=generator).to(images.device) < 0.5
        images = torch.where(mirrored[:, None, None, None], images.flip(3), images)
    return images


class ResNetSmall(TrainingTask):
    name = "resnet-small"
    Params = ResNetParams
    metric = "accuracy"

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, ResNetParams)
        if len(info.feature_shape) != 3:
            raise ValueError(f"resnet-small expects images [C, H, W], got samples of shape {info.feature_shape}")
        channels, height, width = info.feature_shape
        return SmallResNet(channels, info.num_classes, for_images(params, height, width))

    def prepare(self, model, train, params) -> None:
        with torch.no_grad():
            model.mean.copy_(train.features.mean(dim=(0, 2, 3), keepdim=True))
            model.scale.copy_(train.features.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6))

    def batches(self, data, params, batch_size, generator, device) -> Iterator[Batch]:
        chosen = for_images(params, *data.features.shape[-2:])
        order = torch.randperm(len(data), generator=generator)
        for start in range(0, len(data), batch_size):
            idx = order[start : start + batch_size]
            images = augment(data.features[idx].to(device), generator, chosen.crop_padding or 0, bool(chosen.flip))
            yield images, data.labels[idx].to(device)

    def configure_optimizer(self, model, params, config, total_steps):
        decay = [p for p in model.parameters() if p.ndim > 1]  # conv and linear weights
        rest = [p for p in model.parameters() if p.ndim <= 1]  # norms and biases
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": params.weight_decay},
                                       {"params": rest, "weight_decay": 0.0}], lr=config.learning_rate)
        return optimizer, None

    def grad_clip_norm(self, params) -> float | None:
        return params.clip_norm or None

    @torch.no_grad()
    def evaluate(self, model, data, params, device) -> dict[str, float]:
        correct = top3 = 0
        loss_sum = 0.0
        for start in range(0, len(data), 512):  # bounded memory on a big test split
            logits = model(data.features[start : start + 512].to(device)).float()
            targets = data.labels[start : start + 512].to(device)
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            correct += int((logits.argmax(dim=1) == targets).sum())
            k = min(3, logits.shape[1])
            top3 += int((logits.topk(k, dim=1).indices == targets[:, None]).any(dim=1).sum())
        return {"accuracy": correct / len(data), "loss": loss_sum / len(data), "top3_accuracy": top3 / len(data)}
