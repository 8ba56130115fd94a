"""Records and messages, validated with pydantic v2 at every boundary.

Every record also answers ``record["field"]`` so the seed scenario's dict-style
access keeps working; attribute access is the primary API.
"""

from __future__ import annotations

import re
import time
import uuid
from functools import lru_cache
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from eth_utils import is_address, to_checksum_address
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from . import limits
from .errors import UnsafeNameError


@lru_cache(maxsize=4096)
def _checksum(value: str) -> str:
    # Cached: checksumming is a pure-Python keccak, and the same few addresses appear in
    # every message an agent receives.
    if not is_address(value):
        raise ValueError(f"not an Ethereum address: {value!r}")
    return to_checksum_address(value)


def _cid(value: str) -> str:
    # CIDv0 is base58btc "Qm..." (46 chars); CIDv1 here is base32 lower-case "b...".
    if value.startswith("Qm") and len(value) == 46:
        return value
    if value.startswith("b") and 10 < len(value) <= limits.CID_MAX_LENGTH and value[1:].isalnum() and value == value.lower():
        return value
    raise ValueError(f"not a CID: {value!r}")


Address = Annotated[str, AfterValidator(_checksum)]
Cid = Annotated[str, AfterValidator(_cid)]
Wei = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Finite = Annotated[float, Field(allow_inf_nan=False)]  # NaN is stored as null and would not read back
Text = Annotated[str, Field(max_length=limits.TEXT_MAX_LENGTH)]
Name = Annotated[str, Field(max_length=limits.NAME_MAX_LENGTH)]

# Every id that names a directory or a topic level: no '/', '.', wildcard, space or NUL can get in.
ID_PATTERN = rf"^[A-Za-z0-9_-]{{1,{limits.ID_MAX_LENGTH}}}$"
Id = Annotated[str, Field(pattern=ID_PATTERN)]
_ID = re.compile(ID_PATTERN)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def id_path(parent: Path, name: str) -> Path:
    """``parent / name`` for an id; UnsafeNameError unless it is an :data:`Id` that resolves inside ``parent``.

    Resolving catches a symlink planted under ``parent`` that points elsewhere.
    """
    if not isinstance(name, str) or not _ID.fullmatch(name):
        raise UnsafeNameError(f"{name!r} is not a safe id: 1-{limits.ID_MAX_LENGTH} letters, digits, '_' or '-'")
    path = parent / name
    resolved, root = path.resolve(), parent.resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise UnsafeNameError(f"{path} resolves to {resolved}, outside {root}")
    return path


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None


class TrainingPhase(StrEnum):
    INITIALIZING = "initializing"
    DISTRIBUTING = "distributing"
    TRAINING = "training"
    AGGREGATING = "aggregating"
    COMPLETE = "complete"
    FAILED = "failed"


class GpuInfo(Record):
    name: Name
    memory_total_bytes: int = Field(ge=0)
    memory_free_bytes: int | None = Field(default=None, ge=0)
    driver_version: Name | None = None
    cuda_version: Name | None = None
    utilization_percent: float | None = Field(default=None, ge=0, le=100)


class Hardware(Record):
    """What a provider really has, detected on its host."""

    cpu_model: Name
    cpu_cores: int = Field(ge=1)
    ram_bytes: int = Field(ge=0)
    gpus: tuple[GpuInfo, ...] = Field(default=(), max_length=limits.MAX_GPUS)

    @property
    def gpu_type(self) -> str:
        return self.gpus[0].name if self.gpus else "cpu"


class Offer(Record):
    """A provider's signed advertisement on the market."""

    provider: Address
    price_wei: Wei = Field(description="price for one training round")
    hardware: Hardware
    slots: int = Field(default=1, ge=1)
    free_slots: int = Field(default=1, ge=0)
    issued_at: Finite = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _free_within_slots(self) -> Offer:
        if self.free_slots > self.slots:
            raise ValueError("free_slots cannot exceed slots")
        return self

    @property
    def availability(self) -> float:
        return self.free_slots / self.slots


