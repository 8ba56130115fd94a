"""User settings: one TOML file, ``AITBC_*`` environment variables, and networks by name.

Per key the first that says something wins: an explicit argument (the caller's: a CLI flag, an
``AgentConfig`` field) > the environment > the config file > the built-in default. The file is
``$AITBC_CONFIG``, else ``$XDG_CONFIG_HOME/aitbc/config.toml``, else ``~/.config/aitbc/config.toml``;
a missing file is an empty one. Reading never writes anything.

    home = "/srv/aitbc"                  # $AITBC_HOME
    network = "sepolia"                  # $AITBC_NETWORK: the front ends' default network
    rpc_url = "http://127.0.0.1:8545"    # $AITBC_RPC_URL, else $ETH_RPC_URL (Foundry's)
    ipfs_api = "/ip4/127.0.0.1/tcp/5001" # $AITBC_IPFS_API (a URL or kubo's multiaddr)

    [networks.sepolia]                   # $AITBC_NETWORKS__SEPOLIA__RPC_URL and so on
    chain_id = 11155111
    rpc_url = "https://rpc.sepolia.example"
    escrow = "0x..."
    broker = "mqtts://broker.example:8883"
    ipfs_api = "/dns4/ipfs.example/tcp/443/https"
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigError
from .records import Address
from .storage._address import parse_api_address

CONFIG_ENV = "AITBC_CONFIG"
ENV_PREFIX = "AITBC_"
ETH_RPC_ENV = "ETH_RPC_URL"  # Foundry's: the chain RPC when nothing more specific names one
BUILTIN_NETWORKS = ("embedded", "devnet")
NETWORK_NAME_PATTERN = r"[a-z][a-z0-9_]{0,63}"  # lower case: environment variable names fold case
MQTT_PORT, MQTTS_PORT = 1883, 8883


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the user config file is (it need not exist)."""
    env = os.environ if env is None else env
    if explicit := env.get(CONFIG_ENV):
        return Path(explicit).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "aitbc" / "config.toml"


def data_home(env: Mapping[str, str] | None = None) -> Path:
    """The built-in home: ``$XDG_DATA_HOME/aitbc`` when that is set, else ``~/.aitbc`` (where it always was)."""
    env = os.environ if env is None else env
    return Path(env["XDG_DATA_HOME"]) / "aitbc" if env.get("XDG_DATA_HOME") else Path.home() / ".aitbc"


def parse_broker(address: str) -> tuple[str, int, bool]:
    """``mqtt://HOST[:PORT]``, ``mqtts://HOST[:PORT]`` or ``HOST[:PORT]`` -> (host, port, tls)."""
    text = str(address).strip()
    url = urlsplit(text if "://" in text else f"mqtt://{text}")
    try:
        tls = url.scheme == "mqtts"
        port = url.port or (MQTTS_PORT if tls else MQTT_PORT)
        valid = url.scheme in ("mqtt", "mqtts") and bool(url.hostname) and url.path in ("", "/")
    except ValueError:  # a port outside 0-65535
        valid = False
    if not valid or not url.hostname:
        raise ConfigError(f"{text!r} is not a broker address: use mqtt://HOST:PORT, mqtts://HOST:PORT or HOST:PORT")
    return url.hostname, port, tls


# Field checks: pydantic reports a ValueError with the key it was raised for.
def _http_url(value: str | None) -> str | None:
    if value is not None and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
        raise ValueError(f"{value!r} is not an http(s)://HOST:PORT URL")
    return value


