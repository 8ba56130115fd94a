"""Trusted-cluster tools that only read: hardware inventory and the memory-balanced batch plan."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from pydantic import Field

from ..cluster import ClusterError
from ._base import Tool, ToolArgs, ToolContext, ToolResult

if TYPE_CHECKING:
    from ..cluster import ClusterInventory
    from ..cluster import ClusterSpec
    from ..messaging import SignedChannel

GIB = 1024**3
CLUSTER_HELP = "cluster name ($AITBC_HOME/clusters/NAME.json)"
WALLET_HELP = "coordinator wallet the hosts answer; omitted: the local wallet the cluster lists as coordinator"


class InventoryArgs(ToolArgs):
    cluster: str | None = Field(None, description=CLUSTER_HELP + "; omitted: the only cluster defined, or this "
                                                             "host alone when none is")
    timeout: float = Field(5.0, gt=0, le=120, description="seconds to wait for each host")
    wallet: str | None = Field(None, description=WALLET_HELP)


class BalanceArgs(ToolArgs):
    cluster: str | None = Field(None, description=CLUSTER_HELP + "; omitted: the only cluster defined, or this "
                                                             "host alone when none is")
    global_batch: int = Field(256, ge=1, le=10_000_000, description="samples per step across all ranks")
    memory_per_sample_mb: float = Field(64.0, gt=0, description="activation/gradient memory one more sample costs")
    fixed_mb: float = Field(0.0, ge=0, description="model, optimizer state and workspace per rank")
    cpu_memory_gb: float | None = Field(None, gt=0, description="budget of a CPU-only rank; omitted: half the "
                                                                "smallest free RAM of the CPU-only hosts")
    timeout: float = Field(5.0, gt=0, le=120, description="seconds to wait for each host")
    wallet: str | None = Field(None, description=WALLET_HELP)


def pick_cluster(ctx: ToolContext, name: str | None) -> ClusterSpec:
    """The named cluster, or the only one defined; a clear error otherwise."""
    from ..cluster import list_clusters, load_cluster

    if name is not None:
        return load_cluster(ctx.home, name)
    names = list_clusters(ctx.home)
    if len(names) == 1:
        return load_cluster(ctx.home, names[0])
    if not names:
        raise ClusterError("no cluster is defined; create one with 'aitbc cluster create NAME --host NAME=ADDRESS'")
    raise ClusterError(f"several clusters are defined ({', '.join(names)}); say which one")


async def coordinator_wallet(ctx: ToolContext, spec: ClusterSpec, wallet: str | None) -> str:
    """The wallet named, else the one local wallet whose address the cluster lists as coordinator."""
    from ..devnet import wallet_store

    if wallet is not None:
        return wallet
    allowed = {a.lower() for a in spec.coordinators}
    mine = [w.name for w in await wallet_store(ctx.home).list() if w.address.lower() in allowed]
    if not mine:
        raise ClusterError(f"no local wallet is a coordinator of cluster {spec.name}; say which wallet to use")
    return mine[0]


@asynccontextmanager
async def cluster_channel(ctx: ToolContext, spec: ClusterSpec, prefix: str, *,
                          wallet: str | None = None) -> AsyncIterator[SignedChannel]:
    """A signed channel on the cluster's bus: a coordinator wallet when the cluster lists
    coordinators, else a throw-away key (such hosts answer any signed requester)."""
    from eth_account import Account

    from ..messaging import SignedChannel
    from ..messaging import connect_bus
    from ..profile import load_profile
    from ._sdk import unlock

    account = await unlock(ctx, await coordinator_wallet(ctx, spec, wallet)) if spec.coordinators \
        else Account.create()
    settings = spec.bus or load_profile(ctx.home).bus
    async with connect_bus(settings, f"{prefix}-{time.time_ns()}", identity=account.address,
                           persistent=False) as bus:
        yield SignedChannel(bus, account)


async def read_inventory(ctx: ToolContext, cluster: str | None, timeout: float,
                         wallet: str | None = None) -> ClusterInventory:
    from ..cluster import list_clusters
    from ..cluster import collect_inventory, local_inventory

    if cluster is None and not list_clusters(ctx.home):
        return await local_inventory(timeout=timeout)
    spec = pick_cluster(ctx, cluster)
    async with cluster_channel(ctx, spec, "aitbc-assistant-inventory", wallet=wallet) as channel:
        return await collect_inventory(channel, spec, timeout=timeout)


async def inventory(ctx: ToolContext, a: InventoryArgs) -> ToolResult:
    inv = await read_inventory(ctx, a.cluster, a.timeout, a.wallet)
    gpu_hosts = [h.name for h in inv.hosts if h.reachable and h.gpus]
    words = [f"Cluster {inv.cluster}: {len(inv.hosts)} hosts, {len(inv.reachable_hosts)} reachable."]
    if gpu_hosts:
        models = ", ".join(f"{n}x {m}" for m, n in inv.gpu_models.items())
        words.append(f"GPUs on {', '.join(gpu_hosts)} ({inv.gpu_count} in all: {models}).")
    else:
        words.append("No host has a GPU.")
    if inv.cpu_only_hosts:
        words.append(f"CPU only (fallback): {', '.join(inv.cpu_only_hosts)}.")
    if inv.unreachable_hosts:
        words.append(f"Unreachable: {', '.join(inv.unreachable_hosts)}.")
    return ToolResult(" ".join(words), inv.model_dump(mode="json"))


async def balance(ctx: ToolContext, a: BalanceArgs) -> ToolResult:
    from ..cluster import budgets_from_inventory, plan_batches
    from ..cluster import list_clusters

    inv = await read_inventory(ctx, a.cluster, a.timeout, a.wallet)
    cpu_hosts = [h for h in inv.hosts if h.reachable and h.cpu_only]
    cpu_bytes = int(a.cpu_memory_gb * GIB) if a.cpu_memory_gb else (
        min(h.ram_available_bytes for h in cpu_hosts) // 2 if cpu_hosts else None)
    spec = pick_cluster(ctx, inv.cluster) if inv.cluster in list_clusters(ctx.home) else None
    budgets = budgets_from_inventory(inv, memory_per_sample_bytes=int(a.memory_per_sample_mb * 2**20),
                                     fixed_bytes=int(a.fixed_mb * 2**20), spec=spec, cpu_memory_bytes=cpu_bytes)
    plan = plan_batches(a.global_batch, budgets)
    ranks = [{"rank": i, "label": b.label, "source": b.source, "free_memory_bytes": b.free_memory_bytes,
              "capacity": b.capacity, "batch": size,
              "memory_share": round(size / b.capacity, 3) if b.capacity else None}
             for i, (b, size) in enumerate(zip(budgets, plan.sizes, strict=True))]
    fullest = max(ranks, key=lambda r: r["memory_share"] or 0)
    return ToolResult(
        f"Split a global batch of {a.global_batch} over {len(ranks)} ranks by free memory: "
        + ", ".join(f"{r['label']} {r['batch']}" for r in ranks)
        + f". The fullest rank ({fullest['label']}) uses {100 * (fullest['memory_share'] or 0):.0f}% of its "
          f"memory cap, so no rank overflows.",
        {"cluster": inv.cluster, "global_batch": a.global_batch, "ranks": ranks})


TOOLS: tuple[Tool, ...] = (
    Tool("cluster_inventory", "Ask every host of a trusted cluster (or this host) for its GPUs (model, memory, "
         "driver), CPUs and RAM; CPU-only and unreachable hosts are marked.", InventoryArgs, "read", inventory,
         "detect which nodes have GPUs"),
    Tool("cluster_balance", "Plan per-GPU batch sizes from each GPU's free memory so no GPU overflows (the "
         "same rule training uses), with per-GPU figures.", BalanceArgs, "read", balance,
         "balance GPU memory usage"),
)
