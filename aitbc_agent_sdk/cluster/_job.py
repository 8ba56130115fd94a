"""One trusted-cluster job's records: what ``aitbc cluster train`` asks for and what happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._plan import LaunchPlan
from ._protocol import (
    DEFAULT_JOIN_TIMEOUT_S, DEFAULT_LAST_CALL_TIMEOUT_S, JOB_ID_PATTERN, PreflightReport, RendezvousInfo,
)

class TrainRequest(BaseModel):
    """What ``aitbc cluster train`` asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: int = Field(ge=1)
    script: Path
    script_args: tuple[str, ...] = ()
    nproc_per_node: int | Literal["auto"] = "auto"
    min_hosts: int | None = Field(default=None, ge=1)
    max_restarts: int = Field(default=3, ge=0)
    checkpoint_dir: Path | None = None
    checkpoint_every: int | None = Field(default=None, ge=1)
    datasets: tuple[Path, ...] = ()
    sandbox: bool = True
    job_id: str | None = Field(default=None, pattern=JOB_ID_PATTERN)
    last_call_timeout_s: int = Field(default=DEFAULT_LAST_CALL_TIMEOUT_S, ge=0)
    join_timeout_s: int = Field(default=DEFAULT_JOIN_TIMEOUT_S, ge=1)
    rendezvous_timeout_s: float = Field(default=300.0, gt=0, description="launch to a formed rendezvous")
    timeout_s: float | None = Field(default=None, gt=0, description="the whole job; None: no limit")


class HostOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    role: str
    state: str
    returncode: int | None = None
    reason: str | None = None
    group_rank: int | None = None
    rendezvous: list[RendezvousInfo] = Field(default_factory=list)


class TrainResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str
    cluster: str
    ok: bool
    error: str | None = None
    master: str
    master_addr: str
    port: int
    world_size_expected: int
    world_size_confirmed: int | None = None
    plan: LaunchPlan
    preflight: dict[str, PreflightReport]
    hosts: dict[str, HostOutcome]
    failures: list[dict[str, Any]] = Field(default_factory=list)
    spares_used: list[str] = Field(default_factory=list)
    continuity: dict[str, Any] | None = None
    audit_log: str
    events_log: str | None
    duration_s: float