def _broker_address(value: str | None) -> str | None:
    try:
        if value is not None:
            parse_broker(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return value


def _api_address(value: str | None) -> str | None:
    try:
        return None if value is None else parse_api_address(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


class NetworkSettings(BaseModel):
    """Where one network's servers and contracts are: everything a remote stack connects to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chain_id: int = Field(gt=0, description="checked against the RPC node's before anything is sent")
    rpc_url: str | None = Field(default=None, description="JSON-RPC URL; None: the top-level rpc_url"
                                " ($AITBC_RPC_URL, $ETH_RPC_URL)")
    escrow: Address = Field(description="the TrainingEscrow contract")
    registry: Address | None = Field(default=None, description="its ProviderRegistry; read from the escrow"
                                     " when left out, checked against it when given")
    deployed_block: int = Field(default=0, ge=0, description="where event scans start")
    confirmations: int | None = Field(default=None, ge=1, le=1000, description="blocks a transaction needs;"
                                      " default 1 on a local devnet chain id, 12 on any other")
    broker: str = Field(description="MQTT broker: mqtt://HOST:PORT or mqtts://HOST:PORT (TLS)")
    broker_ca_file: Path | None = Field(default=None, description="CA bundle of the broker's certificate")
    broker_username: str | None = Field(default=None, description="a fixed broker account (else the wallet's"
                                        " own, or $AITBC_MQTT_USERNAME)")
    broker_password_file: Path | None = Field(default=None, description="that account's password (0600)")
    ipfs_api: str = Field(description="Kubo RPC API: a URL or a multiaddr such as /dns4/HOST/tcp/5001/https")

    _rpc = field_validator("rpc_url")(_http_url)
    _broker = field_validator("broker")(_broker_address)
    _ipfs_api = field_validator("ipfs_api")(_api_address)


class SettingsFields(BaseModel):
    """The keys of the config file (and, with the ``AITBC_`` prefix, of the environment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path | None = Field(default=None, description="state directory; default $XDG_DATA_HOME/aitbc or ~/.aitbc")
    network: str = Field(default="embedded", description="the network front ends use when none is named")
    rpc_url: str | None = Field(default=None, description="the chain RPC for commands that need only a chain")
    ipfs_api: str | None = Field(default=None, description="the Kubo RPC API for commands that need only a store")
    broker: str | None = Field(default=None, description="the MQTT broker for commands that need only a bus")
    networks: dict[str, NetworkSettings] = Field(default_factory=dict, description="networks by name")

    _rpc = field_validator("rpc_url")(_http_url)
    _broker = field_validator("broker")(_broker_address)
    _ipfs_api = field_validator("ipfs_api")(_api_address)

    @field_validator("home")
    @classmethod
    def _home(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()

    @field_validator("networks", mode="before")  # before: a bad name is the error, not the keys it lacks
    @classmethod
    def _names(cls, networks: Any) -> Any:
        for name in networks if isinstance(networks, dict) else ():
            if name in BUILTIN_NETWORKS:
                raise ValueError(f"{name!r} is built in and cannot be configured")
            if not re.fullmatch(NETWORK_NAME_PATTERN, name):
                raise ValueError(f"network name {name!r}: use lower-case letters, digits and '_'")
        return networks


class UserSettings(BaseSettings, SettingsFields):
    """The settings in force: the environment over the config file (see :func:`load_settings`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", env_ignore_empty=True,
                                      extra="forbid", frozen=True)
    _file: Path | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(cls, settings_cls: Any, init_settings: Any, env_settings: Any,
                                   dotenv_settings: Any, file_secret_settings: Any) -> tuple[Any, ...]:
        # The file's values arrive as init values; the environment ranks above them.
        return env_settings, init_settings

    @property
    def file(self) -> Path | None:
        """The config file these settings were read from."""
        return self._file

    @property
    def home_dir(self) -> Path:
        """$AITBC_HOME, else the file's ``home``, else $XDG_DATA_HOME/aitbc, else ~/.aitbc."""
        return self.home or data_home()

    def network_settings(self, name: str) -> NetworkSettings:
        """The configured network ``name``, its RPC URL filled in; ConfigError saying how to add one."""
        network = self.networks.get(name)
        if network is None:
            raise ConfigError(not_configured(name, self))
        return self.with_default_rpc(name, network)

    def with_default_rpc(self, name: str, network: NetworkSettings) -> NetworkSettings:
        """``network`` with the top-level rpc_url ($AITBC_RPC_URL, $ETH_RPC_URL) where it names none."""
        if network.rpc_url is not None:
            return network
        if self.rpc_url is None:
            raise ConfigError(f"network {name!r} has no rpc_url: set it under [networks.{name}] in "
                              f"{self._file or config_path()}, or ${ENV_PREFIX}NETWORKS__{name.upper()}__RPC_URL,"
                              f" or ${ENV_PREFIX}RPC_URL / ${ETH_RPC_ENV}")
        return network.model_copy(update={"rpc_url": self.rpc_url})


def not_configured(name: str, settings: UserSettings) -> str:
    """How to configure a network that is not: the file, the keys, an example."""
    env = f"{ENV_PREFIX}NETWORKS__{name.upper()}__"
    known = ", ".join([*BUILTIN_NETWORKS, *sorted(settings.networks)])
    return (f"network {name!r} is not configured (known: {known}). Add it to {settings.file or config_path()} "
            f"(or the file ${CONFIG_ENV} names):\n\n"
            f"  [networks.{name}]\n"
            f"  chain_id = 1                                   # checked against the node's\n"
            f"  rpc_url = \"https://rpc.example.org\"            # or ${ENV_PREFIX}RPC_URL / ${ETH_RPC_ENV}\n"
            f"  escrow = \"0x...\"                               # the TrainingEscrow contract\n"
            f"  broker = \"mqtts://broker.example.org:8883\"\n"
            f"  ipfs_api = \"/dns4/ipfs.example.org/tcp/5001/https\"\n\n"
            f"or set the same keys as environment variables: {env}CHAIN_ID, {env}RPC_URL, {env}ESCROW, "
            f"{env}BROKER, {env}IPFS_API.")


def read_config_file(path: Path, *, required: bool = False) -> dict[str, Any]:
    """The file's table ({} when it does not exist and is not required); ConfigError naming the file."""
    try:
        with path.open("rb") as source:
            return tomllib.load(source)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"${CONFIG_ENV} names {path}, which does not exist") from None
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from exc


def _describe(exc: ValidationError, *, env: bool) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        where = f" (${ENV_PREFIX}{'__'.join(str(p) for p in error['loc']).upper()})" if env else ""
        lines.append(f"{key}{where}: {error['msg']}")
    return "; ".join(lines)


def load_settings(path: Path | None = None) -> UserSettings:
    """The settings in force: ``AITBC_*`` variables over the config file over the defaults.

    ``path`` replaces the config file's usual place (then it must exist, as one $AITBC_CONFIG names must).
    """
    env = os.environ
    file = path or config_path(env)
    data = read_config_file(file, required=path is not None or bool(env.get(CONFIG_ENV)))
    try:
        SettingsFields.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"bad config file {file}: {_describe(exc, env=False)}") from None
    if eth_rpc := env.get(ETH_RPC_ENV):
        data = {**data, "rpc_url": eth_rpc}  # over the file; $AITBC_RPC_URL still wins
    try:
        settings = UserSettings(**data)
    except ValidationError as exc:
        raise ConfigError(f"bad setting in the environment (over {file}): {_describe(exc, env=True)}") from None
    settings._file = file
    return settings
