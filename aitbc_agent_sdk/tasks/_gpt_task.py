"""The built-in ``gpt`` task: a language model (:mod:`~aitbc_agent_sdk.tasks._gpt`) on a token dataset.

Data: each epoch draws ``windows_per_epoch`` windows of ``context + 1`` tokens at random places of
the shard's memory-mapped parts (with the job's seeded generator; only those tokens are read), and
the model learns to predict every token from the ones before it. Optimizer: AdamW, linear warm-up
then cosine decay to ``min_lr_ratio`` of the job's learning rate over all the rounds a worker's
kept state spans (``steps x JobConfig.rounds``): the task keeps its optimizer and scheduler on the
provider (``keep_state``), so the schedule continues from round to round instead of restarting.
Weight decay applies to the matrices (linear weights and the tied token embedding, which is also
the output layer), not to biases, LayerNorms or the position table, as in GPT-2 and nanoGPT's
practice of decaying only what multiplies activations. Metrics on a fixed set of test windows:
``loss`` (nats per token), ``perplexity`` (the task's metric, lower is better) and ``bits_per_token``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk.errors import ConfigError, DatasetError
from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.tasks._gpt import GPT, GptConfig
from aitbc_agent_sdk.data._shard_files import TokenData
from aitbc_agent_sdk.tasks._task import Batch, DataInfo, Scheduler, TaskParams, TrainingTask

EVAL_SEED = 0  # every evaluation of a training reads the same test windows: scores compare across rounds
EVAL_BATCH = 64  # test windows per forward pass
REHEARSAL_WINDOWS = 8  # what the dry run before funding trains and evaluates on


class GptParams(TaskParams):
    layers: int = Field(default=4, ge=1, le=48, description="transformer blocks")
    heads: int = Field(default=4, ge=1, le=64, description="attention heads per block (width must divide by it)")
    width: int = Field(default=128, ge=8, le=4096, description="embedding width (d_model)")
    context: int = Field(default=128, ge=2, le=4096, description="tokens the model sees at once")
    dropout: float = Field(default=0.0, ge=0.0, le=0.9, description="dropout on embeddings, attention and MLP")
    windows_per_epoch: int = Field(default=256, ge=1, le=1_000_000,
                                   description="training windows of context+1 tokens drawn per epoch")
    eval_windows: int = Field(default=256, ge=1, le=100_000, description="test windows evaluate reads")
    eval_seed: int = Field(default=EVAL_SEED, ge=0, lt=1 << 63, description=(
        "which test windows evaluate reads; a result's check draws its own in secret each round"))
    warmup_steps: int = Field(default=20, ge=0, le=1_000_000, description="steps of linear learning-rate warm-up")
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0,
                                description="the cosine decay ends at this fraction of the learning rate")
    weight_decay: float = Field(default=0.1, ge=0.0, le=10.0, description="AdamW weight decay of the matrices")
    grad_clip: float = Field(default=1.0, ge=0.0, le=1000.0,
                             description="clip the gradients' global L2 norm to this; 0: no clipping")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> GptParams:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads {self.heads}")
        return self


def token_data(data: Any) -> TokenData:
    """``data`` as a token stream, or a usage error that says what the task needs."""
    if not isinstance(data, TokenData):
        raise ConfigError(f"the gpt task trains on a token dataset: got {type(data).__name__}; import a text "
                          f"corpus as tokens (a directory of .txt files) and train on that")
    return data


def draw_windows(data: TokenData, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` tokens (int64 ``[count, length]``), each start uniform over all the
    places a window fits; a part shorter than ``length`` is skipped. Reads only the drawn tokens."""
    usable = [part for part in data.parts if len(part) >= length]
    if not usable:
        raise ConfigError(f"the gpt task needs a part of at least {length} tokens (context + 1); the longest "
                          f"holds {max((len(p) for p in data.parts), default=0)}: lower context")
    starts_per_part = torch.tensor([len(part) - length + 1 for part in usable], dtype=torch.float64)
    which = torch.multinomial(starts_per_part, count, replacement=True, generator=generator)
    room = starts_per_part[which]
    starts = torch.minimum((torch.rand(count, generator=generator, dtype=torch.float64) * room).long(),
                           room.long() - 1)
    out = np.empty((count, length), dtype=np.int64)
    offsets = np.arange(length)
    which_np, starts_np = which.numpy(), starts.numpy()
    for index, part in enumerate(usable):
        rows = np.flatnonzero(which_np == index)
        if len(rows):
            out[rows] = part[starts_np[rows, None] + offsets]  # fancy indexing a memmap reads just these
    windows = torch.from_numpy(out)
    if windows.numel() and int(windows.max()) >= data.vocab_size:  # strangers' bytes: an embedding would crash
        raise DatasetError(f"the token dataset holds token {int(windows.max())}, outside its vocabulary of "
                           f"{data.vocab_size}")
    return windows


