"""What a training is: its model, job settings, policies, spec, record and shards."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .. import limits
from ._base import Address, Cid, Id, Record, Wei
from ._datasets import MAX_TARGET_WIDTH, TargetKind
from ._footprint import ModelFootprint
from ._market import CPU_CLASS
from ._sizes import ByteSize
from ._tasks import TaskRef


class TrainingPhase(StrEnum):
    INITIALIZING = "initializing"
    DISTRIBUTING = "distributing"
    TRAINING = "training"
    AGGREGATING = "aggregating"
    COMPLETE = "complete"
    FAILED = "failed"


TASK_MODEL = "task"  # ModelSpec.name of a task that builds its own model (a user's, or gpt): only the shape travels


class ModelSpec(Record):
    """A model a stranger asks a provider to build: bounded field by field, then by its estimated size."""

    name: str = Field(max_length=64)
    input_shape: tuple[Annotated[int, Field(ge=1, le=limits.MAX_FEATURES)], ...] = Field(
        min_length=1, max_length=limits.MAX_INPUT_RANK)
    num_classes: int = Field(ge=0, le=limits.MAX_VOCAB, description=(
        "classes: >= 2 (a registry classifier: at most MAX_CLASSES; a token stream's vocabulary); values and none: 0"))
    hidden: int = Field(default=128, ge=1, le=limits.MAX_HIDDEN)
    target: TargetKind = "classes"
    target_width: int = Field(default=1, ge=1, le=MAX_TARGET_WIDTH, description="values: floats per row")

    @property
    def outputs(self) -> int:
        """The width of a built-in model's head: a score per class, or a prediction per target value."""
        return self.num_classes if self.target == "classes" else self.target_width

    @model_validator(mode="after")
    def _buildable(self) -> ModelSpec:
        features = 1
        for dim in self.input_shape:
            features *= dim
        if features > limits.MAX_FEATURES:
            raise ValueError(f"input_shape {self.input_shape} has {features} features, above {limits.MAX_FEATURES}")
        if (self.target == "classes") != (self.num_classes >= 2) or (self.target != "values" and self.target_width != 1):
            raise ValueError(f"a {self.target} target with {self.num_classes} classes and width {self.target_width}")
        if self.name != TASK_MODEL and self.num_classes > limits.MAX_CLASSES:  # its head is hidden x classes
            raise ValueError(f"num_classes {self.num_classes} is above {limits.MAX_CLASSES} for model {self.name!r}")
        if (problem := limits.model_size_problem(self.name, self.input_shape, max(self.outputs, 1),
                                                 self.hidden)) is not None:
            raise ValueError(problem)
        return self


class JobConfig(Record):
    """One job's local training; the defaults are tuned on digits (bench/bench_accuracy.py) and are
    the CLI's and the assistant's defaults too."""

    batch_size: int = Field(default=32, ge=1, le=65536)
    learning_rate: float = Field(default=1e-2, gt=0.0, le=10.0)
    epochs: int = Field(default=2, ge=1, le=1000)
    rounds: int = Field(default=1, ge=1, le=10_000, description=(
        "rounds a worker's kept optimizer state spans: a keep_state task's schedule runs over rounds x its steps"))
    segments: int = Field(default=64, ge=1, le=1024, description=(
        "a job's steps are committed in this many segments (fewer when it has fewer steps): the unit a spot "
        "check re-executes"))


Partition = Literal["iid", "dirichlet"]
OuterName = Literal["fedavg", "diloco"]
UpdateEncoding = Literal["weights", "float32", "bf16", "int8"]
AggregationName = Literal["fedavg", "median", "trimmed-mean", "krum", "multi-krum", "norm-clip"]
ExperimentLogName = Literal["tensorboard", "wandb", "mlflow"]


