"""The distributed-training commands' options: one spelling each (the seed's), the others as aliases,
choices as enums so completion and help list them, defaults and ranges from the SDK's records."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional, get_args

import typer

from aitbc_agent_sdk.market import DEFAULT_MIN_STAKE_WEI
from aitbc_agent_sdk.records import (AggregationName, ExperimentLogName, FaultPolicy, JobConfig, OuterName, Partition,
                                     TrainingSpec, UpdateEncoding)
from aitbc_agent_sdk.tracking import experiment_log_problems
from aitbc_agent_sdk.records import TargetKind

from .common import eth_amount_option
from .params import format_eth

JOB = JobConfig.model_fields  # the tuned defaults: one place, shared with the assistant


class ModelType(str, Enum):
    """The SDK's model builders (aitbc_agent_sdk.tasks._networks.MODEL_NAMES; a test keeps the two equal)."""

    mlp = "mlp"
    cnn = "cnn"
    transformer = "transformer"


PartitionChoice = Enum("PartitionChoice", {v: v for v in get_args(Partition)}, type=str)  # type: ignore[misc]
OuterChoice = Enum("OuterChoice", {v: v for v in get_args(OuterName)}, type=str)  # type: ignore[misc]
EncodingChoice = Enum("EncodingChoice", {v: v for v in get_args(UpdateEncoding)}, type=str)  # type: ignore[misc]
AggregationChoice = Enum("AggregationChoice", {v: v for v in get_args(AggregationName)}, type=str)  # type: ignore[misc]
TargetChoice = Enum("TargetChoice", {v: v for v in get_args(TargetKind)}, type=str)  # type: ignore[misc]
VerifyOnChoice = Enum("VerifyOnChoice", {v: v for v in get_args(  # type: ignore[misc]
    FaultPolicy.model_fields["verify_on"].annotation)}, type=str)

LogToChoice = Enum("LogToChoice", {v: v for v in (*get_args(ExperimentLogName), "none")},  # type: ignore[misc]
                   type=str)


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
TargetOption = Annotated[Optional[TargetChoice], typer.Option(  # type: ignore[valid-type]
    "--target", help="what the labels are: classes, values (regression: floats, one or a vector per row) or none "
                     "(no target); detected from the data when not given")]
VocabSizeOption = Annotated[Optional[int], typer.Option(
    "--vocab-size", min=256, metavar="TOKENS",
    help="a text corpus: learn a byte-level BPE of this many tokens on it (8192 to 50000 is usual; 256: one token "
         "per byte, the default)")]
AggregationChoiceOption = Annotated[AggregationChoice, typer.Option(  # type: ignore[valid-type]
    "--aggregation", help="how updates are combined; median, trimmed-mean, krum, multi-krum and norm-clip "
                          "resist dishonest workers")]
SPEC = TrainingSpec.model_fields
OuterOption = Annotated[OuterChoice, typer.Option(  # type: ignore[valid-type]
    "--outer", help="the outer optimizer: fedavg (the model is the workers' average) or diloco (the average change "
                    "is a pseudo-gradient for Nesterov SGD; workers keep their inner optimizer across rounds)")]
OuterLrOption = Annotated[float, typer.Option(
    "--outer-lr", min=0.001, max=10.0, help="diloco's outer learning rate")]
OuterMomentumOption = Annotated[float, typer.Option(
    "--outer-momentum", min=0.0, max=0.999, help="diloco's outer Nesterov momentum")]
UpdateEncodingOption = Annotated[Optional[EncodingChoice], typer.Option(  # type: ignore[valid-type]
    "--update-encoding", help="what workers upload: weights, or their change as float32, bf16 or blockwise int8 "
                              "(error feedback kept on the provider) [default: weights under fedavg, float32 "
                              "under diloco]")]
TrainingIdOption = Annotated[str, typer.Option("--training-id", metavar="ID", help="the training (training_...)")]
TrainingIdArgument = Annotated[str, typer.Argument(metavar="TRAINING_ID", help="the training (training_...)")]
MinGpuOption = Annotated[Optional[str], typer.Option(
    "--min-gpu", "--gpu", help="slowest GPU accepted, e.g. RTX3090; 'cpu' or omitted accepts any")]
MinStakeOption = Annotated[Optional[int], eth_amount_option(
    "--min-stake", help=f"hire only providers bonded in the registry with at least this much (default "
                        f"{format_eth(DEFAULT_MIN_STAKE_WEI)} ETH; 0 on the embedded network, whose providers are "
                        f"this machine's own processes): an identity costs nothing, a bond makes a sybil pay")]
PlotOption = Annotated[Optional[Path], typer.Option(
    "--plot", metavar="PNG", help="write accuracy/loss curves to this PNG (checked before anything is paid)")]

# FaultPolicy's timeouts, each a flag; defaults and factors from the record, so help and SDK agree.
FAULTS = FaultPolicy.model_fields
_FACTOR, _ROUND_FACTOR = FAULTS["deadline_factor"].default, FAULTS["round_timeout_factor"].default
PingTimeoutOption = Annotated[float, typer.Option(
    "--ping-timeout", min=0.1, metavar="SECONDS", help="seconds a silent worker has to answer a ping before it is "
                                                       "replaced")]
