"""``torchrun`` on a trusted cluster: the launch plan (pure), the wire protocol, and the coordinator.

The engine is ``torch.distributed`` started by ``torchrun`` with the c10d rendezvous (gloo on
CPU, NCCL on GPU); nothing here is a collective or a rendezvous of its own. What this module
adds around it:

* **the plan** (:func:`plan_launch`, pure): the hosts ranked most capable first (GPUs, GPU
  memory, RAM, cores), the first one the master (it hosts the c10d store), the rest of the
  reachable hosts kept as spares;
* **the torchrun command** (:func:`torchrun_argv` / :func:`torchrun_env`, pure), with the three
  settings multi-namespace (and multi-homed) hosts need: ``--rdzv-conf=is_host=1|0`` so only the
  master hosts the store, ``--local-addr`` so every node advertises its own address instead of
  a host name that may resolve to 127.0.0.1, and ``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME``
  on GPU hosts) set to the interface that reaches the master;
* **the protocol**: signed control requests to each host's agent (:mod:`.agent`) on
  ``aitbc/v1/cluster/{cluster}/control/{host}``, its replies, the job events it streams back
  (log lines, metric lines, rendezvous results, exit status) and the coordinator's heartbeat;
* **the coordinator** (:class:`TrainingCoordinator`): inventory, plan, a port reserved on the
  master, preflight on every host (TCP to the master's port, script and dataset readable,
  checkpoint directory writable), launch, confirmation that the rendezvous formed with the
  expected world size, streaming, and crash handling (:mod:`.recovery`), every decision in the
  hash-chained audit log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import MessagingError
from ..messaging.topics import PREFIX
from ..models import ID_PATTERN
from .errors import ClusterError
from .inventory import ClusterInventory, HostInventory
from .mounts import MountCommand
from .spec import NAME_PATTERN, ClusterSpec, HostSpec

if TYPE_CHECKING:
    from ..audit import AuditLog
    from ..messaging.channel import SignedChannel

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


# --- the plan (pure) --------------------------------------------------------------------------

class HostSlot(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    address: str
    slot: int = Field(ge=0, description="0 is the master; spares are numbered after the active hosts")
    role: Literal["master", "worker", "spare"]
    gpus: int = 0
    gpu_memory_bytes: int = 0
    ram_bytes: int = 0
    cpu_cores: int = 0


class LaunchPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    hosts: tuple[HostSlot, ...]
    spares: tuple[HostSlot, ...] = ()
    nproc_per_node: int = Field(ge=1)
    min_nodes: int = Field(ge=1)
    max_nodes: int = Field(ge=1)
    max_restarts: int = Field(ge=0)
    backend: Literal["gloo", "nccl"]

    @property
    def master(self) -> HostSlot:
        return self.hosts[0]

    @property
    def world_size(self) -> int:
        return self.max_nodes * self.nproc_per_node

    @property
    def min_world_size(self) -> int:
        return self.min_nodes * self.nproc_per_node


def capability_key(host: HostInventory) -> tuple[Any, ...]:
    """Sort key, most capable first: GPUs, then GPU memory, RAM, cores; the name breaks ties."""
    gpu_memory = sum(g.memory_total_bytes for g in host.gpus)
    return (-len(host.gpus), -gpu_memory, -host.ram_total_bytes, -host.cpu_cores, host.name)


def _slot(host: HostInventory, slot: int, role: Literal["master", "worker", "spare"], address: str) -> HostSlot:
    return HostSlot(name=host.name, address=address, slot=slot, role=role, gpus=len(host.gpus),
                    gpu_memory_bytes=sum(g.memory_total_bytes for g in host.gpus), ram_bytes=host.ram_total_bytes,
                    cpu_cores=host.cpu_cores)


def plan_launch(inventory: ClusterInventory, spec: ClusterSpec, *, hosts: int, job_id: str,
                min_hosts: int | None = None, nproc_per_node: int | Literal["auto"] = "auto",
                max_restarts: int = 3) -> LaunchPlan:
    """Pick ``hosts`` reachable hosts, most capable first; the first is the master, the rest spares.

    ``nproc_per_node="auto"`` is the smallest GPU count of the chosen hosts when all have GPUs
    (one rank per GPU, NCCL), else 1 (one gloo rank per host: CPU ranks share the cores).
    """
    if hosts < 1:
        raise ClusterError(f"--hosts must be at least 1, got {hosts}")
    min_hosts = hosts if min_hosts is None else min_hosts
    if not 1 <= min_hosts <= hosts:
        raise ClusterError(f"--min-hosts must be between 1 and --hosts ({hosts}), got {min_hosts}")
    if max_restarts < 0:
        raise ClusterError(f"--max-restarts must be >= 0, got {max_restarts}")
    reachable = [h for h in inventory.hosts if h.reachable and h.address and spec.host(h.address) is not None]
    if len(reachable) < hosts:
        silent = ", ".join(f"{h.name} ({h.error or 'no answer'})" for h in inventory.hosts if not h.reachable)
        raise ClusterError(f"cluster {spec.name} has {len(reachable)} reachable hosts, {hosts} wanted"
                           + (f"; unreachable: {silent}" if silent else ""))
    ranked = sorted(reachable, key=capability_key)
    chosen, rest = ranked[:hosts], ranked[hosts:]
    all_gpu = all(h.gpus for h in chosen)
    if nproc_per_node == "auto":
        nproc = min(len(h.gpus) for h in chosen) if all_gpu else 1
    else:
        nproc = int(nproc_per_node)
        if nproc < 1:
            raise ClusterError(f"--nproc-per-node must be >= 1 or 'auto', got {nproc_per_node}")
        if all_gpu and nproc > min(len(h.gpus) for h in chosen):
            raise ClusterError(f"--nproc-per-node {nproc} is more than the fewest GPUs on a chosen host "
                               f"({min(len(h.gpus) for h in chosen)})")
    slots = tuple(_slot(h, i, "master" if i == 0 else "worker", h.address or "") for i, h in enumerate(chosen))
    spares = tuple(_slot(h, hosts + i, "spare", h.address or "") for i, h in enumerate(rest))
    return LaunchPlan(cluster=spec.name, job_id=job_id, hosts=slots, spares=spares, nproc_per_node=nproc,
                      min_nodes=min_hosts, max_nodes=hosts, max_restarts=max_restarts,
                      backend="nccl" if all_gpu else "gloo")


def torchrun_argv(spec: TorchrunSpec, *, is_master: bool, local_addr: str, python: str) -> list[str]:
    """The torchrun command of one host (``python -m torch.distributed.run``: the venv's torchrun)."""
    nnodes = str(spec.max_nodes) if spec.min_nodes == spec.max_nodes else f"{spec.min_nodes}:{spec.max_nodes}"
    conf = (f"is_host={1 if is_master else 0},last_call_timeout={spec.last_call_timeout_s},"
            f"join_timeout={spec.join_timeout_s}")
    return [python, "-m", "torch.distributed.run",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={spec.master_addr}:{spec.port}", f"--rdzv-id={spec.job_id}",
            f"--nnodes={nnodes}", f"--nproc-per-node={spec.nproc_per_node}", f"--max-restarts={spec.max_restarts}",
            f"--rdzv-conf={conf}", f"--local-addr={local_addr}", "--monitor-interval=0.5",
            spec.script, *spec.script_args]


def torchrun_env(spec: TorchrunSpec, *, ifname: str | None, gpus: bool) -> dict[str, str]:
    """Environment for torchrun and its workers (added to a scrubbed environment)."""
    env = {"LOGLEVEL": "INFO",  # torchrun logs its rendezvous result at INFO: the world-size confirmation
           "PYTHONUNBUFFERED": "1", "DIST_BACKEND": spec.backend, "TRAIN_JOB_ID": spec.job_id,
           # With the rendezvous TCPStore shared (the default), only a node's first rendezvous publishes the
           # workers' MASTER_ADDR: a node joining a later round (a spare taking a crashed host's slot) then
           # waits 60 s for a key the old rank 0 never writes again, and the round fails. Unshared, rank 0
           # publishes it every round.
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
        if gpus:
            env["NCCL_SOCKET_IFNAME"] = ifname
    if spec.checkpoint_dir:
        env["CHECKPOINT_DIR"] = spec.checkpoint_dir
    if spec.checkpoint_every:
        env["CHECKPOINT_EVERY"] = str(spec.checkpoint_every)
    return env


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


# --- the coordinator --------------------------------------------------------------------------

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


EventSink = Callable[[JobEvent], None]
NoticeSink = Callable[[str], None]


class _HostRun:
    def __init__(self, slot: HostSlot, now: float) -> None:
        self.slot = slot
        self.state = "launching"  # launching -> running -> done | failed | stopped
        self.returncode: int | None = None
        self.reason: str | None = None
        self.last_seen = now
        self.rendezvous: list[RendezvousInfo] = []
        self.rendezvous_at = 0.0  # when the latest one arrived (monotonic)
        self.stop_sent = False

    @property
    def active(self) -> bool:
        return self.state in ("launching", "running")


class TrainingCoordinator:
    """Plans, checks, launches and watches one job over the signed channel.

    ``on_event`` receives every event a host sends (log lines, metrics, rendezvous, state) and
    ``on_notice`` one-line summaries of what the coordinator does; both default to nothing.
    Every event is also appended to ``events_log`` (JSON lines) when given.
    """

    def __init__(self, channel: SignedChannel, spec: ClusterSpec, *, audit: AuditLog,
                 events_log: Path | None = None, on_event: EventSink | None = None,
                 on_notice: NoticeSink | None = None, request_timeout_s: float = 15.0,
                 inventory_timeout_s: float = 5.0, host_timeout_s: float = 20.0, beat_interval_s: float = 2.0,
                 finish_grace_s: float = 30.0) -> None:
        self._channel = channel
        self._spec = spec
        self._audit = audit
        self._events_log = events_log
        self._on_event = on_event or (lambda event: None)
        self._on_notice = on_notice or (lambda text: None)
        self._request_timeout = request_timeout_s
        self._inventory_timeout = inventory_timeout_s
        self._host_timeout = host_timeout_s
        self._beat_interval = beat_interval_s
        self._finish_grace = finish_grace_s

    # -- requests to one host --------------------------------------------------------------

    async def request(self, host: HostSpec | HostSlot, command: BaseModel, *,
                      timeout: float | None = None) -> ControlReply:
        nonce = uuid.uuid4().hex
        try:
            return await self._channel.request(
                control_topic(self._spec.name, host.address),
                ControlRequest(cluster=self._spec.name, nonce=nonce, command=command),  # type: ignore[arg-type]
                control_reply_topic(self._spec.name, self._channel.address, nonce), ControlReply,
                timeout=timeout or self._request_timeout, expected_sender=host.address)
        except MessagingError as exc:
            return ControlReply(ok=False, error=f"{host.name}: {exc}")

    # -- the job ---------------------------------------------------------------------------

    async def run(self, request: TrainRequest) -> TrainResult:
        from .transport import collect_inventory

        started = time.monotonic()
        job_id = request.job_id or new_job_id(self._spec.name)
        inventory = await collect_inventory(self._channel, self._spec, timeout=self._inventory_timeout)
        plan = plan_launch(inventory, self._spec, hosts=request.hosts, job_id=job_id, min_hosts=request.min_hosts,
                           nproc_per_node=request.nproc_per_node, max_restarts=request.max_restarts)
        await self._audit.append("job-planned", job=job_id, master=plan.master.name,
                                 hosts=[h.name for h in plan.hosts], spares=[h.name for h in plan.spares],
                                 nproc_per_node=plan.nproc_per_node, nnodes=f"{plan.min_nodes}:{plan.max_nodes}",
                                 max_restarts=plan.max_restarts, backend=plan.backend,
                                 unreachable=inventory.unreachable_hosts)
        self._on_notice(f"job {job_id}: master {plan.master.name}, hosts {', '.join(h.name for h in plan.hosts)}"
                        + (f", spares {', '.join(h.name for h in plan.spares)}" if plan.spares else ""))

        reserved = await self.request(plan.master, ReservePort(job_id=job_id))
        if not reserved.ok:
            await self._audit.append("job-failed", job=job_id, reason=f"port reservation: {reserved.error}")
            raise ClusterError(f"the master {plan.master.name} could not reserve a port: {reserved.error}")
        master_addr, port = str(reserved.data["address"]), int(reserved.data["port"])
        self._on_notice(f"rendezvous endpoint {master_addr}:{port} on {plan.master.name}")

        script = str(request.script.resolve())
        datasets = tuple(str(p.resolve()) for p in request.datasets)
        ckpt = str(request.checkpoint_dir.resolve()) if request.checkpoint_dir else None
        preflight_cmd = Preflight(job_id=job_id, master_addr=master_addr, port=port, script=script,
                                  datasets=datasets, checkpoint_dir=ckpt)
        try:
            reports = await self._preflight(plan.hosts, preflight_cmd)
        except BaseException:
            await self.request(plan.master, Stop(job_id=job_id, reason="preflight failed"))
            raise
        spec = TorchrunSpec(job_id=job_id, script=script, script_args=request.script_args,
                            nproc_per_node=plan.nproc_per_node, min_nodes=plan.min_nodes, max_nodes=plan.max_nodes,
                            max_restarts=plan.max_restarts, master_addr=master_addr, port=port, backend=plan.backend,
                            last_call_timeout_s=request.last_call_timeout_s, join_timeout_s=request.join_timeout_s,
                            checkpoint_dir=ckpt, checkpoint_every=request.checkpoint_every, datasets=datasets,
                            sandbox=request.sandbox, coordinator_timeout_s=max(10.0, 5 * self._beat_interval))
        watch = _JobWatch(self, plan, spec, preflight_cmd, reports, request, started)
        return await watch.run()

    async def _preflight(self, slots: Sequence[HostSlot], command: Preflight) -> dict[str, PreflightReport]:
        replies = await asyncio.gather(*(self.request(s, command) for s in slots))
        reports: dict[str, PreflightReport] = {}
        problems: list[str] = []
        for slot, reply in zip(slots, replies, strict=True):
            if not reply.ok:
                problems.append(f"{slot.name}: {reply.error}")
                continue
            report = PreflightReport.model_validate(reply.data)
            reports[slot.name] = report
            problems += [f"{slot.name}: {p}" for p in report.problems]
        await self._audit.append("preflight", job=command.job_id, ok=not problems, problems=problems,
                                 hosts={n: {"local_addr": r.local_addr, "ifname": r.ifname,
                                            "connect_ms": r.connect_ms} for n, r in reports.items()})
        if problems:
            raise ClusterError("preflight failed:\n  " + "\n  ".join(problems))
        for name, r in reports.items():
            self._on_notice(f"preflight {name}: {r.local_addr} ({r.ifname}) reaches the master in "
                            f"{r.connect_ms:.1f} ms; script and {len(r.datasets)} dataset path(s) readable")
        return reports

    async def stop_host(self, slot: HostSlot, job_id: str, reason: str) -> ControlReply:
        return await self.request(slot, Stop(job_id=job_id, reason=reason))


class _JobWatch:
    """The launched job: events in, recovery decisions out. One per :meth:`TrainingCoordinator.run`."""

    def __init__(self, coord: TrainingCoordinator, plan: LaunchPlan, spec: TorchrunSpec, preflight: Preflight,
                 reports: dict[str, PreflightReport], request: TrainRequest, started: float) -> None:
        self.c = coord
        self.plan = plan
        self.spec = spec
        self.preflight_cmd = preflight
        self.reports = dict(reports)
        self.request = request
        self.started = started
        now = time.monotonic()
        self.runs: dict[str, _HostRun] = {s.name: _HostRun(s, now) for s in plan.hosts}
        self.by_address = {s.address.lower(): s.name for s in (*plan.hosts, *plan.spares)}
        self.spares_used: list[str] = []
        self.unhealthy: set[str] = set()
        self.failures: list[dict[str, Any]] = []
        self.formed: set[tuple[tuple[str, int], ...]] = set()
        self.world_confirmed: int | None = None
        self.first_success: float | None = None
        self.failed_reason: str | None = None
        self.metrics: list[dict[str, Any]] = []
        self.takeovers: set[asyncio.Task[None]] = set()
        self.recovery_pending = False
        self.membership_changed = 0.0  # a world counts only if every host reported it after this

    @property
    def audit(self) -> AuditLog:
        return self.c._audit

    async def run(self) -> TrainResult:
        job = self.spec.job_id
        channel = self.c._channel
        events_file = self.c._events_log.open("a") if self.c._events_log else None
        try:
            async with channel.subscribe(events_filter(self.c._spec.name, job), JobEvent) as events:
                beats = asyncio.create_task(self._beat(), name=f"beat-{job}")
                try:
                    await self._launch_all()
                    await self._watch(events, events_file)
                finally:
                    await self._stop_active("coordinator finished" if self.failed_reason is None
                                            else f"job failed: {self.failed_reason}")
                    for task in self.takeovers:
                        task.cancel()
                    beats.cancel()
                    await asyncio.gather(beats, *self.takeovers, return_exceptions=True)
        finally:
            if events_file is not None:
                events_file.close()
        return await self._result()

    async def _beat(self) -> None:
        topic = beat_topic(self.c._spec.name, self.spec.job_id)
        while True:
            with contextlib.suppress(MessagingError):
                await self.c._channel.publish(topic, CoordinatorBeat(job_id=self.spec.job_id))
            await asyncio.sleep(self.c._beat_interval)

    async def _launch(self, slot: HostSlot) -> ControlReply:
        reply = await self.c.request(slot, Launch(spec=self.spec, is_master=slot.role == "master"))
        await self.audit.append("launched" if reply.ok else "launch-failed", job=self.spec.job_id, host=slot.name,
                                role=slot.role, error=reply.error, command=reply.data.get("command"),
                                sandbox=reply.data.get("sandbox"))
        return reply

    async def _launch_all(self) -> None:
        master, *others = self.plan.hosts
        first = await self._launch(master)  # it releases the reserved port and starts the c10d store
        if not first.ok:
            self.failed_reason = f"launch on the master {master.name} failed: {first.error}"
            raise ClusterError(self.failed_reason)
        self.runs[master.name].state = "running"
        self.c._on_notice(f"launched on {master.name} (master): {' '.join(first.data.get('command', []))}")
        replies = await asyncio.gather(*(self._launch(s) for s in others))
        for slot, reply in zip(others, replies, strict=True):
            run = self.runs[slot.name]
            if reply.ok:
                run.state = "running"
                self.c._on_notice(f"launched on {slot.name}")
            else:
                await self._host_failed(run, None, f"launch failed: {reply.error}")

    async def _watch(self, events: Any, sink: Any) -> None:
        deadline = None if self.request.timeout_s is None else self.started + self.request.timeout_s
        launched_at = time.monotonic()
        iterator = events.__aiter__()
        pending: asyncio.Task[Any] | None = None
        try:
            while True:
                now = time.monotonic()
                if not any(r.active for r in self.runs.values()) and not self.takeovers:
                    return
                if deadline is not None and now > deadline:
                    await self._fail(f"job ran past its {self.request.timeout_s:.0f}s limit")
                    return
                if self.world_confirmed is None and now - launched_at > self.request.rendezvous_timeout_s:
                    await self._fail(f"no rendezvous with the expected world size within "
                                     f"{self.request.rendezvous_timeout_s:.0f}s")
                    return
                if self.first_success is not None and now - self.first_success > self.c._finish_grace:
                    await self._stop_active("the job finished on the other hosts")
                    return
                await self._check_silence(now)
                if pending is None:
                    pending = asyncio.ensure_future(iterator.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=1.0)
                if not done:
                    continue
                verified, pending = pending.result(), None
                name = self.by_address.get(verified.sender.lower())
                if name is None:
                    continue  # signed, but not by a host of this job
                event: JobEvent = verified.message
                if event.host != name:
                    event = event.model_copy(update={"host": name})  # the spec names the host, not the host
                if sink is not None:
                    sink.write(event.model_dump_json() + "\n")
                    sink.flush()
                self.c._on_event(event)
                await self._handle(name, event)
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending

    async def _handle(self, name: str, event: JobEvent) -> None:
        run = self.runs.get(name)
        if run is None:
            return
        run.last_seen = time.monotonic()
        if event.kind == "metric" and event.metric is not None:
            self.metrics.append({**event.metric, "_host": name})
        elif event.kind == "rendezvous" and event.rendezvous is not None:
            run.rendezvous.append(event.rendezvous)
            run.rendezvous_at = time.monotonic()
            await self._check_formed()
        elif event.kind == "state" and event.state == "exited":
            await self._exited(run, event.returncode, event.reason)

    async def _check_formed(self) -> None:
        """Audit each world that all running hosts agree on: the first is the launch, later ones recoveries."""
        running = [r for r in self.runs.values() if r.state == "running"]
        latest = [r.rendezvous[-1] for r in running if r.rendezvous and r.rendezvous_at > self.membership_changed]
        if len(latest) != len(running) or not running:
            return
        sizes = {i.world_size for i in latest}
        if len(sizes) != 1:
            return
        world = sizes.pop()
        if world != len(running) * self.plan.nproc_per_node:
            return
        key = tuple(sorted((r.slot.name, r.rendezvous[-1].restart_count) for r in running))
        if key in self.formed:
            return
        self.formed.add(key)
        ranks = {r.slot.name: r.rendezvous[-1].group_rank for r in running}
        first = self.world_confirmed is None
        self.world_confirmed = world
        self.recovery_pending = False
        await self.audit.append("rendezvous-formed" if first else "rendezvous-reformed", job=self.spec.job_id,
                                world_size=world, expected=self.plan.world_size, node_ranks=ranks,
                                restart_counts={r.slot.name: r.rendezvous[-1].restart_count for r in running})
        self.c._on_notice(f"rendezvous {'formed' if first else 're-formed'}: world size {world}, node ranks "
                          + ", ".join(f"{n}={k}" for n, k in sorted(ranks.items(), key=lambda x: x[1])))

    async def _exited(self, run: _HostRun, returncode: int | None, reason: str | None) -> None:
        if not run.active:
            return
        run.returncode, run.reason = returncode, reason
        if returncode == 0:
            run.state = "done"
            if self.first_success is None:
                self.first_success = time.monotonic()
                await self.audit.append("host-finished", job=self.spec.job_id, host=run.slot.name)
            return
        if run.stop_sent:
            run.state = "stopped"
            return
        await self._host_failed(run, returncode, reason or f"torchrun exited with {returncode}")

    async def _check_silence(self, now: float) -> None:
        for run in list(self.runs.values()):
            if run.active and now - run.last_seen > self.c._host_timeout:
                run.reason = f"no event for {now - run.last_seen:.0f}s"
                await self.audit.append("host-silent", job=self.spec.job_id, host=run.slot.name,
                                        silent_s=round(now - run.last_seen, 1))
                with contextlib.suppress(Exception):  # a silent agent rarely answers: do not wait long
                    await self.c.request(run.slot, Stop(job_id=self.spec.job_id, reason="silent: replaced"),
                                         timeout=3.0)
                await self._host_failed(run, None, run.reason)

    async def _host_failed(self, run: _HostRun, returncode: int | None, reason: str) -> None:
        from .recovery import choose_spare, enough_hosts

        run.state, run.returncode, run.reason = "failed", returncode, reason
        self.membership_changed = time.monotonic()
        self.unhealthy.add(run.slot.name)
        failure = {"host": run.slot.name, "returncode": returncode, "reason": reason,
                   "after_s": round(time.monotonic() - self.started, 1)}
        self.failures.append(failure)
        await self.audit.append("host-failed", job=self.spec.job_id, **failure)
        self.c._on_notice(f"detected: {run.slot.name} failed ({reason})")
        if self.first_success is not None:
            return
        if run.slot.role == "master":
            await self._fail(f"the master {run.slot.name} (c10d store host) failed: the rendezvous cannot survive it")
            return
        used = set(self.runs) | set(self.spares_used)
        spare = choose_spare(self.plan.spares, used=used, unhealthy=self.unhealthy)
        alive = sum(1 for r in self.runs.values() if r.active)
        if spare is not None:
            self.recovery_pending = True
            task = asyncio.create_task(self._takeover(run.slot, spare), name=f"takeover-{spare.name}")
            self.takeovers.add(task)
            task.add_done_callback(self.takeovers.discard)
        elif enough_hosts(alive, self.plan.min_nodes):
            self.recovery_pending = True
            await self.audit.append("recovery-continue", job=self.spec.job_id, failed=run.slot.name,
                                    remaining=alive, min_nodes=self.plan.min_nodes,
                                    action="re-rendezvous of the remaining hosts (no spare available)")
            self.c._on_notice(f"recovery: no spare; {alive} hosts re-rendezvous without {run.slot.name}")
        else:
            await self._fail(f"{alive} hosts left, fewer than --min-hosts {self.plan.min_nodes}, and no spare")

    async def _takeover(self, failed: HostSlot, spare: HostSlot) -> None:
        self.spares_used.append(spare.name)
        slot = spare.model_copy(update={"role": "worker", "slot": failed.slot})
        reports = await self.c._preflight([slot], self.preflight_cmd.model_copy())
        self.reports.update(reports)
        self.runs[spare.name] = run = _HostRun(slot, time.monotonic())
        self.membership_changed = time.monotonic()
        reply = await self._launch(slot)
        if not reply.ok:
            await self._host_failed(run, None, f"launch failed: {reply.error}")
            return
        run.state = "running"
        await self.audit.append("spare-assigned", job=self.spec.job_id, failed=failed.name, spare=spare.name,
                                slot=failed.slot)
        self.c._on_notice(f"recovery: spare {spare.name} takes {failed.name}'s slot")

    async def _fail(self, reason: str) -> None:
        if self.failed_reason is None:
            self.failed_reason = reason
            await self.audit.append("job-failed", job=self.spec.job_id, reason=reason)
            self.c._on_notice(f"job failed: {reason}")
        self.recovery_pending = False
        await self._stop_active(reason)

    async def _stop_active(self, reason: str) -> None:
        active = [r for r in self.runs.values() if r.active]
        if not active:
            return
        for r in active:
            r.stop_sent = True
        replies = await asyncio.gather(*(self.c.stop_host(r.slot, self.spec.job_id, reason) for r in active))
        for r, reply in zip(active, replies, strict=True):
            r.state = "stopped"
            r.reason = reason if reply.ok else f"{reason}; stop failed: {reply.error}"
        await self.audit.append("hosts-stopped", job=self.spec.job_id, hosts=[r.slot.name for r in active],
                                reason=reason)

    async def _result(self) -> TrainResult:
        from .recovery import verify_step_log

        done = [r for r in self.runs.values() if r.state == "done"]
        ok = self.failed_reason is None and bool(done)
        continuity = None
        rank0 = [m for m in self.metrics if m.get("rank") == 0 and m.get("event") in ("step", "checkpoint", "resume")]
        if any(m.get("event") == "step" and "attempt" in m for m in rank0):
            report = verify_step_log(rank0)
            continuity = report.model_dump(mode="json")
            await self.audit.append("checkpoint-continuity", job=self.spec.job_id, ok=report.ok,
                                    attempts=len(report.attempts), effective_steps=report.effective_steps,
                                    problems=list(report.problems))
        error = self.failed_reason
        if error is None and not done:
            error = "no host finished the job"
        await self.audit.append("job-finished" if ok else "job-ended", job=self.spec.job_id, ok=ok, error=error,
                                hosts={n: {"state": r.state, "returncode": r.returncode}
                                       for n, r in self.runs.items()},
                                spares_used=self.spares_used, world_size=self.world_confirmed)
        hosts = {n: HostOutcome(name=n, role=r.slot.role, state=r.state, returncode=r.returncode, reason=r.reason,
                                group_rank=r.rendezvous[-1].group_rank if r.rendezvous else None,
                                rendezvous=r.rendezvous) for n, r in self.runs.items()}
        return TrainResult(
            job_id=self.spec.job_id, cluster=self.c._spec.name, ok=ok, error=error, master=self.plan.master.name,
            master_addr=self.spec.master_addr, port=self.spec.port, world_size_expected=self.plan.world_size,
            world_size_confirmed=self.world_confirmed, plan=self.plan, preflight=self.reports, hosts=hosts,
            failures=self.failures, spares_used=self.spares_used, continuity=continuity,
            audit_log=str(self.audit.path), events_log=str(self.c._events_log) if self.c._events_log else None,
            duration_s=round(time.monotonic() - self.started, 2))