class FaultPolicy(Record):
    """How the coordinator detects and handles crashed, slow and dishonest workers.

    Stored with the training, so a resumed coordinator applies the same rules.
    """

    heartbeat_timeout_s: float = Field(default=10.0, gt=0.0, description="silence after which a worker is pinged")
    ping_timeout_s: float = Field(default=2.0, gt=0.0, description="no pong within this: the worker is failed")
    straggler_gap_points: float = Field(default=20.0, gt=0.0, le=100.0,
                                        description="progress this far below the average marks a straggler")
    straggler_grace: float = Field(default=1.5, ge=1.0,
                                   description="...once it ran this many times the median of finished jobs")
    straggler_min_s: float = Field(default=5.0, ge=0.0,
                                   description="...and at least this many seconds: a job of a second is not "
                                               "copied for lagging half of one")
    deadline_quantile: float = Field(default=0.9, gt=0.0, le=1.0)
    deadline_factor: float = Field(default=2.0, ge=1.0, description="deadline = factor x quantile of past rounds, "
                                                                     "or factor x the work at the assumed speed")
    min_deadline_s: float = Field(default=5.0, gt=0.0, description="seconds: the shortest deadline from history")
    first_round_deadline_s: float = Field(default=120.0, gt=0.0,
                                          description="seconds: the shortest deadline of a provider without history "
                                                      "(a bigger job gets its work at assumed_samples_per_s)")
    assumed_samples_per_s: float = Field(default=50.0, gt=0.0,
                                         description="sample passes per second expected of a provider without "
                                                     "history: sizes first-round deadlines by a job's work")
    round_timeout_s: float | None = Field(default=None, gt=0.0,
                                          description="seconds a round may run before the training fails; None: "
                                                      "round_timeout_factor x its longest job deadline")
    round_timeout_factor: float = Field(default=3.0, ge=1.0,
                                        description="a derived round timeout, times the longest job deadline")
    min_round_timeout_s: float = Field(default=600.0, gt=0.0, description="seconds: the shortest derived round timeout")
    norm_bound: float = Field(default=5.0, gt=1.0, description="update norm limit, times the round's median")
    val_loss_tolerance: float = Field(default=0.5, ge=0.0,
                                      description="allowed relative rise of validation loss over the round's start")
    val_loss_margin: float = Field(default=0.5, ge=0.0, description="allowed absolute rise, in nats")
    val_samples: int = Field(default=256, ge=1, description=(
        "labelled test samples each result is scored on, drawn in secret each round"))
    val_tokens: int = Field(default=16384, ge=1, description=(
        "test tokens each result of a language model is scored on (windows drawn in secret each round); the "
        "full evaluation runs once per round, on the new model"))
    fetch_timeout_s: float = Field(default=10.0, gt=0.0, description="seconds to fetch a worker's checkpoint")
    resend_timeout_s: float = Field(default=10.0, gt=0.0,
                                    description="how long a worker has to re-send a missing or corrupt checkpoint")
    max_replacements: int = Field(default=8, ge=0, description="per training, before it fails")
    min_update_ratio: float = Field(default=0.1, ge=0.0, le=1.0, description=(
        "an update whose norm per committed step is below this times the round's median is missing work"))
    near_copy_distance: float = Field(default=1e-3, ge=0.0, description=(
        "two updates of one round closer than this (relative) are held for a spot check as possible copies"))
    spot_checks: int = Field(default=5, ge=0, le=16, description=(
        "committed segments re-executed per result (0: no spot checks)"))
    opening_timeout_s: float = Field(default=30.0, gt=0.0, description=(
        "seconds a worker has to open the segments a spot check asks for"))
    reexec_tolerance: float = Field(default=0.05, ge=0.0, description=(
        "a re-executed segment may end this far (relative to the segment's own change) from the committed end "
        "state when the two devices differ; on equal CPUs the states must be equal bit for bit"))
    verify_on: Literal["coordinator", "market", "auto"] = Field(default="auto", description=(
        "who re-executes a spot check's segments: the coordinator's CPU, or verifiers hired among the training's "
        "other workers of the checked worker's device class (the coordinator trains one step of a disputed segment, "
        "replays one nobody answered for, and falls back to its own check when no verifier is eligible); auto: the market for a worker hired as "
        "anything but a CPU and for a model of at least market_verify_parameters, else the coordinator"))
    market_verify_parameters: int = Field(default=25_000_000, ge=1, description=(
        "with verify_on=auto, a model of at least this many parameters (as its jobs declare) is verified on the "
        "market even on CPUs"))
    verify_timeout_s: float = Field(default=120.0, gt=0.0, description=(
        "seconds a verifier has to fetch the inputs and report, beyond re-executing the segment at twice the "
        "worker's measured time"))
    canary_rate: float = Field(default=0.2, ge=0.0, le=1.0, description=(
        "share of verifications sent as canaries (a perturbed start whose true end cannot be the committed one): "
        "a verifier that reports the committed end for one is lazy, and slashed"))

    def verified_on_market(self, device_class: str, parameters: int) -> bool:
        """Whether a check of a worker hired as ``device_class`` on a model of ``parameters`` goes to verifiers:
        always with ``market``, never with ``coordinator``; with ``auto`` when the coordinator's CPU cannot
        reproduce the worker's sums (it was not hired as a CPU) or the model has at least
        ``market_verify_parameters`` (too much to re-execute on the customer's machine)."""
        if self.verify_on != "auto":
            return self.verify_on == "market"
        return device_class != CPU_CLASS or parameters >= self.market_verify_parameters


