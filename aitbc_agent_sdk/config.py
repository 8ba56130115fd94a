"""AgentConfig: one pydantic config for an agent; the stack builder reads it."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from .settings import BUILTIN_NETWORKS, NetworkSettings, load_settings
from .coordinator._settings import CoordinatorSettings


def default_home() -> Path:
    """$AITBC_HOME, else the config file's ``home``, else $XDG_DATA_HOME/aitbc, else ~/.aitbc."""
    return load_settings().home_dir


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "aitbc-agent"
    network: str | NetworkSettings = Field(
        default="embedded", validation_alias=AliasChoices("network", "blockchain_network"),
        description="the stack: 'embedded' runs everything in-process (py-evm, in-memory bus, local store, local"
                    " providers); 'devnet' connects to the servers in $AITBC_HOME/profile.json (aitbc devnet up);"
                    " any other name is a network of the user config (aitbc_agent_sdk.settings), and a"
                    " NetworkSettings names the endpoints outright. 'blockchain_network' is accepted too")
    wallet_name: str = "default"
    home: Path = Field(default_factory=default_home)
    # embedded stack only
    providers: int = Field(default=4, ge=0, le=64, description="local provider agents on the embedded stack")
    provider_prices_wei: tuple[int, ...] | None = None
    wallet_funding_wei: int = Field(default=100 * 10**18, ge=0)
    warm_providers: bool = Field(default=True, description="local providers start their training processes at"
                                 " once; a dry run, which trains nothing, leaves them off (they cost seconds of CPU)")
    # devnet and configured networks
    client_id: str | None = Field(default=None, description="MQTT client id; stable ids get persistent sessions")
    # both
    coordinator: CoordinatorSettings = Field(default_factory=CoordinatorSettings,
                                             description="market timeouts, gas reserve and audit directory")
    auto_resume: bool = Field(default=False, description="on start, carry on this coordinator's unfinished,"
                              " funded trainings that no other process is driving (devnet)")

    @field_validator("network")
    @classmethod
    def _configured(cls, network: str | NetworkSettings) -> str | NetworkSettings:
        # A name is looked up now, so a typo fails where it is written, with how to configure it (ConfigError).
        if isinstance(network, str) and network not in BUILTIN_NETWORKS:
            load_settings().network_settings(network)
        return network
