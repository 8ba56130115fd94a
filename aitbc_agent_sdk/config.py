"""AgentConfig: one pydantic config for an agent; the stack builder reads it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


def default_home() -> Path:
    return Path(os.environ.get("AITBC_HOME") or Path.home() / ".aitbc")


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "aitbc-agent"
    blockchain_network: Literal["embedded", "devnet"] = Field(
        default="embedded",
        description="'embedded' runs everything in-process (py-evm, in-memory bus, local store, local providers);"
                    " 'devnet' connects to the servers in $AITBC_HOME/profile.json (aitbc devnet up)")
    wallet_name: str = "default"
    home: Path = Field(default_factory=default_home)
    # embedded stack only
    providers: int = Field(default=4, ge=0, le=64, description="local provider agents on the embedded stack")
    provider_prices_wei: tuple[int, ...] | None = None
    wallet_funding_wei: int = Field(default=100 * 10**18, ge=0)
    # devnet only
    client_id: str | None = Field(default=None, description="MQTT client id; stable ids get persistent sessions")
    # both
    discovery_timeout_s: float = Field(default=2.0, gt=0)
    reply_timeout_s: float = Field(default=10.0, gt=0)
    auto_resume: bool = Field(default=False, description="on start, carry on this coordinator's unfinished,"
                              " funded trainings that no other process is driving (devnet)")
