"""A trusted cluster: its name and the allow-listed hosts, kept in ``$AITBC_HOME/clusters/<name>.json``.

A host is known by its Ethereum address: every message it sends is signed with that key,
so an allow-listed address is what makes a host a member. The host name is only a label.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..records import Address
from ..profile import BusSettings
from ._errors import ClusterConfigError, UnknownClusterError

CLUSTERS_DIR = "clusters"
# A cluster or host name is one MQTT topic level and one file name: no '/', '+', '#' or dots first.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


class HostSpec(BaseModel):
    """One member host. ``gpus`` and ``memory_budget_bytes`` are operator hints, not detection."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    address: Address = Field(description="the host agent's signing address; only these may answer")
    network_address: str | None = Field(default=None, description="IP or DNS name for torch.distributed")
    memory_budget_bytes: int | None = Field(
        default=None, ge=0, description="per-rank memory budget on a CPU-only host (RankBudget source='config')")


class ClusterSpec(BaseModel):
    """The allow-list of a trusted cluster, plus where its bus is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    hosts: tuple[HostSpec, ...] = Field(min_length=1)
    coordinators: tuple[Address, ...] = Field(
        default=(), description="addresses allowed to query hosts; empty means any signed requester")
    bus: BusSettings | None = Field(default=None, description="MQTT broker; None means the devnet profile's")

    @model_validator(mode="after")
    def _unique(self) -> ClusterSpec:
        for what, values in (("name", [h.name for h in self.hosts]), ("address", [h.address for h in self.hosts])):
            if len(set(values)) != len(values):
                raise ValueError(f"host {what}s must be unique in cluster {self.name!r}")
        return self

    def host(self, address: str) -> HostSpec | None:
        return next((h for h in self.hosts if h.address.lower() == address.lower()), None)


def cluster_path(home: Path, name: str) -> Path:
    return home / CLUSTERS_DIR / f"{name}.json"


def save_cluster(home: Path, spec: ClusterSpec) -> Path:
    path = cluster_path(home, spec.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(spec.model_dump_json(indent=2, exclude_none=True))
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    return path


def load_cluster(home: Path, name: str) -> ClusterSpec:
    """Read ``clusters/<name>.json`` (or ``<name>.toml``) under ``home``."""
    for path in (cluster_path(home, name), cluster_path(home, name).with_suffix(".toml")):
        if path.is_file():
            return read_cluster_file(path)
    raise UnknownClusterError(f"no cluster {name!r} in {home / CLUSTERS_DIR} (create it with 'aitbc cluster create')")


def read_cluster_file(path: Path) -> ClusterSpec:
    try:
        if path.suffix == ".toml":
            return ClusterSpec.model_validate(tomllib.loads(path.read_text()))
        return ClusterSpec.model_validate_json(path.read_text())
    except (OSError, ValueError, ValidationError) as exc:
        raise ClusterConfigError(f"unreadable cluster file {path}: {exc}") from exc


def list_clusters(home: Path) -> list[str]:
    root = home / CLUSTERS_DIR
    if not root.is_dir():
        return []
    return sorted({p.stem for p in root.iterdir() if p.suffix in (".json", ".toml")})
