"""aitbc-agent-sdk: federated training on rented GPUs, paid through an on-chain escrow.

Public names are imported on first use (PEP 562), so a worker process that only
needs ``aitbc_agent_sdk.tasks`` does not pay for web3 and the coordinator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "_agent": ("Agent", "AgentConfig"),
    "coordinator._settings": ("CoordinatorSettings",),
    "errors": (
        "AitbcError", "ChainError", "ConfigError", "ContentNotFoundError", "ContractRevertError", "DatasetError",
        "InsufficientFundsError", "IntegrityError", "MessagingError", "NotEnoughWorkersError", "NotFoundError",
        "PhaseError", "SignatureError", "StorageError", "TrainingError", "UnknownModelError", "UnreachableError",
        "BrokerUnreachableError", "ChainUnreachableError", "StoreUnreachableError",
    ),
    "market": ("ScoringStrategy", "WeightedScore"),
    "records": (
        "AggregateResult", "CheckpointRef", "EscrowSummary", "Hardware", "JobAssignment", "JobConfig", "Offer",
        "Payment", "Progress", "RoundMetrics", "Settlement", "Shard", "ShardManifest", "TrainingPhase",
        "TrainingRecord", "TrainingReport", "TrainingSpec", "TrainingStatus", "Worker", "WorkerContract",
        "TaskPolicy", "TaskRef",
    ),
    "tasks._task": ("Batch", "DataInfo", "TaskParams", "TrainingTask"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
__all__ = [*__all__, "__version__"]


if TYPE_CHECKING:  # static tools see ordinary imports
    from ._agent import Agent, AgentConfig
    from .coordinator._settings import CoordinatorSettings
    from .errors import (
        AitbcError, ChainError, ConfigError, ContentNotFoundError, ContractRevertError, DatasetError,
        InsufficientFundsError, IntegrityError, MessagingError, NotEnoughWorkersError, NotFoundError, PhaseError,
        SignatureError, StorageError, TrainingError, UnknownModelError, UnreachableError, BrokerUnreachableError,
        ChainUnreachableError, StoreUnreachableError,
    )
    from .market import ScoringStrategy, WeightedScore
    from .records import (
        AggregateResult, CheckpointRef, EscrowSummary, Hardware, JobAssignment, JobConfig, Offer, Payment,
        Progress, RoundMetrics, Settlement, Shard, ShardManifest, TrainingPhase, TrainingRecord, TrainingReport,
        TrainingSpec, TrainingStatus, Worker, WorkerContract, TaskPolicy, TaskRef,
    )
    from .training.task import Batch, DataInfo, TaskParams, TrainingTask
