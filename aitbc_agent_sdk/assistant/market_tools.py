"""Marketplace training tools, the seed's step-by-step flow: init, upload-data, discover, distribute,
resume. Each handler makes the same SDK calls as its ``aitbc distributed-training`` command."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from .. import flow
from ..models import JobConfig, TrainingSpec
from . import sdk
from .base import Tool, ToolArgs, ToolContext, ToolResult

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

TRAINING_ID_HELP = ("training id (training_...); omitted: the training an earlier step of the same request "
                    "created, else the most recent one")


_JOB = JobConfig.model_fields  # the tuned defaults live on JobConfig, shared with the CLI


class InitArgs(ToolArgs):
    model_type: Literal["mlp", "cnn", "transformer"] = Field("mlp", description="model to train")
    target_workers: int = Field(3, ge=1, le=64, description="workers to hire")
    rounds: int = Field(5, ge=1, le=1000, description="federated rounds")
    epochs: int = Field(_JOB["epochs"].default, ge=1, le=100, description="local epochs per round")
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


async def _signer(ctx: ToolContext, tid: str) -> tuple[str, LocalAccount]:
    wallet = await flow.wallet_of(ctx.home, tid)
    return wallet, await sdk.unlock(ctx, wallet)  # a wrong password fails here, not in a daemon


async def init_training(ctx: ToolContext, a: InitArgs) -> ToolResult:
    from ..devnet.network import wallet_store

    spec = TrainingSpec(model_type=a.model_type, target_workers=a.target_workers, rounds=a.rounds,
                        spare_workers=a.spares, job=JobConfig(epochs=a.epochs))
    account = await wallet_store(ctx.home).unlock(a.wallet, ctx.password(a.wallet))
    async with flow.devnet_agent(ctx.home, account, "aitbc-assistant") as agent:
        record = await flow.create_training(agent, spec, a.wallet)
    ctx.training_id = record.training_id
    await ctx.acting_on(record.training_id)
    return ToolResult(f"Created training {record.training_id}: a {a.model_type} for {a.target_workers} workers, "
                      f"{a.rounds} rounds, paid from wallet {a.wallet}. Nothing is spent yet.",
                      {"training_id": record.training_id, "model_type": a.model_type,
                       "target_workers": a.target_workers, "rounds": a.rounds, "coordinator": record.coordinator},
                      training_id=record.training_id)


async def upload_data(ctx: ToolContext, a: UploadArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    source = flow.dataset_source(a.data_path)
    await asyncio.to_thread(flow.check_dataset, source, a.label_column)  # fail before connecting
    await ctx.acting_on(tid)
    _, account = await _signer(ctx, tid)
    async with flow.devnet_agent(ctx.home, account, "aitbc-assistant") as agent:
        cid = await flow.upload_data(agent, tid, source, a.label_column)
    ctx.training_id = tid
    return ToolResult(f"Uploaded {a.data_path} for {tid}: content id {cid}.",
                      {"training_id": tid, "dataset_cid": cid}, training_id=tid)


async def discover_workers(ctx: ToolContext, a: DiscoverArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    await ctx.acting_on(tid)
    max_wei = sdk.to_wei(a.max_price) if a.max_price is not None else None
    _, account = await _signer(ctx, tid)
    async with flow.devnet_agent(ctx.home, account, "aitbc-assistant") as agent:
        hired = await flow.hire_workers(agent, tid, a.required_workers, min_gpu=a.min_gpu, max_price_wei=max_wei)
    rows = [h.as_dict() for h in hired]
    total = sum(h.price_wei for h in hired if h.role == "worker")
    ctx.training_id = tid
    return ToolResult(f"Signed contracts with {len(rows)} workers for {tid}; together they cost "
                      f"{sdk.eth(total)} ETH per round (paid from the escrow only for accepted work).",
                      {"training_id": tid, "workers": rows}, training_id=tid)


async def distribute(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    wallet, account = await _signer(ctx, tid)
    await ctx.acting_on(tid)
    started = await flow.distribute(ctx.home, tid, account, ctx.password(wallet))
    ctx.training_id = tid
    return ToolResult(f"Funded the escrow of {tid} (tx {started.escrow_tx}) and handed {started.workers} jobs to a "
                      f"coordinator daemon (pid {started.pid}); ask 'how is {tid} doing?' to follow it.",
                      {"training_id": tid, "escrow_tx": started.escrow_tx, "workers": started.workers,
                       "coordinator_pid": started.pid, "log": str(started.log)}, training_id=tid)


async def resume(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    record = await flow.load_training(ctx.home, tid)
    if (reason := flow.resume_blocker(ctx.home, record)) is not None:
        return ToolResult(f"{reason}; nothing to do.", {"training_id": tid, "phase": record.phase.value},
                          training_id=tid)
    wallet, _ = await _signer(ctx, tid)
    await ctx.acting_on(tid)
    started = await flow.resume(ctx.home, tid, ctx.password(wallet))
    return ToolResult(f"Resumed {tid} after round {record.round} in a new coordinator daemon (pid {started.pid}).",
                      {"training_id": tid, "round": record.round, "phase": record.phase.value,
                       "coordinator_pid": started.pid}, training_id=tid)


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

