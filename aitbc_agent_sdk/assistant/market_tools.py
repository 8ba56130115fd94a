"""Marketplace training tools, the seed's step-by-step flow: init, upload-data, discover, distribute,
resume. Each handler makes the same SDK calls as its ``aitbc distributed-training`` command."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..errors import ConfigError, NotEnoughWorkersError
from . import sdk
from .base import Tool, ToolArgs, ToolContext, ToolResult

TRAINING_ID_HELP = ("training id (training_...); omitted: the training an earlier step of the same request "
                    "created, else the most recent one")


class InitArgs(ToolArgs):
    model_type: Literal["mlp", "cnn", "transformer"] = Field("mlp", description="model to train")
    target_workers: int = Field(3, ge=1, le=64, description="workers to hire")
    rounds: int = Field(5, ge=1, le=1000, description="federated rounds")
    epochs: int = Field(2, ge=1, le=100, description="local epochs per round")
    spares: int = Field(0, ge=0, le=64, description="spare providers hired to replace failed workers")
    wallet: str = Field("dev", description="the coordinator's wallet, which pays the escrow")


class UploadArgs(ToolArgs):
    training_id: str | None = Field(None, description=TRAINING_ID_HELP)
    data_path: str = Field("digits", description=".npz, .pt or .csv file, or 'digits' (the bundled dataset)")
    label_column: str | None = Field(None, description="label column of a CSV file")


class DiscoverArgs(ToolArgs):
    training_id: str | None = Field(None, description=TRAINING_ID_HELP)
    required_workers: int | None = Field(None, ge=1, le=64, description="workers to hire; omitted: the training's")
    min_gpu: str | None = Field(None, description="slowest GPU accepted, e.g. RTX3090; omitted or 'cpu': any")
    max_price: float | None = Field(None, gt=0, description="highest price per round per worker, in ETH")


class TrainingArgs(ToolArgs):
    training_id: str | None = Field(None, description=TRAINING_ID_HELP)


async def init_training(ctx: ToolContext, a: InitArgs) -> ToolResult:
    from ..coordinator.store import TrainingStore
    from ..devnet.network import wallet_store
    from ..models import JobConfig, TrainingRecord, TrainingSpec, new_id

    spec = TrainingSpec(model_type=a.model_type, target_workers=a.target_workers, rounds=a.rounds,
                        spare_workers=a.spares, job=JobConfig(epochs=a.epochs))
    address = (await wallet_store(ctx.home).get(a.wallet)).address
    record = TrainingRecord(training_id=new_id("training"), spec=spec, coordinator=address, wallet=a.wallet)
    async with TrainingStore(sdk.db_path(ctx.home)) as db:
        await db.save_training(record)
    ctx.training_id = record.training_id
    await ctx.acting_on(record.training_id)
    return ToolResult(f"Created training {record.training_id}: a {a.model_type} for {a.target_workers} workers, "
                      f"{a.rounds} rounds, paid from wallet {a.wallet}. Nothing is spent yet.",
                      {"training_id": record.training_id, "model_type": a.model_type,
                       "target_workers": a.target_workers, "rounds": a.rounds, "coordinator": address},
                      training_id=record.training_id)


async def upload_data(ctx: ToolContext, a: UploadArgs) -> ToolResult:
    from ..training import load_dataset

    tid = await sdk.resolve_training(ctx, a.training_id)
    source: str | Path = "digits" if a.data_path == "digits" else Path(a.data_path).expanduser()
    if isinstance(source, Path) and not source.is_file():
        raise ConfigError(f"dataset file not found: {source} (give a .npz, .pt or .csv file, or 'digits')")
    await asyncio.to_thread(load_dataset, source, label_column=a.label_column)  # fail before connecting
    await ctx.acting_on(tid)
    account = await sdk.unlock(ctx, await sdk.wallet_of(ctx.home, tid))
    async with sdk.devnet_agent(ctx, account) as agent:
        cid = await agent.upload_training_data(tid, source, label_column=a.label_column)
    ctx.training_id = tid
    return ToolResult(f"Uploaded {a.data_path} for {tid}: content id {cid}.",
                      {"training_id": tid, "dataset_cid": cid}, training_id=tid)


async def discover_workers(ctx: ToolContext, a: DiscoverArgs) -> ToolResult:
    from ..coordinator.reassign import hire

    tid = await sdk.resolve_training(ctx, a.training_id)
    record = await sdk.training(ctx.home, tid)
    wanted = a.required_workers or record.spec.target_workers
    await ctx.acting_on(tid)
    max_wei = sdk.to_wei(a.max_price) if a.max_price is not None else None
    account = await sdk.unlock(ctx, await sdk.wallet_of(ctx.home, tid))
    async with sdk.devnet_agent(ctx, account) as agent:
        workers = await agent.discover_gpu_workers(min_gpu=a.min_gpu, max_price_wei=max_wei)
        if len(workers) < wanted:
            cap = f" at or under {a.max_price} ETH" if a.max_price is not None else ""
            raise NotEnoughWorkersError(f"asked for {wanted} workers ({a.min_gpu or 'any hardware'}{cap}); "
                                        f"{len(workers)} suitable offers on the market")
        scores = dict(zip([w.worker_id for w in workers], agent.scoring.score(workers), strict=True))
        ranked = await agent.select_best_workers(workers, wanted + record.spec.spare_workers)
        by_id = {w.worker_id: w for w in ranked}
        contracts = await hire(agent.coordinator, tid, ranked[:wanted], ranked[wanted:])
    rows = [{"worker_id": c.worker_id, "gpu": by_id[c.worker_id].gpu_type, "price_wei": c.price_wei,
             "reputation": by_id[c.worker_id].reputation, "score": float(scores[c.worker_id]),
             "contract_id": c.contract_id, "role": c.role} for c in contracts]
    total = sum(r["price_wei"] for r in rows if r["role"] == "worker")
    ctx.training_id = tid
    return ToolResult(f"Signed contracts with {len(rows)} workers for {tid}; together they cost "
                      f"{sdk.eth(total)} ETH per round (paid from the escrow only for accepted work).",
                      {"training_id": tid, "workers": rows}, training_id=tid)


async def distribute(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    from ..coordinator.daemon import spawn_coordinator
    from ..models import TrainingPhase
    from ..profile import training_dir

    tid = await sdk.resolve_training(ctx, a.training_id)
    wallet = await sdk.wallet_of(ctx.home, tid)
    account = await sdk.unlock(ctx, wallet)
    await ctx.acting_on(tid)
    async with sdk.devnet_agent(ctx, account) as agent:
        record = await agent.coordinator.db.training(tid)
        contracts = await agent.coordinator.db.contracts(tid, "worker")
        if record.phase != TrainingPhase.INITIALIZING:
            raise ConfigError(f"training {tid} is already {record.phase.value}")
        if not contracts:
            raise ConfigError(f"no workers under contract for {tid}; discover workers first")
        if record.dataset_cid is None:
            raise ConfigError(f"no dataset for {tid}; upload data first")
        await agent.coordinator.check_budget(tid)
        await agent.create_data_shards(tid, len(contracts))
        tx = await agent.fund_escrow(tid)
    proc = spawn_coordinator(ctx.home, wallet, ctx.password(wallet), tid)

    async def started() -> bool:
        return (await sdk.snapshot_of(ctx.home, tid)).phase != TrainingPhase.INITIALIZING

    await sdk.wait_for_daemon(started, ctx.home, tid, proc.pid, "start the training")
    ctx.training_id = tid
    log = training_dir(ctx.home, tid) / "coordinator.log"
    return ToolResult(f"Funded the escrow of {tid} (tx {tx}) and handed {len(contracts)} jobs to a coordinator "
                      f"daemon (pid {proc.pid}); ask 'how is {tid} doing?' to follow it.",
                      {"training_id": tid, "escrow_tx": tx, "workers": len(contracts), "coordinator_pid": proc.pid,
                       "log": str(log)}, training_id=tid)


async def resume(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    from ..coordinator.daemon import spawn_coordinator
    from ..coordinator.lock import is_driven
    from ..coordinator.phases import is_terminal

    tid = await sdk.resolve_training(ctx, a.training_id)
    record = await sdk.training(ctx.home, tid)
    if is_terminal(record.phase):
        return ToolResult(f"{tid} already ended ({record.phase.value}); nothing to resume.",
                          {"training_id": tid, "phase": record.phase.value}, training_id=tid)
    if is_driven(ctx.home, tid):
        return ToolResult(f"{tid} already has a running coordinator; nothing to do.",
                          {"training_id": tid, "phase": record.phase.value}, training_id=tid)
    wallet = await sdk.wallet_of(ctx.home, tid)
    await sdk.unlock(ctx, wallet)  # a wrong password fails here, not in the daemon
    await ctx.acting_on(tid)
    proc = spawn_coordinator(ctx.home, wallet, ctx.password(wallet), tid, resume=True)

    async def driven() -> bool:
        return is_driven(ctx.home, tid)

    await sdk.wait_for_daemon(driven, ctx.home, tid, proc.pid, "take the training over")
    return ToolResult(f"Resumed {tid} after round {record.round} in a new coordinator daemon (pid {proc.pid}).",
                      {"training_id": tid, "round": record.round, "phase": record.phase.value,
                       "coordinator_pid": proc.pid}, training_id=tid)


TOOLS: tuple[Tool, ...] = (
    Tool("training_init", "Create a marketplace training (model, workers, rounds). Writes a local record; "
         "nothing is spent.", InitArgs, "write", init_training, "create a training for a cnn with 3 workers"),
    Tool("upload_data", "Validate a dataset and store it by content id for a training.", UploadArgs, "write",
         upload_data, "upload ./data.npz to training_..."),
    Tool("discover_workers", "Find providers on the market (GPU model, price cap), score them, and sign "
         "contracts with the best for a training. Commits money per accepted round.", DiscoverArgs, "spend",
         discover_workers, "hire 10 RTX 3090 workers under 0.5 ETH each"),
    Tool("distribute", "Fund a training's escrow, shard its data and start the coordinator daemon that runs "
         "the rounds and pays the workers.", TrainingArgs, "spend", distribute, "distribute training_..."),
    Tool("resume", "Start a new coordinator daemon for a funded training whose coordinator died.", TrainingArgs,
         "spend", resume, "resume training_... after its coordinator crashed"),
)

