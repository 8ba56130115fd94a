"""Records and messages, validated with pydantic v2 at every boundary.

Every record also answers ``record["field"]`` so the seed scenario's dict-style
access keeps working; attribute access is the primary API.
"""

from ._base import Address, Cid, Wei, Fraction, Finite, Text, Name, ID_PATTERN, Id, new_id, id_path, Record  # noqa: F401
from ._sizes import ByteSize, format_size, parse_size  # noqa: F401
from ._tasks import TaskRef, TaskManifest, TaskPackage, TaskPolicy, TaskPolicyName, MAX_TASK_BYTES  # noqa: F401
from ._market import GpuInfo, Hardware, Offer, Worker, DeviceClass, CPU_CLASS, UNCONFIRMED_CLASS  # noqa: F401
from ._footprint import ModelFootprint, describe, fit_problem, largest_machine  # noqa: F401
from ._training import TrainingPhase, ModelSpec, JobConfig, Partition, AggregationName, OuterName, UpdateEncoding, ExperimentLogName, FaultPolicy, ElasticPolicy, SampleRange, TrainingSpec, TrainingRecord, Shard, ShardManifest  # noqa: F401
from ._jobs import WorkerContract, MAX_SHARD_BYTES, MAX_WEIGHTS_BYTES, declared_parameters, weights_limit, JobAssignment, WeightsDelta, JobStatus, Progress, JobResult, JobCancel, ResendRequest, Ping, Pong, CheckpointRef, ContractProposal, ContractReply, Heartbeat  # noqa: F401
from ._reports import AggregateResult, RoundMetrics, Payment, EscrowSummary, TrainingStatus, Settlement, WorkerReport, RoundReport, TrainingReport, VerificationSpend, RoundSpend, TrainingCost, ChainIntent, reported_accuracy  # noqa: F401
from ._receipts import PaymentReceipt  # noqa: F401
from ._generation import MAX_PROMPT_BYTES, MAX_SAMPLE_TOKENS, ExportFormat, ExportResult, SampleResult  # noqa: F401
from ._verification import MAX_SEGMENTS, MAX_CHECKED_SEGMENTS, MAX_TRACE_POINTS, MAX_COMMITMENT_BYTES, COMMITMENT_KEY, MAX_HARDWARE_PRODUCT, MAX_HARDWARE_FLOPS, TrajectoryCommitment, TrajectoryChallenge, boundaries_opened, BoundaryState, TrajectoryOpening, HardwareChallenge, HardwareAnswer, VerifyRequest, VerifyReport, Precision, ToleranceRow, ToleranceTable  # noqa: F401
from ._datasets import TargetKind  # noqa: F401
from ._inert import terminal_markup, visible, visible_values  # noqa: F401
