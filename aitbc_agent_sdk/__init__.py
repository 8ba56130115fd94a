"""aitbc-agent-sdk: federated training on rented GPUs, paid through an on-chain escrow.

Public names are imported on first use (PEP 562), so a worker process that only
needs ``aitbc_agent_sdk.training`` does not pay for web3 and the coordinator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "agent": ("Agent", "AgentConfig"),
    "errors": (
        "AitbcError", "ChainError", "ConfigError", "ContentNotFoundError", "ContractRevertError", "DatasetError",
        "InsufficientFundsError", "IntegrityError", "MessagingError", "NotEnoughWorkersError", "NotFoundError",
        "PhaseError", "SignatureError", "StorageError", "TrainingError", "UnknownModelError",
    ),
    "market": ("ScoringStrategy", "WeightedScore"),
    "models": (
        "AggregateResult", "CheckpointRef", "EscrowSummary", "Hardware", "JobAssignment", "JobConfig", "Offer",
        "Payment", "Progress", "RoundMetrics", "Settlement", "Shard", "ShardManifest", "TrainingPhase",
        "TrainingRecord", "TrainingReport", "TrainingSpec", "TrainingStatus", "Worker", "WorkerContract",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'aitbc_agent_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # static tools see ordinary imports
    from .agent import Agent, AgentConfig
    from .errors import (
        AitbcError, ChainError, ConfigError, ContentNotFoundError, ContractRevertError, DatasetError,
        InsufficientFundsError, IntegrityError, MessagingError, NotEnoughWorkersError, NotFoundError, PhaseError,
        SignatureError, StorageError, TrainingError, UnknownModelError,
    )
    from .market import ScoringStrategy, WeightedScore
    from .models import (
        AggregateResult, CheckpointRef, EscrowSummary, Hardware, JobAssignment, JobConfig, Offer, Payment,
        Progress, RoundMetrics, Settlement, Shard, ShardManifest, TrainingPhase, TrainingRecord, TrainingReport,
        TrainingSpec, TrainingStatus, Worker, WorkerContract,
    )
