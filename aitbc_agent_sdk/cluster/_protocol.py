"""The cluster's wire protocol: topics, the signed control messages and job events, and parsing
what torchrun and the ranks print (pure).

* **control**: signed requests from a coordinator (:mod:`._launcher`) to each host's agent
  (:mod:`._host_agent`) on ``aitbc/v1/cluster/{cluster}/control/{host}`` (reserve a port,
  preflight, launch, stop, mount) and their replies;
* **events**: what a host's agent streams back about a job (log lines, metric lines,
  rendezvous results, exit status), the coordinator's heartbeat, and a host's retained status;
* **log parsing**: ``AITBC_METRIC {...}`` lines and torchrun's 'Rendezvous complete' block.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..messaging._topics import PREFIX
from ..records import ID_PATTERN
from .mounts import MountCommand
from ._spec import NAME_PATTERN

log = logging.getLogger(__name__)

JOB_ID_PATTERN = ID_PATTERN  # the market's one id pattern: job ids name directories and topic levels
METRIC_PREFIX = "AITBC_METRIC "  # a rank's metric line: this prefix, then one JSON object
DEFAULT_LAST_CALL_TIMEOUT_S = 5
DEFAULT_JOIN_TIMEOUT_S = 300


# --- topics -----------------------------------------------------------------------------------

def control_topic(cluster: str, host_address: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/control/{host_address}"


def control_reply_topic(cluster: str, requester: str, nonce: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/control-reply/{requester}/{nonce}"


def events_topic(cluster: str, job_id: str, host_address: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/job/{job_id}/events/{host_address}"


def events_filter(cluster: str, job_id: str = "+") -> str:
    return f"{PREFIX}/cluster/{cluster}/job/{job_id}/events/+"


def beat_topic(cluster: str, job_id: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/job/{job_id}/coordinator"


def status_topic(cluster: str, host_address: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/status/{host_address}"


def status_filter(cluster: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/status/+"


def new_job_id(cluster: str) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', cluster)[:40]}-{uuid.uuid4().hex[:10]}"


# --- the wire protocol ------------------------------------------------------------------------

class TorchrunSpec(BaseModel):
    """One job as every host runs it; the host adds its own address and interface."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    script: str = Field(description="absolute path of the training script, the same on every host")
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = Field(ge=1)
    min_nodes: int = Field(ge=1)
    max_nodes: int = Field(ge=1)
    max_restarts: int = Field(default=3, ge=0)
    master_addr: str
    port: int = Field(ge=1, le=65535)
    backend: Literal["gloo", "nccl"] = "gloo"
    last_call_timeout_s: int = Field(default=DEFAULT_LAST_CALL_TIMEOUT_S, ge=0)
    join_timeout_s: int = Field(default=DEFAULT_JOIN_TIMEOUT_S, ge=1)
    checkpoint_dir: str | None = Field(default=None, description="shared storage; the job's working directory")
    checkpoint_every: int | None = Field(default=None, ge=1)
    datasets: tuple[str, ...] = ()
    sandbox: bool = True
    coordinator_timeout_s: float = Field(default=30.0, gt=0, description="stop if the coordinator is silent so long")

    @model_validator(mode="after")
    def _check(self) -> TorchrunSpec:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes {self.min_nodes} > max_nodes {self.max_nodes}")
        if not Path(self.script).is_absolute():
            raise ValueError(f"script must be an absolute path, got {self.script!r}")
        return self


class ReservePort(BaseModel):
    """To the master: bind a free port on its address and hold it (accepting probes) until launch."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["reserve-port"] = "reserve-port"
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    port: int = Field(default=0, ge=0, le=65535, description="0: any free port")


class Preflight(BaseModel):
    """To every host: can you reach the master's port, read the script and data, write checkpoints?"""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["preflight"] = "preflight"
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    master_addr: str
    port: int = Field(ge=1, le=65535)
    script: str
    datasets: tuple[str, ...] = ()
    checkpoint_dir: str | None = None


class Launch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["launch"] = "launch"
    spec: TorchrunSpec
    is_master: bool


