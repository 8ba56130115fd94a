"""Profiles: where the bus, the content store and the chain are, written by ``aitbc devnet up``.

A profile is a small JSON file under ``$AITBC_HOME``; every later command (provider
daemons, the step-by-step CLI, the coordinator daemon) reads it, so they all talk to
the same servers without repeating addresses on every command line.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import ConfigError
from .messaging._settings import BusSettings  # noqa: F401 - the broker's settings, re-exported here
from .records import Address, id_path
from .settings import NetworkSettings, parse_broker

PROFILE_FILE = "profile.json"
LOCALHOST = "127.0.0.1"


class ServiceProcess(BaseModel):
    """A detached server the devnet started: what ``devnet down`` and the tests need to stop it."""

    model_config = ConfigDict(frozen=True)

    name: str
    pid: int
    host: str = LOCALHOST
    port: int
    log: Path

    def alive(self) -> bool:
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as dead.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local", "kubo"] = "local"
    root: Path | None = Field(default=None, description="local store directory (kind=local)")
    api: str | None = Field(default=None, description="Kubo RPC base URL (kind=kubo)")


class ChainSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rpc_url: str
    chain_id: int
    escrow: Address
    deployed_block: int = 0
    confirmations: int | None = Field(
        default=None, ge=1, le=1000,
        description="blocks (counting its own) a transaction needs before it counts as done; default 1 on a "
                    "local devnet (chain id 31337/1337), 12 on any other chain (tx.PUBLIC_CONFIRMATIONS)")


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "devnet"
    bus: BusSettings
    store: StoreSettings
    chain: ChainSettings
    services: tuple[ServiceProcess, ...] = ()
    providers: tuple[str, ...] = Field(default=(), description="wallet names of the devnet's provider daemons")


def network_profile(name: str, network: NetworkSettings) -> Profile:
    """A configured network as a profile: the servers a remote stack connects to (nothing is started)."""
    host, port, tls = parse_broker(network.broker)
    if network.rpc_url is None:
        raise ConfigError(f"network {name!r} has no rpc_url")
    try:
        bus = BusSettings(host=host, port=port, tls=tls, ca_file=network.broker_ca_file,
                          username=network.broker_username, password_file=network.broker_password_file)
    except ValueError as exc:  # pydantic's ValidationError: e.g. a CA file for a broker without TLS
        raise ConfigError(f"network {name!r}: broker settings: {exc}") from None
    return Profile(
        name=name, bus=bus, store=StoreSettings(kind="kubo", api=network.ipfs_api),
        chain=ChainSettings(rpc_url=network.rpc_url, chain_id=network.chain_id, escrow=network.escrow,
                            deployed_block=network.deployed_block, confirmations=network.confirmations))


def training_dir(home: Path, training_id: str) -> Path:
    """Where a training's daemon keeps its log and pid file (UnsafeNameError for an id that is a path)."""
    return id_path(home / "trainings", training_id)


def profile_path(home: Path) -> Path:
    return home / PROFILE_FILE


def save_profile(home: Path, profile: Profile) -> Path:
    path = profile_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(profile.model_dump_json(indent=2))
    os.replace(tmp, path)
    return path


def load_profile(home: Path) -> Profile:
    path = profile_path(home)
    if not path.is_file():
        raise ConfigError(f"no devnet profile at {path}; start one with 'aitbc devnet up'")
    try:
        return Profile.model_validate_json(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"unreadable profile {path}: {exc}") from exc


def remove_profile(home: Path) -> None:
    profile_path(home).unlink(missing_ok=True)


PASSWORD_FILE = "wallet-password"


def devnet_password(home: Path, *, create: bool = False) -> str | None:
    """The password of the devnet's own wallets: $AITBC_PASSWORD or $AITBC_WALLET_PASSWORD (its older name), else
    a random one kept 0600 in $AITBC_HOME."""
    if env := os.environ.get("AITBC_PASSWORD") or os.environ.get("AITBC_WALLET_PASSWORD"):
        return env
    path = home / "devnet" / PASSWORD_FILE
    if path.is_file():
        return path.read_text().strip()
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    return password