class ElasticPolicy(Record):
    """An elastic pool: hire below ``scale_up_below`` x target throughput, release above
    ``scale_down_above`` x, both sustained ``window_rounds`` rounds; move data off slow workers."""

    target_samples_per_s: float = Field(gt=0.0, description="samples trained per second of round time")
    min_workers: int = Field(default=1, ge=1)
    max_workers: int = Field(default=64, ge=1)
    scale_up_below: float = Field(default=0.7, gt=0.0)
    scale_down_above: float = Field(default=1.3, gt=0.0)
    window_rounds: int = Field(default=2, ge=1)
    rebalance_ratio: float = Field(default=1.5, gt=1.0, description="a round this many times the median is slow")
    min_shard_samples: int = Field(default=16, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> ElasticPolicy:
        if self.min_workers > self.max_workers:
            raise ValueError("min_workers cannot exceed max_workers")
        if self.scale_up_below >= self.scale_down_above:
            raise ValueError("scale_up_below must be below scale_down_above")
        return self


class SampleRange(Record):
    """Samples [start, end) of original shard ``shard``, in the shard's own order."""

    shard: int = Field(ge=0)
    start: int = Field(ge=0)
    end: int = Field(ge=1)


class TrainingSpec(Record):
    model_type: str = Field(max_length=64, description="a built-in task's name (the seed's --model-type)")
    task: TaskRef | None = Field(default=None, description="the task to run; None: the built-in named model_type")
    target_workers: int = Field(ge=1, le=1024)
    rounds: int = Field(default=5, ge=1, le=10_000)
    job: JobConfig = JobConfig()
    partition: Partition = "iid"
    dirichlet_alpha: float = Field(default=0.5, gt=0.0)
    target: TargetKind | None = Field(default=None, description=(
        "the labelled data's target: classes, values (regression) or none; None: detected from the data"))
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    seed: int = 0
    max_price_wei: Wei | None = None
    min_stake_wei: Wei | None = Field(default=None, description=(
        "hire only providers with at least this bond in the registry; None: the network's "
        "(0.01 ETH, 0 on the embedded network)"))
    vocab_size: int | None = Field(default=None, ge=256, le=limits.MAX_VOCAB, description=(
        "a text corpus: learn a byte-level BPE of this many tokens at import; None: one token per byte"))
    dataset_size: ByteSize | None = Field(default=None, description=(
        "the most bytes the dataset may hold (100GB, 512MiB or bytes); a larger upload is refused"))
    aggregation: AggregationName = "fedavg"
    outer: OuterName = Field(default="fedavg", description=(
        "fedavg: the new model is the aggregate of the workers'; diloco: the aggregate's change is a "
        "pseudo-gradient for SGD with Nesterov momentum on the coordinator"))
    outer_lr: float = Field(default=0.7, gt=0.0, le=10.0, description="diloco: the outer learning rate")
    outer_momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="diloco: the outer Nesterov momentum")
    update_encoding: UpdateEncoding | None = Field(default=None, description=(
        "what workers upload: their weights, or their change over the round as float32, bf16 or blockwise int8 "
        "(with error feedback); None: weights under fedavg, float32 under diloco"))
    spare_workers: int = Field(default=0, ge=0, le=64, description="hired but unfunded, to replace failed workers")
    encrypt: bool = Field(default=False, description=(
        "store the dataset sealed (AES-256-GCM) under a key only the coordinator and hired providers hold"))
    faults: FaultPolicy = FaultPolicy()
    elastic: ElasticPolicy | None = None
    log_to: tuple[ExperimentLogName, ...] = Field(default=("tensorboard",), max_length=3, description=(
        "the experiment logs each round is written to, in the training's directory (or where the library is "
        "configured to write); empty: none"))
    footprint: ModelFootprint | None = Field(default=None, description=(
        "the model's size as the rehearsal measured it before funding (set by the coordinator, not the user)"))

    @property
    def upload_encoding(self) -> UpdateEncoding:
        """What a job's result holds: the spec's choice, else the outer optimizer's natural one."""
        if self.update_encoding is not None:
            return self.update_encoding
        return "float32" if self.outer == "diloco" else "weights"


class TrainingRecord(Record):
    training_id: Id
    spec: TrainingSpec
    phase: TrainingPhase = TrainingPhase.INITIALIZING
    round: int = Field(default=0, ge=0)
    coordinator: Address
    wallet: str | None = Field(default=None, description="wallet name of the coordinator, for later commands")
    dataset_cid: Cid | None = None
    manifest_cid: Cid | None = None
    model_cid: Cid | None = None
    outer_state_cid: Cid | None = Field(default=None, description="diloco: the outer momentum after the last round")
    model_base_cid: Cid | None = Field(default=None, description="the model before the last round")
    model_delta_cid: Cid | None = Field(default=None, description=(
        "model_cid as an encoded change from model_base_cid: what a worker that holds the base fetches instead"))
    broadcast_residual_cid: Cid | None = Field(default=None, description=(
        "what encoding the model's change lost so far (the coordinator's error feedback)"))
    escrow_id: str | None = None
    created_at: float = Field(default_factory=time.time)

    @property
    def status(self) -> str:
        return self.phase.value


class Shard(Record):
    shard_id: Id
    index: int = Field(ge=0)
    cid: Cid
    samples: int = Field(ge=1)
    label_counts: tuple[int, ...] = Field(max_length=limits.MAX_CLASSES)


class ShardManifest(Record):
    dataset_cid: Cid
    test_cid: Cid
    partition: Partition
    seed: int
    num_classes: int = Field(ge=0, le=limits.MAX_VOCAB, description="0: a values target or none; a vocabulary")
    feature_shape: tuple[int, ...] = Field(max_length=limits.MAX_INPUT_RANK)
    shards: tuple[Shard, ...] = Field(max_length=limits.MAX_SHARDS)

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)


