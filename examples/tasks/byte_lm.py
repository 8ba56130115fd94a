"""A small byte-level language model on a text corpus: a task that reads token shards.

Run it on a directory of ``*.txt`` files (the import tokenizes them into byte tokens)::

    aitbc distributed-training run --task examples/tasks/byte_lm.py --data-path ./corpus \\
        --target-workers 2 --rounds 3 --lr 3e-3 --yes

What it shows:
- ``batches`` reads the shard as it arrives, a :class:`TokenData` of memory-mapped token files:
  random windows of ``context`` tokens, drawn with the job's seeded generator, never the whole
  shard in memory;
- the model predicts each next byte from the ``context`` before it (an embedding, a causal
  1-D convolution and an MLP: small enough for a CPU);
- ``evaluate`` reports the mean next-token cross-entropy in nats (``loss``) and bits per byte
  (the task's ``metric``, lower is better), on a bounded number of windows of the test split.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class ByteParams(TaskParams):
    context: int = Field(default=32, ge=2, le=1024, description="tokens of context per prediction")
    width: int = Field(default=64, ge=8, le=1024, description="embedding and hidden width")
    windows_per_epoch: int = Field(default=256, ge=1, le=1_000_000, description="training windows an epoch draws")
    eval_windows: int = Field(default=128, ge=1, le=100_000, description="test windows evaluate reads")


class ByteModel(nn.Module):
    def __init__(self, vocab: int, params: ByteParams) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, params.width)
        self.conv = nn.Conv1d(params.width, params.width, kernel_size=4, padding=3)  # causal after trimming
        self.head = nn.Sequential(nn.GELU(), nn.Linear(params.width, params.width), nn.GELU(),
                                  nn.Linear(params.width, vocab))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, vocab]
        h = self.embed(tokens).transpose(1, 2)
        h = self.conv(h)[..., : tokens.shape[1]].transpose(1, 2)
        return self.head(h)


def windows(parts, count: int, context: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``context + 1`` tokens at random places (a part shorter than that is skipped)."""
    usable = [p for p in parts if len(p) > context + 1]
    if not usable:
        raise ValueError(f"no token file holds more than {context + 1} tokens")
    sizes = torch.tensor([len(p) - context - 1 for p in usable], dtype=torch.float64)
    which = torch.multinomial(sizes, count, replacement=True, generator=generator)
    out = np.empty((count, context + 1), dtype=np.int64)
    for row, part in enumerate(which.tolist()):
        start = int(torch.randint(0, int(sizes[part]) + 1, (1,), generator=generator))
        out[row] = usable[part][start:start + context + 1]
    return torch.from_numpy(out)


class ByteLM(TrainingTask):
    name = "byte-lm"
    Params = ByteParams
    metric = "bits_per_byte"
    higher_is_better = False

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, ByteParams)
        return ByteModel(info.num_classes, params)  # a token dataset's num_classes is its vocabulary

    def batches(self, data, params, batch_size, generator, device):
        assert isinstance(params, ByteParams)
        drawn = windows(data.parts, params.windows_per_epoch, params.context, generator)
        for start in range(0, len(drawn), batch_size):
            chunk = drawn[start:start + batch_size].to(device)
            yield chunk[:, :-1], chunk[:, 1:]

    def steps_per_epoch(self, data, params, batch_size):
        return math.ceil(params.windows_per_epoch / batch_size)

    def loss(self, model, batch, params):
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model, data, params, device):
        assert isinstance(params, ByteParams)
        model.eval()
        drawn = windows(data.parts, params.eval_windows, params.context, torch.Generator().manual_seed(0))
        total = 0.0
        for start in range(0, len(drawn), 64):
            chunk = drawn[start:start + 64].to(device)
            total += float(self.loss(model, (chunk[:, :-1], chunk[:, 1:]), params)) * len(chunk)
        nats = total / len(drawn)
        return {"loss": nats, "bits_per_byte": nats / math.log(2)}
