"""Trusted-cluster tools that act on hosts: launch a torchrun job and mount shared storage.

They make the SDK calls ``aitbc cluster train|mount`` make: a :class:`TrainingCoordinator` over
the cluster's signed control channel, the same job directory (``$AITBC_HOME/clusters/jobs/JOB``)
and mount audit log. Recovery is in :mod:`._cluster_recover`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..cluster import ClusterError
from ..records import id_path
from ._base import Tool, ToolArgs, ToolContext, ToolResult
from ._cluster_tools import CLUSTER_HELP, WALLET_HELP, cluster_channel, pick_cluster

if TYPE_CHECKING:
    from ..cluster import TrainRequest, TrainResult
    from ..cluster import ClusterSpec



class TrainArgs(ToolArgs):
    hosts: int | None = Field(None, ge=1, le=1024, description="hosts to train on; omitted: every host")
    script: str | None = Field(None, description="training script, at the same path on every host")
    script_args: list[str] = Field(default_factory=list, description="arguments for the script")
    cluster: str | None = Field(None, description=CLUSTER_HELP + "; omitted: the only cluster defined")
    nproc_per_node: int | Literal["auto"] = Field("auto", description="ranks per host; auto: one per GPU, 1 on CPU")
    min_hosts: int | None = Field(None, ge=1, description="elastic: keep training while this many hosts remain")
    max_restarts: int = Field(3, ge=0, le=100, description="torchrun worker-group restarts after a failure")
    checkpoint_dir: str | None = Field(None, description="shared directory for checkpoints (the job's working dir)")
    checkpoint_every: int | None = Field(None, ge=1, description="steps between checkpoints")
    datasets: list[str] = Field(default_factory=list, description="paths every host must read (checked first)")
    sandbox: bool = Field(True, description="run the ranks in the sandbox")
    timeout_s: float | None = Field(None, gt=0, description="seconds for the whole job; omitted: no limit")
    wallet: str | None = Field(None, description=WALLET_HELP)


class MountArgs(ToolArgs):
    source: str = Field(description="NFS 'server:/export', 's3://bucket[/prefix]' or 'ipfs://CID'")
    mount_point: str = Field("/mnt/aitbc-data", description="absolute path where every host sees the data")
    cluster: str | None = Field(None, description=CLUSTER_HELP + "; omitted: the only cluster defined")
    hosts: list[str] = Field(default_factory=list, description="only these hosts; omitted: all")
    endpoint: str | None = Field(None, description="S3 endpoint URL, or Kubo API URL for IPFS")
    check_write: bool = Field(True, description="also check each host can write there")
    timeout_s: float = Field(600.0, gt=0, description="seconds to wait for each host (installs included)")
    wallet: str | None = Field(None, description=WALLET_HELP)


def job_dir(home: Path, job_id: str) -> Path:
    return id_path(home / "clusters" / "jobs", job_id)


async def run_job(ctx: ToolContext, spec: ClusterSpec, wallet: str | None, request: TrainRequest,
                  **audit_first: Any) -> TrainResult:
    """Run one job as ``aitbc cluster train`` does, keeping its request beside its logs for recovery."""
    from ..cluster import TrainingCoordinator
    from ..audit import AuditLog

    assert request.job_id is not None
    directory = job_dir(ctx.home, request.job_id)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "request.json").write_text(request.model_dump_json(indent=2))
    audit = AuditLog(directory / "audit.jsonl")
    if audit_first:
        await audit.append("assistant-recovery", **audit_first)
    async with cluster_channel(ctx, spec, "aitbc-assistant-train", wallet=wallet) as channel:
        coordinator = TrainingCoordinator(channel, spec, audit=audit, events_log=directory / "events.jsonl",
                                          on_notice=ctx.notice)
        return await coordinator.run(request)


def describe_job(result: TrainResult, *, continuity: bool = True) -> str:
    hosts = ", ".join(f"{h.name} {h.state}" for h in result.hosts.values())
    words = (f"Job {result.job_id} on cluster {result.cluster} {'finished' if result.ok else 'failed'}: master "
             f"{result.master}, world size {result.world_size_confirmed or '?'} of {result.world_size_expected} "
             f"({hosts}) in {result.duration_s:.0f}s.")
    if result.failures:
        words += (f" {len(result.failures)} host failure(s): "
                  + "; ".join(f"{f['host']} ({f['reason']})" for f in result.failures)
                  + f"; spares used: {', '.join(result.spares_used) or 'none'}.")
    if continuity and result.continuity is not None:
        words += f" Checkpoint continuity {'verified' if result.continuity['ok'] else 'BROKEN'}."
    if result.error:
        words += f" Error: {result.error}"
    return words


async def train(ctx: ToolContext, a: TrainArgs) -> ToolResult:
    from ..cluster import TrainRequest
    from ..cluster import new_job_id

    if a.script is None:
        raise ClusterError("cluster_train needs the training script every host runs (say e.g. "
                           "'distribute /srv/train.py across 4 hosts')")
    spec = pick_cluster(ctx, a.cluster)
    hosts = a.hosts or len(spec.hosts)
    if hosts > len(spec.hosts):
        raise ClusterError(f"{hosts} hosts asked for, but cluster {spec.name} has only {len(spec.hosts)}")
    request = TrainRequest(
        hosts=hosts, script=Path(a.script).absolute(), script_args=tuple(a.script_args),
        nproc_per_node=a.nproc_per_node, min_hosts=a.min_hosts, max_restarts=a.max_restarts,
        checkpoint_dir=Path(a.checkpoint_dir).absolute() if a.checkpoint_dir else None,
        checkpoint_every=a.checkpoint_every, datasets=tuple(Path(d).absolute() for d in a.datasets),
        sandbox=a.sandbox, job_id=new_job_id(spec.name), timeout_s=a.timeout_s)
    result = await run_job(ctx, spec, a.wallet, request)
    return ToolResult(describe_job(result), result.model_dump(mode="json"), ok=result.ok)


def mount_command(a: MountArgs) -> Any:
    from ..cluster import MountCommand

    source = a.source.strip()
    if source.startswith("s3://"):
        bucket, _, prefix = source[5:].partition("/")
        kind, target = "s3", bucket + (f":/{prefix.rstrip('/')}" if prefix.strip("/") else "")
    elif source.startswith("ipfs://") or source.startswith(("Qm", "bafy")):
        kind, target = "ipfs", source.removeprefix("ipfs://")
    elif ":/" in source:
        kind, target = "nfs", source
    else:
        raise ClusterError(f"cannot tell what {source!r} is: give NFS 'server:/export', 's3://bucket' or 'ipfs://CID'")
    return MountCommand(source=kind, target=target, endpoint=a.endpoint, mountpoint=a.mount_point,
                        check_write=a.check_write)


async def mount(ctx: ToolContext, a: MountArgs) -> ToolResult:
    from ..cluster import TrainingCoordinator
    from ..cluster import MountReport, summarize_mounts
    from ..audit import AuditLog

    command = mount_command(a)
    spec = pick_cluster(ctx, a.cluster)
    members = [h for h in spec.hosts if not a.hosts or h.name in a.hosts]
    if unknown := set(a.hosts) - {h.name for h in spec.hosts}:
        raise ClusterError(f"no host {', '.join(sorted(unknown))} in cluster {spec.name}")
    audit = AuditLog(ctx.home / "clusters" / "mounts" / f"{spec.name}.audit.jsonl")
    async with cluster_channel(ctx, spec, "aitbc-assistant-mount", wallet=a.wallet) as channel:
        coordinator = TrainingCoordinator(channel, spec, audit=audit)
        replies = await asyncio.gather(*(coordinator.request(h, command, timeout=a.timeout_s) for h in members))
    reports = {h.name: MountReport.model_validate(r.data) for h, r in zip(members, replies) if r.data.get("host")}
    errors = {h.name: r.error or "no report" for h, r in zip(members, replies) if not r.data.get("host")}
    summary = summarize_mounts(command, reports, errors)
    await audit.append("mount", source=summary.source, target=summary.target, mountpoint=summary.mountpoint,
                       ok=summary.ok, digest=summary.comparison.digest, agreeing=list(summary.comparison.agreeing),
                       errors=summary.errors)
    problems = [f"{n}: {p}" for n, r in sorted(summary.hosts.items()) for p in r.problems]
    problems += [f"{n}: {e}" for n, e in summary.errors.items()]
    words = (f"{a.source} is mounted at {a.mount_point} on {', '.join(summary.comparison.agreeing)}, with the same "
             f"content everywhere (digest {(summary.comparison.digest or '')[:12]})." if summary.ok else
             f"Mounting {a.source} at {a.mount_point} did not work everywhere: "
             f"{'; '.join(problems) or 'the content differs between hosts'}.")
    return ToolResult(words, summary.model_dump(mode="json"), ok=summary.ok)


TOOLS: tuple[Tool, ...] = (
    Tool("cluster_train", "Run a training script on several hosts of a trusted cluster with torch.distributed "
         "(torchrun, c10d rendezvous): most capable hosts first, the first as master, the rest as spares; checks "
         "connectivity, confirms the world size, streams progress, and gives a crashed host's slot to a spare.",
         TrainArgs, "change-hosts", train, "distribute my training across 4 hosts"),
    Tool("cluster_mount", "Mount a shared dataset (NFS, S3 or IPFS) at the same path on every host of a cluster "
         "and check it there: read/write, same content (hash manifest), latency and throughput.", MountArgs,
         "change-hosts", mount, "mount nas:/export/data at /mnt/data on every node"),
)