def warmup_cosine(warmup_steps: int, horizon: int, min_lr_ratio: float) -> Callable[[int], float]:
    """The learning-rate factor of step ``s``: linear warm-up to 1, cosine decay to ``min_lr_ratio`` at
    ``horizon``, then flat. A plain function: LambdaLR's state then holds only its step count."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, horizon - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class GptTask(TrainingTask):
    """A GPT trained on next-token prediction; see the module's docstring."""

    name = "gpt"
    Params = GptParams
    metric = "perplexity"
    higher_is_better = False
    bf16 = True
    keep_state = True

    def rehearsal_params(self, params: TaskParams) -> TaskParams:
        """A dry run draws a few windows: the same code path, in seconds on the coordinator's CPU."""
        assert isinstance(params, GptParams)
        return params.model_copy(update={"windows_per_epoch": min(params.windows_per_epoch, REHEARSAL_WINDOWS),
                                         "eval_windows": min(params.eval_windows, REHEARSAL_WINDOWS)})

    def checking_params(self, params: TaskParams, tokens: int, seed: int) -> TaskParams:
        assert isinstance(params, GptParams)
        windows = max(1, min(params.eval_windows, tokens // (params.context + 1)))
        return params.model_copy(update={"eval_windows": windows, "eval_seed": seed})

    def model_config(self, info: DataInfo, params: GptParams) -> GptConfig:
        return GptConfig(vocab_size=info.num_classes, layers=params.layers, heads=params.heads, width=params.width,
                         context=params.context, dropout=params.dropout)

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, GptParams)
        return GPT(self.model_config(info, params))  # a token dataset's num_classes is its vocabulary

    def prepare(self, model: nn.Module, train: Any, params: TaskParams) -> None:
        token_data(train)  # on the coordinator, before round 1: a dataset of another kind is refused now

    def batches(self, data: Any, params: TaskParams, batch_size: int, generator: torch.Generator,
                device: torch.device) -> Iterator[Batch]:
        assert isinstance(params, GptParams)
        drawn = draw_windows(token_data(data), params.windows_per_epoch, params.context + 1, generator)
        drawn = drawn.to(device, non_blocking=True)  # one copy per epoch, not one per batch
        for start in range(0, len(drawn), batch_size):
            chunk = drawn[start : start + batch_size]
            yield chunk[:, :-1], chunk[:, 1:]

    def steps_per_epoch(self, data: Any, params: TaskParams, batch_size: int) -> int:
        assert isinstance(params, GptParams)
        return math.ceil(params.windows_per_epoch / batch_size)

    def loss(self, model: nn.Module, batch: Batch, params: TaskParams) -> torch.Tensor:
        inputs, targets = batch
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def configure_optimizer(self, model: nn.Module, params: TaskParams, config: JobConfig,
                            total_steps: int) -> tuple[torch.optim.Optimizer, Scheduler | None]:
        assert isinstance(params, GptParams)
        decayed, kept = [], []
        for name, parameter in model.named_parameters():
            (decayed if parameter.ndim >= 2 and "position_embedding" not in name else kept).append(parameter)
        optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": params.weight_decay},
                                       {"params": kept, "weight_decay": 0.0}],
                                      lr=config.learning_rate, betas=(0.9, 0.95))
        horizon = total_steps * config.rounds  # the kept scheduler continues through every round
        schedule = warmup_cosine(params.warmup_steps, horizon, params.min_lr_ratio)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    def grad_clip_norm(self, params: TaskParams) -> float | None:
        assert isinstance(params, GptParams)
        return params.grad_clip or None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: Any, params: TaskParams, device: torch.device) -> dict[str, float]:
        assert isinstance(params, GptParams)
        drawn = draw_windows(token_data(data), params.eval_windows, params.context + 1,
                             torch.Generator().manual_seed(params.eval_seed))
        nats = torch.zeros((), dtype=torch.float64, device=device)
        for start in range(0, len(drawn), EVAL_BATCH):
            chunk = drawn[start : start + EVAL_BATCH].to(device)
            nats += self.loss(model, (chunk[:, :-1], chunk[:, 1:]), params).double() * len(chunk)
        loss = float(nats) / len(drawn)
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "bits_per_token": loss / math.log(2)}
