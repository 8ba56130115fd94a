"""The coordinator's own settings, nested in ``AgentConfig`` as ``coordinator``."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class CoordinatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    discovery_timeout_s: float = Field(
        default=2.0, gt=0, le=600, description="how long to collect providers' offers from the market")
    reply_timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="how long a provider has to answer a contract proposal")
    gas_reserve_wei: int = Field(
        default=10**16, ge=0, le=10**21,
        description="kept back in the wallet for the escrow's open, release and refund transactions")
    audit_dir: Path | None = Field(
        default=None, description="one hash-chained JSONL audit log per training under here; an Agent"
                                  " defaults it to $AITBC_HOME/trainings, a bare Coordinator keeps none")
    data_dir: Path | None = Field(
        default=None, description="datasets staged for import, and the splits the coordinator reads; an Agent "
                                  "defaults it to $AITBC_HOME/datasets, a bare Coordinator uses a temporary directory")
    task_dir: Path | None = Field(
        default=None, description="user tasks' code, unpacked by CID, imported from here; an Agent defaults it "
                                  "to $AITBC_HOME/tasks, a bare Coordinator uses a temporary directory")
