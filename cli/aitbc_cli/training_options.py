"""The distributed-training commands' options: one spelling each (the seed's), the others as aliases,
choices as enums so completion and help list them, defaults and ranges from the SDK's records."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional, get_args

import typer

from aitbc_agent_sdk.models import AggregationName, JobConfig, Partition

JOB = JobConfig.model_fields  # the tuned defaults: one place, shared with the assistant


class ModelType(str, Enum):
    """The SDK's model builders (aitbc_agent_sdk.training.MODEL_NAMES; a test keeps the two equal)."""

    mlp = "mlp"
    cnn = "cnn"
    transformer = "transformer"


PartitionChoice = Enum("PartitionChoice", {v: v for v in get_args(Partition)}, type=str)  # type: ignore[misc]
AggregationChoice = Enum("AggregationChoice", {v: v for v in get_args(AggregationName)}, type=str)  # type: ignore[misc]


class Strategy(str, Enum):
    data_parallel = "data-parallel"


ModelTypeOption = Annotated[ModelType, typer.Option("--model-type", "--model", help="model to train")]
TargetWorkersOption = Annotated[int, typer.Option("--target-workers", "--workers", min=1, max=1024,
                                                  help="workers to hire (one data shard each)")]
RoundsOption = Annotated[int, typer.Option("--rounds", min=1, max=10_000, help="federated rounds")]
EpochsOption = Annotated[int, typer.Option("--epochs", min=1, max=1000, help="local epochs per round")]
BatchSizeOption = Annotated[int, typer.Option("--batch-size", min=1, max=65536, help="local mini-batch size")]


def _learning_rate(value: float) -> float:
    # typer cannot show an open range (x>0): the check and the help say the same thing instead.
    if not 0.0 < value <= 10.0:
        raise typer.BadParameter(f"{value} is not in 0 < lr <= 10")
    return value


LrOption = Annotated[float, typer.Option(
    "--lr", "--learning-rate", callback=_learning_rate, metavar="FLOAT",
    help="Adam learning rate, 0 < lr <= 10 (tuned on digits: bench/bench_accuracy.py)")]
PartitionOption = Annotated[PartitionChoice, typer.Option(  # type: ignore[valid-type]
    "--partition", help="how the data is split: iid, or dirichlet (non-IID label skew)")]
SeedOption = Annotated[int, typer.Option("--seed", help="seed of the data split and the first model")]
AggregationChoiceOption = Annotated[AggregationChoice, typer.Option(  # type: ignore[valid-type]
    "--aggregation", help="how updates are combined; median, trimmed-mean, krum, multi-krum and norm-clip "
                          "resist dishonest workers")]
TrainingIdOption = Annotated[str, typer.Option("--training-id", metavar="ID", help="the training (training_...)")]
TrainingIdArgument = Annotated[str, typer.Argument(metavar="TRAINING_ID", help="the training (training_...)")]
MinGpuOption = Annotated[Optional[str], typer.Option(
    "--min-gpu", "--gpu", help="slowest GPU accepted, e.g. RTX3090; 'cpu' or omitted accepts any")]
PlotOption = Annotated[Optional[Path], typer.Option(
    "--plot", metavar="PNG", help="write accuracy/loss curves to this PNG (checked before anything is paid)")]