FirstRoundDeadlineOption = Annotated[float, typer.Option(
    "--first-round-deadline", min=0.1, metavar="SECONDS",
    help=f"seconds a job on a provider with no round here yet may run before a spare gets a copy; the floor: a "
         f"bigger job gets {_FACTOR:g} x its work (samples x epochs) at --assumed-samples-per-s")]
AssumedSpeedOption = Annotated[float, typer.Option(
    "--assumed-samples-per-s", min=0.001, metavar="RATE",
    help="samples x epochs per second expected of a provider before its first round here: sizes the first "
         "deadline of a big job")]
MinDeadlineOption = Annotated[float, typer.Option(
    "--min-deadline", min=0.1, metavar="SECONDS",
    help=f"seconds: the shortest deadline of a provider with past rounds here (its deadline is {_FACTOR:g} x the "
         f"{FAULTS['deadline_quantile'].default:g} quantile of its round times, at least this)")]
StragglerMinOption = Annotated[float, typer.Option(
    "--straggler-min", min=0.0, metavar="SECONDS",
    help=f"seconds a job must have run, besides {FAULTS['straggler_grace'].default:g} x the round's finished jobs' "
         f"median, before a spare gets a copy of it as a straggler")]
RoundTimeoutOption = Annotated[Optional[float], typer.Option(
    "--round-timeout", min=0.1, metavar="SECONDS", help="seconds a round may run before the training fails",
    show_default=f"{_ROUND_FACTOR:g} x the round's longest job deadline, at least --min-round-timeout")]
MinRoundTimeoutOption = Annotated[float, typer.Option(
    "--min-round-timeout", min=0.1, metavar="SECONDS", help="seconds: the shortest derived round timeout")]
FetchTimeoutOption = Annotated[float, typer.Option(
    "--fetch-timeout", min=0.1, metavar="SECONDS",
    help="seconds to fetch a worker's checkpoint from the content store before asking it to re-send")]
OpeningTimeoutOption = Annotated[float, typer.Option(
    "--opening-timeout", min=0.1, metavar="SECONDS",
    help="seconds a worker has to open the committed segments a spot check asks for")]
SpotChecksOption = Annotated[int, typer.Option(
    "--spot-checks", min=0, max=16, help="committed segments of each result re-executed by the coordinator "
    "(0: no spot checks)")]
VerifyOnOption = Annotated[VerifyOnChoice, typer.Option(  # type: ignore[valid-type]
    "--verify-on", help="who re-executes a spot check's segments: the coordinator's CPU, or verifiers hired among "
                        "the training's other workers of the same device class (the coordinator then trains one "
                        "step of a disputed segment, or replays one nobody answered for); auto: verifiers for a worker hired as a GPU and for a model of "
                        f"{FaultPolicy.model_fields['market_verify_parameters'].default / 1e6:g}M parameters or more, "
                        "this machine otherwise")]
VerifyTimeoutOption = Annotated[float, typer.Option(
    "--verify-timeout", min=0.1, metavar="SECONDS",
    help="seconds a verifier has to fetch the inputs and report, beyond re-executing the segment at twice the "
         "worker's measured time (with --verify-on market)")]
CanaryRateOption = Annotated[float, typer.Option(
    "--canary-rate", min=0.0, max=1.0, metavar="SHARE",
    help="share of verifications sent as canaries, whose committed end a lazy verifier would approve (with "
         "--verify-on market)")]


def _dirichlet_alpha(value: float) -> float:
    # TrainingSpec wants alpha > 0; an open range typer cannot show, so the check and the help say it (as --lr's).
    if not value > 0.0:
        raise typer.BadParameter(f"{value} is not above 0")
    return value


AlphaOption = Annotated[float, typer.Option(
    "--alpha", callback=_dirichlet_alpha,
    help="Dirichlet concentration, above 0: lower is more skewed (with --partition dirichlet)")]
ResendTimeoutOption = Annotated[float, typer.Option(
    "--resend-timeout", min=0.1, metavar="SECONDS",
    help="seconds a worker has to re-send a checkpoint that could not be fetched before its work moves")]


def _installed(chosen: Optional[list[Any]]) -> Optional[list[Any]]:
    """Refuse a log whose library is missing while the options are parsed: before anything is funded."""
    if problems := experiment_log_problems(v.value for v in chosen or () if v.value != "none"):
        raise typer.BadParameter("; ".join(problems))
    return chosen


def log_to_names(chosen: Optional[list[Any]]) -> tuple[str, ...]:
    """The spec's ``log_to``: TensorBoard when none is named, nothing for ``none``, else those named, once each."""
    if not chosen:
        return TrainingSpec.model_fields["log_to"].default  # type: ignore[no-any-return]
    names = [getattr(v, "value", v) for v in chosen]
    return () if "none" in names else tuple(dict.fromkeys(names))


LogToOption = Annotated[Optional[list[LogToChoice]], typer.Option(  # type: ignore[valid-type]
    "--log-to", callback=_installed, help="write each round's metrics, workers' losses, bytes, spend and "
    "verification to this experiment log (repeatable): tensorboard (the default, event files in the training's "
    "directory), wandb, mlflow (optional extras), or none")]