class Worker(Record):
    """A discovered provider as the coordinator sees it, seed-style keys included."""

    worker_id: Address
    offer: Offer
    reputation: float = Field(ge=0.0, le=5.0, description="0..5, from observed job history")
    jobs_completed: int = Field(default=0, ge=0)
    jobs_failed: int = Field(default=0, ge=0)
    slashes: int = Field(default=0, ge=0)
    stake_wei: Wei = Field(default=0, description="bond held by the provider registry")
    earned_wei: Wei = Field(default=0, description="ETH paid to it through the escrow: what reputation weighs")

    @property
    def gpu_type(self) -> str:
        return self.offer.hardware.gpu_type

    @property
    def price(self) -> int:
        return self.offer.price_wei

    @property
    def availability(self) -> float:
        return self.offer.availability


class ModelSpec(Record):
    """A model a stranger asks a provider to build: bounded field by field, then by its estimated size."""

    name: str = Field(max_length=64)
    input_shape: tuple[Annotated[int, Field(ge=1, le=limits.MAX_FEATURES)], ...] = Field(
        min_length=1, max_length=limits.MAX_INPUT_RANK)
    num_classes: int = Field(ge=2, le=limits.MAX_CLASSES)
    hidden: int = Field(default=128, ge=1, le=limits.MAX_HIDDEN)

    @model_validator(mode="after")
    def _buildable(self) -> ModelSpec:
        features = 1
        for dim in self.input_shape:
            features *= dim
        if features > limits.MAX_FEATURES:
            raise ValueError(f"input_shape {self.input_shape} has {features} features, above {limits.MAX_FEATURES}")
        if (problem := limits.model_size_problem(self.name, self.input_shape, self.num_classes,
                                                 self.hidden)) is not None:
            raise ValueError(problem)
        return self


class JobConfig(Record):
    batch_size: int = Field(default=32, ge=1, le=65536)
    learning_rate: float = Field(default=1e-3, gt=0.0, le=10.0)
    epochs: int = Field(default=1, ge=1, le=1000)


Partition = Literal["iid", "dirichlet"]
AggregationName = Literal["fedavg", "median", "trimmed-mean", "krum", "multi-krum", "norm-clip"]


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
    deadline_quantile: float = Field(default=0.9, gt=0.0, le=1.0)
    deadline_factor: float = Field(default=2.0, ge=1.0, description="deadline = factor x quantile of past rounds")
    min_deadline_s: float = Field(default=5.0, gt=0.0)
    first_round_deadline_s: float = Field(default=120.0, gt=0.0, description="before a provider has history")
    norm_bound: float = Field(default=5.0, gt=1.0, description="update norm limit, times the round's median")
    val_loss_tolerance: float = Field(default=0.5, ge=0.0,
                                      description="allowed relative rise of validation loss over the round's start")
    val_loss_margin: float = Field(default=0.5, ge=0.0, description="allowed absolute rise, in nats")
    val_samples: int = Field(default=256, ge=1)
    fetch_timeout_s: float = Field(default=10.0, gt=0.0)
    resend_timeout_s: float = Field(default=10.0, gt=0.0,
                                    description="how long a worker has to re-send a missing or corrupt checkpoint")
    max_replacements: int = Field(default=8, ge=0, description="per training, before it fails")


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
    model_type: str = Field(max_length=64)
    target_workers: int = Field(ge=1, le=1024)
    rounds: int = Field(default=5, ge=1, le=10_000)
    job: JobConfig = JobConfig()
    partition: Partition = "iid"
    dirichlet_alpha: float = Field(default=0.5, gt=0.0)
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    seed: int = 0
    max_price_wei: Wei | None = None
    dataset_size: int | None = Field(default=None, ge=0, description="informational, as in the seed")
    aggregation: AggregationName = "fedavg"
    spare_workers: int = Field(default=0, ge=0, le=64, description="hired but unfunded, to replace failed workers")
    faults: FaultPolicy = FaultPolicy()
    elastic: ElasticPolicy | None = None


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
    num_classes: int = Field(ge=2, le=limits.MAX_CLASSES)
    feature_shape: tuple[int, ...] = Field(max_length=limits.MAX_INPUT_RANK)
    shards: tuple[Shard, ...] = Field(max_length=limits.MAX_SHARDS)

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)


