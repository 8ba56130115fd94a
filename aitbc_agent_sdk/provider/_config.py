"""What a provider daemon is configured with: its price, directories, slots, sandbox and cache."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..records import ByteSize, TaskPolicy, Wei
from ._book import BookLimits
from ._cache import DEFAULT_CACHE_BYTES
from ._kept import KEPT_BYTES
from ._sandbox import TrainingSandbox


class ProviderConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price_wei: Wei
    work_dir: Path
    slots: int | None = Field(default=None, ge=1, description="jobs at once; None: one per GPU, or 1 on a CPU host")
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    offer_refresh_s: float = Field(default=30.0, gt=0)
    worker_threads: int | None = Field(default=None, ge=1, description="torch threads per slot; None: the "
                                       "host's cores shared among the slots")
    tasks: TaskPolicy = Field(default_factory=TaskPolicy, description="built-ins only, an allow-list, or any task")
    # The training process parses strangers' data: bwrap or refuse to start. None is --no-sandbox.
    sandbox: TrainingSandbox | None = TrainingSandbox()
    cache_dir: Path | None = Field(default=None, description="fetched shards and weights; None: work_dir/cache")
    cache_bytes: ByteSize = Field(default=DEFAULT_CACHE_BYTES, description="the cache's quota (LRU)")
    kept_bytes: ByteSize = Field(default=KEPT_BYTES, description=(
        "delivered checkpoints and boundary states kept for re-sends and spot checks until their training closes"))
    contract_limits: BookLimits = Field(default_factory=BookLimits, description=(
        "the unfunded proposals' pool and its rate limits; funded contracts are never evicted"))
    warm_start: bool = Field(default=True, description=(
        "start the training processes (torch imported, one step taken) with the provider; off: the first job does"))
    max_unreceipted_rounds: int = Field(default=2, ge=0, le=1000, description=(
        "refuse a contract's jobs once this many delivered rounds lack the coordinator's payment receipt; 0: never"))
