"""The mount protocol's records: what the coordinator asks, what each host answers, and the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator

from .._errors import ClusterError

PROBE_PREFIX = ".aitbc-probe-"
MountSource = Literal["nfs", "s3", "ipfs"]


class MountError(ClusterError):
    """Raised inside this package only; every public function turns it into a report problem."""


class MountSettings(BaseModel):
    """Host-side settings of the agent (nothing here travels over the bus)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    s3_credentials_file: Path | None = Field(default=None, description="s3fs passwd file ACCESS:SECRET (mode 600)")
    ipfs_api: str | None = Field(default=None, description="Kubo RPC API URL used when the command names none")
    install_missing: bool = True
    apt_get: tuple[str, ...] = ("apt-get",)


class MountCommand(BaseModel):
    """To every host: make ``source`` available at ``mountpoint`` and check it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["mount"] = "mount"
    source: MountSource
    target: str = Field(description="nfs: SERVER:/export[/path]; s3: BUCKET; ipfs: CID")
    endpoint: str | None = Field(default=None, description="s3: the S3 endpoint URL; ipfs: the Kubo API URL")
    mountpoint: str
    nfs_version: Literal[3, 4] = 4
    check_write: bool = True
    measure_bytes: int = Field(default=4 << 20, ge=0, le=1 << 30)

    @field_validator("mountpoint")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not Path(value).is_absolute():
            raise ValueError(f"mountpoint must be an absolute path, got {value!r}")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        if not value or any(c in value for c in "\0\n"):
            raise ValueError("target must be a non-empty single line")
        return value


class Manifest(BaseModel):
    """Every file under a root: relative path -> (size, sha256); ``digest`` summarises it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: dict[str, tuple[int, str]]
    digest: str
    bytes_total: int
    count: int


class AccessReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    readable: bool
    writable: bool | None = Field(description="None: not checked")
    errors: tuple[str, ...] = ()


class IoReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_ms: float | None = Field(description="median of small operations")
    write_mb_s: float | None
    read_mb_s: float | None
    probe_bytes: int
    notes: tuple[str, ...] = ()


class MountReport(BaseModel):
    # ``ok`` is computed: it appears in JSON and is ignored when read back.
    model_config = ConfigDict(extra="ignore", frozen=True)

    host: str
    source: MountSource
    target: str
    mountpoint: str
    mounted: bool
    method: str = Field(description="kernel-nfs, libnfs-userspace, s3fs-fuse, ipfs-fetch")
    installed: tuple[str, ...] = Field(default=(), description="packages installed by this request")
    access: AccessReport | None = None
    manifest: Manifest | None = None
    io: IoReport | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not self.problems


class ManifestComparison(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    digest: str | None = Field(description="the digest most hosts have")
    agreeing: tuple[str, ...]
    differences: dict[str, dict[str, list[str]]] = Field(default_factory=dict)


class ClusterMountReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: MountSource
    target: str
    mountpoint: str
    hosts: dict[str, MountReport]
    errors: dict[str, str] = Field(default_factory=dict, description="hosts that sent no report, and why")
    comparison: ManifestComparison
    ok: bool
    not_exercised: tuple[str, ...] = ()