class Stop(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["stop"] = "stop"
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    reason: str = ""


ControlCommand = Annotated[ReservePort | Preflight | Launch | Stop | MountCommand, Field(discriminator="kind")]


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str = Field(pattern=NAME_PATTERN)
    nonce: str = Field(pattern=r"^[A-Za-z0-9_-]{8,64}$")
    command: ControlCommand


class ControlReply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    error: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class PreflightReport(BaseModel):
    """What one host found; ``problems`` empty means ready."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    local_addr: str | None = Field(default=None, description="this host's address on the route to the master")
    ifname: str | None = Field(default=None, description="the interface holding local_addr")
    master_reachable: bool = False
    connect_ms: float | None = None
    script_readable: bool = False
    datasets: dict[str, str] = Field(default_factory=dict, description="path -> 'ok' or the error")
    checkpoint_writable: bool | None = None
    problems: tuple[str, ...] = ()


class RendezvousInfo(BaseModel):
    """torchrun's 'Rendezvous complete' result on one host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    restart_count: int
    group_rank: int
    group_world_size: int
    world_size: int
    master_addr: str | None = None
    global_ranks: tuple[int, ...] = ()


EventKind = Literal["log", "metric", "rendezvous", "state"]
HostState = Literal["started", "heartbeat", "exited"]


class JobEvent(BaseModel):
    """One message from a host's agent about a job it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    host: str
    seq: int = Field(ge=0)
    ts: float = Field(default_factory=time.time)
    kind: EventKind
    lines: tuple[str, ...] = ()
    metric: dict[str, Any] | None = None
    rendezvous: RendezvousInfo | None = None
    state: HostState | None = None
    returncode: int | None = None
    reason: str | None = None
    gpus: tuple[dict[str, Any], ...] = ()


class CoordinatorBeat(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    ts: float = Field(default_factory=time.time)


class HostStatus(BaseModel):
    """A host's latest state, published retained so ``aitbc cluster monitor`` sees it at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    job_id: str | None = None
    state: str = "idle"
    ranks: dict[str, dict[str, Any]] = Field(default_factory=dict, description="latest metric per global rank")
    gpus: tuple[dict[str, Any], ...] = ()
    updated_at: float = Field(default_factory=time.time)


# --- parsing what torchrun and the ranks print (pure) -----------------------------------------

_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ (?P<where>\S+)\] ?(?P<text>.*)$")


def parse_metric_line(line: str) -> dict[str, Any] | None:
    """The JSON object of an ``AITBC_METRIC {...}`` line (anywhere in the line), else None."""
    at = line.find(METRIC_PREFIX)
    if at < 0:
        return None
    try:
        value = json.loads(line[at + len(METRIC_PREFIX):])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def is_torchrun_line(line: str) -> bool:
    match = _GLOG.match(line)
    return bool(match and "torch/distributed/" in match.group("where"))


class RendezvousParser:
    """Feed torchrun's log lines; returns a :class:`RendezvousInfo` when a 'Rendezvous complete' block ends."""

    _FIELD = re.compile(r"^\s*(restart_count|master_addr|group_rank|group_world_size|global_ranks|"
                        r"global_world_sizes)=(.*)$")

    def __init__(self) -> None:
        self._fields: dict[str, str] | None = None

    def feed(self, line: str) -> RendezvousInfo | None:
        match = _GLOG.match(line)
        text = match.group("text") if match else line
        if "Rendezvous complete for workers" in text:
            self._fields = {}
            return None
        if self._fields is None:
            return None
        field = self._FIELD.match(text)
        if field:
            self._fields[field.group(1)] = field.group(2).strip()
        if "global_world_sizes" in self._fields:
            found, self._fields = self._fields, None
            try:
                sizes = json.loads(found["global_world_sizes"])
                ranks = json.loads(found.get("global_ranks", "[]"))
                return RendezvousInfo(restart_count=int(found["restart_count"]), group_rank=int(found["group_rank"]),
                                      group_world_size=int(found["group_world_size"]), world_size=int(sizes[0]),
                                      master_addr=found.get("master_addr"), global_ranks=tuple(ranks))
            except (KeyError, ValueError, IndexError, TypeError):
                log.warning("unparsable rendezvous result: %s", found)
        return None
