"""aitbc-agent-sdk: federated training on rented GPUs, paid through an on-chain escrow."""

from .agent import Agent, AgentConfig
from .errors import (
    AitbcError, ChainError, ConfigError, ContentNotFoundError, ContractRevertError, DatasetError,
    InsufficientFundsError, IntegrityError, MessagingError, NotEnoughWorkersError, NotFoundError, PhaseError,
    SignatureError, StorageError, TrainingError, UnknownModelError,
)
from .market import ScoringStrategy, WeightedScore
from .models import (
    AggregateResult, CheckpointRef, EscrowSummary, Hardware, JobAssignment, JobConfig, Offer, Payment, Progress,
    RoundMetrics, Settlement, Shard, ShardManifest, TrainingPhase, TrainingRecord, TrainingReport, TrainingSpec,
    TrainingStatus, Worker, WorkerContract,
)

__version__ = "0.1.0"

__all__ = [
    "Agent", "AgentConfig", "AggregateResult", "AitbcError", "ChainError", "CheckpointRef", "ConfigError",
    "ContentNotFoundError", "ContractRevertError", "DatasetError", "EscrowSummary", "Hardware",
    "InsufficientFundsError", "IntegrityError", "JobAssignment", "JobConfig", "MessagingError",
    "NotEnoughWorkersError", "NotFoundError", "Offer", "Payment", "PhaseError", "Progress", "RoundMetrics",
    "ScoringStrategy", "Settlement", "Shard", "ShardManifest", "SignatureError", "StorageError", "TrainingError",
    "TrainingPhase", "TrainingRecord", "TrainingReport", "TrainingSpec", "TrainingStatus", "UnknownModelError",
    "WeightedScore", "Worker", "WorkerContract", "__version__",
]