class WorkerContract(Record):
    contract_id: Id
    training_id: Id
    worker_id: Address
    coordinator: Address
    price_wei: Wei = Field(description="per round")
    rounds: int = Field(ge=1)
    accepted_at: float
    role: Literal["worker", "spare", "replaced", "released"] = "worker"
    shard_index: int | None = Field(default=None, ge=0, description="the worker's slot: the shard it trains on")
    ranges: tuple[SampleRange, ...] = Field(default=(), max_length=limits.MAX_RANGES,
                                            description="elastic pools: the samples it trains on")
    shard_id: Id | None = Field(default=None, description="elastic pools: the shard built from its ranges")
    consent: str | None = Field(default=None, pattern=r"^0x[0-9a-fA-F]{130}$",
                                description="the worker's sign_consent to its escrow slot, passed on open/add/replace")

    @property
    def price(self) -> int:
        """Whole-contract amount, the seed's ``contract['price']``."""
        return self.price_wei * self.rounds


MAX_SHARD_BYTES = 1 << 34  # 16 GiB: the most one job may ask a provider to fetch for its shard
MAX_WEIGHTS_BYTES = 8 * limits.MAX_PARAMETERS + (1 << 20)  # float64 at most, plus the safetensors header


class JobAssignment(Record):
    job_id: Id
    training_id: Id
    round: int = Field(ge=1)
    worker_id: Address
    contract_id: Id
    shard_cid: Cid
    shard_bytes: int = Field(ge=1, le=MAX_SHARD_BYTES,
                             description="the shard's exact size: the provider fetches no more than this")
    weights_cid: Cid
    weights_bytes: int = Field(ge=1, le=MAX_WEIGHTS_BYTES, description="the global weights' exact size")
    model: ModelSpec
    config: JobConfig
    seed: int = Field(default=0, ge=0, description="shuffling seed for the worker's local epochs")


JobStatus = Literal["assigned", "running", "complete", "failed", "cancelled"]


class Progress(Record):
    job_id: Id
    training_id: Id
    worker_id: Address
    round: int = Field(ge=1)
    status: JobStatus
    epoch: int = Field(ge=0)
    epochs: int = Field(ge=1)
    progress: float = Field(ge=0.0, le=100.0)
    loss: Finite | None = None
    samples_per_s: Finite | None = Field(default=None, ge=0.0)
    error: Text | None = None


class JobResult(Record):
    job_id: Id
    training_id: Id
    worker_id: Address
    round: int = Field(ge=1)
    checkpoint_cid: Cid
    samples: int = Field(ge=1)
    loss: Finite
    train_seconds: Finite = Field(ge=0.0)
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$",
                           description="the worker's sign_result over (chain, registry, training, round, checkpoint "
                                       "CID): slashing evidence")


class JobCancel(Record):
    """The coordinator no longer wants a job's result (a speculative duplicate won, or it was reassigned)."""

    job_id: Id
    training_id: Id
    reason: Text


class ResendRequest(Record):
    """The coordinator could not fetch (or verify) a result's checkpoint: upload it again and re-publish."""

    job_id: Id
    training_id: Id
    cid: Cid
    reason: Text
    deadline_s: Finite = Field(gt=0.0)


class Ping(Record):
    nonce: Id  # names the pong's topic level
    sent_at: Finite


class Pong(Record):
    nonce: Id
    busy_jobs: int = Field(ge=0)


