"""Recovering a cluster job after a crashed node.

While a job runs, its coordinator (:mod:`..cluster._launcher`) already handles a crash: a spare
takes the slot, or the others re-rendezvous while ``min_hosts`` remain. What it cannot survive
is losing its master (the c10d store), or more hosts than it may lose: then the job ends failed.
This tool handles that case. It reads the job's audit log, asks every host whether it answers,
leaves out the hosts that are down (and the one the user named), and relaunches the same
request on the healthy hosts; the script resumes from the latest checkpoint in the shared
checkpoint directory. It then checks, over rank 0's step log of *both* jobs, that every step
ran exactly once after the checkpoint it resumed from.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from ..cluster import ClusterError
from ._base import Tool, ToolArgs, ToolContext, ToolResult
from ._cluster_ops import describe_job, job_dir, run_job
from ._cluster_tools import CLUSTER_HELP, WALLET_HELP, pick_cluster, read_inventory

RUNNING_WITHIN_S = 30.0  # a job whose logs moved this recently still has a live coordinator


class RecoverArgs(ToolArgs):
    cluster: str | None = Field(None, description=CLUSTER_HELP + "; omitted: the only cluster defined")
    host: str | None = Field(None, description="the host that crashed, if known (left out of the relaunch)")
    job_id: str | None = Field(None, description="the job to recover; omitted: the cluster's latest job")
    timeout_s: float | None = Field(None, gt=0, description="seconds for the relaunched job; omitted: no limit")
    wallet: str | None = Field(None, description=WALLET_HELP)


def latest_job(home: Path, cluster: str) -> str:
    jobs = [d for d in (home / "clusters" / "jobs").glob(f"{cluster}-*") if (d / "audit.jsonl").exists()]
    if not jobs:
        raise ClusterError(f"cluster {cluster} has run no job yet; nothing to recover")
    return max(jobs, key=lambda d: (d / "audit.jsonl").stat().st_mtime).name


def rank0_steps(directory: Path) -> list[dict[str, Any]]:
    """Rank 0's resume/step/checkpoint metric records from a job's event log."""
    path = directory / "events.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.exists() else ():
        metric = json.loads(line).get("metric") or {}
        if metric.get("rank") == 0 and metric.get("event") in ("step", "checkpoint", "resume"):
            records.append(metric)
    return records


async def recover(ctx: ToolContext, a: RecoverArgs) -> ToolResult:
    from ..cluster import TrainRequest
    from ..cluster import new_job_id
    from ..cluster import verify_step_log
    from ..audit import read_log

    spec = pick_cluster(ctx, a.cluster)
    job = a.job_id or latest_job(ctx.home, spec.name)
    directory = job_dir(ctx.home, job)
    entries = read_log(directory / "audit.jsonl")
    events = [e.event for e in entries]
    failures = [e.fields for e in entries if e.event in ("host-failed", "host-silent")]
    base = {"job_id": job, "failures": failures}
    if "job-finished" in events:
        return ToolResult(f"Job {job} finished" + (f" (it survived {len(failures)} host failure(s) on its own)"
                                                   if failures else "") + "; there is nothing to recover.", base)
    logs = [p for p in (directory / "audit.jsonl", directory / "events.jsonl") if p.exists()]
    if "job-ended" not in events and time.time() - max(p.stat().st_mtime for p in logs) < RUNNING_WITHIN_S:
        return ToolResult(f"Job {job} is still running; its coordinator replaces a crashed host with a spare or "
                          f"carries on with the rest by itself ({len(failures)} failure(s) so far).", base)
    if not (directory / "request.json").exists():
        raise ClusterError(f"job {job} was not started by the assistant, so its launch request is unknown; "
                           f"relaunch it with 'aitbc cluster train' and the same --checkpoint-dir")
    old = TrainRequest.model_validate_json((directory / "request.json").read_text())

    inventory = await read_inventory(ctx, spec.name, 5.0, a.wallet)
    down = set(inventory.unreachable_hosts) | ({a.host} if a.host else set())
    healthy = [h for h in spec.hosts if h.name not in down]
    if not healthy:
        raise ClusterError(f"no healthy host left in cluster {spec.name} (down: {', '.join(sorted(down))})")
    hosts = min(old.hosts, len(healthy))
    request = old.model_copy(update={"hosts": hosts, "min_hosts": min(old.min_hosts or hosts, hosts),
                                     "job_id": new_job_id(spec.name)})
    ctx.notice(f"relaunching {job} as {request.job_id} on {hosts} of {', '.join(h.name for h in healthy)} "
               f"(left out: {', '.join(sorted(down)) or 'none'})")
    result = await run_job(ctx, spec.model_copy(update={"hosts": tuple(healthy)}), a.wallet, request,
                           from_job=job, left_out=sorted(down), failures=failures)
    continuity = verify_step_log(rank0_steps(directory) + rank0_steps(job_dir(ctx.home, request.job_id)))
    reason = next((e.fields.get("reason") for e in reversed(entries) if e.event == "job-failed"), None)
    words = (f"Job {job} ended without finishing" + (f": {reason}" if reason else "")
             + (" (" + "; ".join(f"{f.get('host')}: {f.get('reason') or 'silent'}" for f in failures) + ")"
                if failures else "")
             + f". Not answering now: {', '.join(sorted(down - {a.host})) or 'none'}"
             + (f"; left out as asked: {a.host}" if a.host else "")
             + ". Relaunched it from the latest checkpoint on the healthy hosts. "
             + describe_job(result, continuity=False))
    if continuity.attempts:
        resumed = [s.resumed_from for s in continuity.attempts if s.resumed_from]
        words += (f" Across both jobs every one of {continuity.effective_steps} steps ran exactly once"
                  f" (resumed from step {max(resumed, default=0)}, {continuity.rolled_back_steps} rolled back)."
                  if continuity.ok else f" Step continuity across the jobs is BROKEN: {'; '.join(continuity.problems)}")
    data = {**base, "relaunched": result.model_dump(mode="json"), "left_out": sorted(down),
            "continuity": continuity.model_dump(mode="json")}
    return ToolResult(words, data, ok=result.ok and (continuity.ok or not continuity.attempts))


TOOLS: tuple[Tool, ...] = (
    Tool("cluster_recover", "Recover a cluster job after a crashed node: find the hosts that are down, and if the "
         "job could not survive on its own (its master died, or too few hosts were left), relaunch it on the "
         "healthy hosts from its latest checkpoint and check that no step was lost or run twice.", RecoverArgs,
         "stop", recover, "recover from a crashed node"),
)
