"""Messages between coordinator and providers: contracts, jobs, results, pings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .. import limits
from ._base import Address, Cid, Finite, Id, Record, Text, Wei
from ._footprint import ModelFootprint
from ._market import UNCONFIRMED_CLASS, DeviceClass
from ._tasks import TaskRef
from ._training import JobConfig, ModelSpec, SampleRange, UpdateEncoding


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
    device_class: DeviceClass = Field(default=UNCONFIRMED_CLASS, description=(
        "what its spot checks compare within, as hiring confirmed it (Worker.device_class), never as a "
        "result claims"))

    @property
    def price(self) -> int:
        """Whole-contract amount, the seed's ``contract['price']``."""
        return self.price_wei * self.rounds


MAX_SHARD_BYTES = 1 << 34  # 16 GiB: the most one job may ask a provider to fetch for its shard
# A job without a declared footprint (an older coordinator's) is bounded as before: float64 at most, plus
# the safetensors header. A job with one is bounded by it (weights_limit).
MAX_WEIGHTS_BYTES = 8 * limits.LEGACY_MAX_PARAMETERS + (1 << 20)


def declared_parameters(footprint: ModelFootprint | None) -> int:
    """The most parameters a job's model may have: what it declares, else the legacy bound."""
    return footprint.parameters if footprint is not None else limits.LEGACY_MAX_PARAMETERS


def weights_limit(footprint: ModelFootprint | None) -> int:
    """The most a weights-sized file of a job (its model, a delta of it, a checkpoint) may hold."""
    return footprint.max_weights_bytes if footprint is not None else MAX_WEIGHTS_BYTES


class WeightsDelta(Record):
    """The job's weights as a change from the last round's model, for a provider that holds that model."""

    base_cid: Cid
    delta_cid: Cid
    delta_bytes: int = Field(ge=1, le=limits.MAX_MODEL_BYTES)
    encoding: UpdateEncoding


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
    weights_bytes: int = Field(ge=1, le=limits.MAX_MODEL_BYTES, description=(
        "the global weights' exact size: at most what the footprint declares"))
    model: ModelSpec
    config: JobConfig
    seed: int = Field(default=0, ge=0, description="shuffling seed for the worker's local epochs")
    task: TaskRef | None = Field(default=None, description="user code to run; None: the built-in named model.name")
    data_key: str | None = Field(default=None, pattern=r"^[0-9a-f]{2,512}$", description=(
        "a sealed dataset's key, wrapped for this worker's public key (chain.keywrap); None: plaintext"))
    weights_delta: WeightsDelta | None = Field(default=None, description=(
        "weights_cid as an encoded change from the last round's model: the rebuilt bytes must hash to weights_cid"))
    update_encoding: UpdateEncoding = Field(default="weights", description=(
        "what the result's checkpoint holds: the trained weights, or their change from weights_cid encoded so"))
    footprint: ModelFootprint | None = Field(default=None, description=(
        "the model's measured size, as the contract's proposal declared it: bounds every fetch of the job"))

    @model_validator(mode="after")
    def _within_footprint(self) -> JobAssignment:
        declared = declared_parameters(self.footprint)
        spec = self.model
        built = limits.model_size(spec.name, spec.input_shape, max(spec.outputs, 1), spec.hidden).parameters
        if built > declared:
            raise ValueError(f"model {spec.name!r} would have {built:,} parameters; the job declares {declared:,}")
        limit = weights_limit(self.footprint)
        if self.weights_bytes > limit:
            raise ValueError(f"weights_bytes {self.weights_bytes} above the job's bound of {limit}")
        if self.weights_delta is not None and self.weights_delta.delta_bytes > limit:
            raise ValueError(f"delta_bytes {self.weights_delta.delta_bytes} above the job's bound of {limit}")
        return self


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
    gpu_memory_bytes: int | None = Field(default=None, ge=0, le=1 << 44, description="peak GPU memory of the job")
    gpu_utilization_percent: Finite | None = Field(default=None, ge=0.0, le=100.0)


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
    task_state: Literal["fresh", "resumed"] | None = Field(
        default=None, description="a keep_state task: whether the worker resumed the state it kept last round")


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
    task_state: Literal["fresh", "resumed"] | None = None  # as its result said: a replacement starts fresh


class ContractProposal(Record):
    contract_id: Id
    training_id: Id
    coordinator: Address
    price_wei: Wei
    rounds: int = Field(ge=1)
    task: TaskRef | None = Field(default=None, description="the task the jobs will run: checked before accepting")
    footprint: ModelFootprint | None = Field(default=None, description=(
        "the model's measured size: a provider that cannot hold it declines; every job carries the same"))
    batch_size: int = Field(default=32, ge=1, le=65536, description="the jobs' batch size, for the memory estimate")


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