class CheckpointRef(Record):
    checkpoint_id: str = Field(max_length=limits.CID_MAX_LENGTH)
    cid: Cid
    job_id: Id
    worker_id: Address
    training_id: Id
    round: int = Field(ge=1)
    samples: int = Field(ge=1)
    loss: Finite
    train_seconds: Finite = Field(default=0.0, ge=0.0)
    signature: str | None = None


class AggregateResult(Record):
    model_id: Cid
    model: bytes = Field(repr=False, description="the averaged weights as safetensors bytes")
    round: int = Field(ge=0)
    samples: int = Field(ge=0)
    loss: float | None
    contributors: tuple[Address, ...] = Field(max_length=limits.MAX_WORKERS)


class RoundMetrics(Record):
    round: int = Field(ge=1)
    accuracy: Fraction
    loss: float
    model_cid: Cid
    workers: int = Field(ge=1)
    throughput: float | None = Field(default=None, ge=0.0, description="samples trained per second of round time")
    round_seconds: float | None = Field(default=None, ge=0.0)


class Payment(Record):
    training_id: Id
    worker_id: Address
    contract_id: Id
    amount_wei: Wei
    tx_hash: str
    result_hash: str


class EscrowSummary(Record):
    address: Address
    deposited_wei: Wei
    paid_wei: Wei
    refunded_wei: Wei


class ContractProposal(Record):
    contract_id: Id
    training_id: Id
    coordinator: Address
    price_wei: Wei
    rounds: int = Field(ge=1)


class ContractReply(Record):
    contract_id: Id
    accepted: bool
    reason: Text | None = None
    consent: str | None = Field(default=None, pattern=r"^0x[0-9a-fA-F]{130}$",
                                description="with an acceptance: the provider's sign_consent to its escrow slot")


class Heartbeat(Record):
    provider: Address
    sent_at: Finite
    busy_jobs: int = Field(ge=0)


class TrainingStatus(Record):
    training_id: Id
    phase: TrainingPhase
    round: int = Field(ge=0, description="rounds completed")
    rounds: int = Field(ge=1)
    workers: int = Field(ge=0)
    accuracy: float | None = None
    model_cid: Cid | None = None


class Settlement(Record):
    training_id: Id
    payments: tuple[Payment, ...] = Field(max_length=limits.MAX_WORKERS)
    refund_wei: Wei
    refund_tx: str | None
    escrow: EscrowSummary


class WorkerReport(Record):
    address: Address
    samples: int = Field(ge=0)
    rounds_accepted: int = Field(ge=0)
    paid_wei: Wei
    tx_hash: str | None
    status: Literal["paid", "unpaid"]
    price_wei: Wei
    gpu_type: str
    role: Literal["worker", "spare", "replaced", "released"] = "worker"


class RoundReport(Record):
    round: int = Field(ge=1)
    accuracy: Fraction
    loss: float
    model_cid: Cid
    worker_losses: dict[str, float]
    workers: int | None = None
    throughput: float | None = None


class TrainingReport(Record):
    training_id: Id
    status: TrainingPhase
    final_accuracy: Fraction
    model_cid: Cid
    manifest_cid: Cid
    rounds: tuple[RoundReport, ...] = Field(max_length=limits.MAX_ROUNDS)
    workers: tuple[WorkerReport, ...] = Field(max_length=limits.MAX_WORKERS)
    escrow: EscrowSummary
    refund_tx: str | None
    wall_seconds: float
    compute_seconds: float = Field(description="sum over rounds of the slowest worker's training time")


class ChainIntent(Record):
    """A chain write the coordinator is about to make, saved before it is sent.

    A crash between the transaction and the database writes that follow it leaves the intent
    ``pending``; on resume it is settled from the chain's events (done, or failed when the
    transaction never landed), so the database again says what the escrow says.
    """

    intent_id: str
    training_id: str
    kind: Literal["replace"]
    status: Literal["pending", "done", "failed"] = "pending"
    old_contract_id: str
    new_contract_id: str
    reason: str = ""
    created_at: float = Field(default_factory=time.time)
