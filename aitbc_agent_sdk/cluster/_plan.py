"""The launch plan and the torchrun command (pure, no I/O).

* **the plan** (:func:`plan_launch`): the hosts ranked most capable first (GPUs, GPU memory,
  RAM, cores), the first one the master (it hosts the c10d store), the rest of the reachable
  hosts kept as spares;
* **the torchrun command** (:func:`torchrun_argv` / :func:`torchrun_env`), with the three
  settings multi-namespace (and multi-homed) hosts need: ``--rdzv-conf=is_host=1|0`` so only the
  master hosts the store, ``--local-addr`` so every node advertises its own address instead of
  a host name that may resolve to 127.0.0.1, and ``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME``
  on GPU hosts) set to the interface that reaches the master.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._errors import ClusterConfigError, ClusterError
from ._inventory import ClusterInventory, HostInventory
from ._protocol import JOB_ID_PATTERN, TorchrunSpec
from ._spec import ClusterSpec


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
        raise ClusterConfigError(f"--hosts must be at least 1, got {hosts}")
    min_hosts = hosts if min_hosts is None else min_hosts
    if not 1 <= min_hosts <= hosts:
        raise ClusterConfigError(f"--min-hosts must be between 1 and --hosts ({hosts}), got {min_hosts}")
    if max_restarts < 0:
        raise ClusterConfigError(f"--max-restarts must be >= 0, got {max_restarts}")
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
            raise ClusterConfigError(f"--nproc-per-node must be >= 1 or 'auto', got {nproc_per_node}")
        if all_gpu and nproc > min(len(h.gpus) for h in chosen):
            raise ClusterConfigError(f"--nproc-per-node {nproc} is more than the fewest GPUs on a chosen host "
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
