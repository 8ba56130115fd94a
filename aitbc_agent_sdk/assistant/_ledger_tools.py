"""Tools that look at a training's progress and money: monitor, payments, pay the workers, market
offers, wallet balance."""

from __future__ import annotations

import os

from pydantic import Field

from ..errors import ConfigError
from ..records import reported_accuracy
from . import _sdk as sdk
from ._base import Tool, ToolArgs, ToolContext, ToolResult
from ._market_tools import TrainingArgs

RPC_ENV = "AITBC_RPC_URL"


class OffersArgs(ToolArgs):
    min_gpu: str | None = Field(None, description="slowest GPU accepted, e.g. RTX3090; omitted: any")
    max_price: float | None = Field(None, gt=0, description="highest price per round, in ETH")
    limit: int | None = Field(None, ge=1, le=1000, description="show at most this many, best first")
    wallet: str = Field("dev", description="wallet that signs the discovery request (nothing is spent)")


class CostArgs(ToolArgs):
    workers: int = Field(3, ge=1, le=64, description="workers to price")
    rounds: int = Field(5, ge=1, le=1000, description="federated rounds")
    min_gpu: str | None = Field(None, description="slowest GPU accepted, e.g. RTX4090; omitted: any")
    max_price: float | None = Field(None, gt=0, description="highest price per round per worker, in ETH")
    wallet: str = Field("dev", description="wallet that signs the discovery request (nothing is spent)")


class WalletArgs(ToolArgs):
    wallet: str = Field("dev", description="wallet name in $AITBC_HOME/wallets")


async def monitor(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    snap = await sdk.snapshot_of(ctx.home, tid)
    words = [f"{tid} is {snap.phase.value}, round {snap.round} of {snap.rounds} ({snap.model_type})."]
    if snap.round_metrics:
        last = snap.round_metrics[-1]
        # The task's own metric (a regression's mse): accuracy only where the task reported it
        own = [(n, v) for n, v in last.metrics.items() if n not in ("loss", "accuracy")]
        accuracy = reported_accuracy(last)
        score = (f"test accuracy {accuracy:.4f}" if accuracy is not None and ("accuracy" in last.metrics or not own)
                 else f"{own[0][0]} {own[0][1]:.4f}" if own else "no metric")
        words.append(f"Round {last.round} reached {score} (loss {last.loss:.4f}).")
    busy = [w for w in snap.workers if w.role == "worker"]
    if busy:
        words.append(f"{len(busy)} workers: " + ", ".join(f"{w.status} {w.progress:.0f}%" for w in busy[:8]) + ".")
    if snap.escrow is not None:
        words.append(f"Escrow: {sdk.eth(snap.escrow.deposited_wei)} ETH deposited, "
                     f"{sdk.eth(snap.escrow.paid_wei)} paid, {sdk.eth(snap.escrow.refunded_wei)} refunded.")
    ctx.training_id = tid
    return ToolResult(" ".join(words), snap.model_dump(mode="json"), training_id=tid)


async def payments(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    tid = await sdk.resolve_training(ctx, a.training_id)
    snap = await sdk.snapshot_of(ctx.home, tid)
    total = sum(p.amount_wei for p in snap.payments)
    summary = (f"{tid}: {len(snap.payments)} payments, {sdk.eth(total)} ETH in all."
               if snap.payments else f"{tid}: no payments yet (phase {snap.phase.value}).")
    ctx.training_id = tid
    return ToolResult(summary, {"training_id": tid, "phase": snap.phase.value,
                                "payments": [p.model_dump(mode="json") for p in snap.payments],
                                "escrow": snap.escrow.model_dump(mode="json") if snap.escrow else None},
                      training_id=tid)


async def pay_workers(ctx: ToolContext, a: TrainingArgs) -> ToolResult:
    """Release what the escrow owes for accepted work, unless a coordinator daemon is about to."""
    from ..coordinator import is_driven, training_lock

    tid = await sdk.resolve_training(ctx, a.training_id)
    if is_driven(ctx.home, tid):
        return ToolResult(f"{tid} is still run by its coordinator daemon, which pays every worker itself when the "
                          f"last round is accepted; nothing was paid now.", {"training_id": tid, "payments": []},
                          ok=False, training_id=tid)
    if (await sdk.snapshot_of(ctx.home, tid)).escrow is None:
        raise ConfigError(f"{tid} has no funded escrow yet; there is nothing to pay")
    account = await sdk.unlock(ctx, await sdk.wallet_of(ctx.home, tid))
    await ctx.acting_on(tid)
    with training_lock(ctx.home, tid):  # no daemon may start paying while this does
        async with sdk.devnet_agent(ctx, account) as agent:
            paid = await agent.coordinator.money.pay(tid)
    total = sum(p.amount_wei for p in paid)
    summary = (f"Paid {len(paid)} workers of {tid} {sdk.eth(total)} ETH for their accepted work."
               if paid else f"Nothing is owed to the workers of {tid}: every accepted round is already paid.")
    ctx.training_id = tid
    return ToolResult(summary, {"training_id": tid, "payments": [p.model_dump(mode="json") for p in paid]},
                      training_id=tid)


async def market_offers(ctx: ToolContext, a: OffersArgs) -> ToolResult:
    max_wei = sdk.to_wei(a.max_price) if a.max_price is not None else None
    account = await sdk.unlock(ctx, a.wallet)
    async with sdk.devnet_agent(ctx, account) as agent:
        workers = await agent.discover_gpu_workers(min_gpu=a.min_gpu, max_price_wei=max_wei, include_busy=True)
        scores = agent.scoring.score(workers) if workers else []
    rows = sorted(({"provider": w.worker_id, "hardware": w.gpu_type, "price_wei": w.price, "stake_wei": w.stake_wei,
                    "reputation": w.reputation, "free_slots": w.offer.free_slots, "score": float(s)}
                   for w, s in zip(workers, scores, strict=True)), key=lambda r: -r["score"])[: a.limit]
    what = f"{a.min_gpu or 'any hardware'}" + (f" at or under {a.max_price} ETH per round" if a.max_price else "")
    return ToolResult(f"{len(rows)} offers on the market for {what}.", {"offers": rows})


async def cost_estimate(ctx: ToolContext, a: CostArgs) -> ToolResult:
    """The escrow a training would need, priced as ``run --dry-run`` prices it: the offers the coordinator
    would pick (its scoring), workers x price x rounds (flow.preview)."""
    from .. import flow

    max_wei = sdk.to_wei(a.max_price) if a.max_price is not None else None
    account = await sdk.unlock(ctx, a.wallet)
    async with sdk.devnet_agent(ctx, account) as agent:
        found = await agent.discover_gpu_workers(min_gpu=a.min_gpu, max_price_wei=max_wei)
        picked = agent.coordinator.select(found, a.workers)
        cost = flow.preview([w.price for w in picked], [], a.rounds, min_stake_wei=agent.coordinator.min_stake(None))
    return ToolResult(flow.estimate_text(cost, asked=a.workers, hardware=a.min_gpu),
                      {"asked_workers": a.workers, "min_gpu": a.min_gpu, "cost": cost.as_json(),
                       "workers": [{"provider": w.worker_id, "hardware": w.gpu_type, "price_wei": str(w.price)}
                                   for w in picked]})


async def wallet_balance(ctx: ToolContext, a: WalletArgs) -> ToolResult:
    from ..chain import connect_rpc
    from ..devnet import wallet_store
    from ..profile import load_profile

    wallet = await wallet_store(ctx.home).get(a.wallet)
    url = os.environ.get(RPC_ENV) or load_profile(ctx.home).chain.rpc_url
    w3 = await connect_rpc(url)
    try:
        chain_id = int(await w3.eth.chain_id)
        wei = int(await w3.eth.get_balance(w3.to_checksum_address(wallet.address)))
    finally:
        await w3.provider.disconnect()
    return ToolResult(f"Wallet {wallet.name} ({wallet.address}) holds {sdk.eth(wei)} ETH on chain {chain_id}.",
                      {"name": wallet.name, "address": wallet.address, "chain_id": chain_id, "wei": str(wei),
                       "eth": sdk.eth(wei)})


TOOLS: tuple[Tool, ...] = (
    Tool("monitor", "A training's phase, round, per-worker progress, accuracy per round and escrow.", TrainingArgs,
         "read", monitor, "how is my training doing?"),
    Tool("payments", "Every payment of a training with its transaction hash, and the escrow's totals.",
         TrainingArgs, "read", payments, "show the payments of my training"),
    Tool("pay_workers", "Pay the workers of a training what the escrow owes them for accepted work (when no "
         "coordinator daemon is running it).", TrainingArgs, "spend", pay_workers, "pay the workers"),
    Tool("market_offers", "List the providers' current offers (GPU, price, bond, reputation), scored.",
         OffersArgs, "read", market_offers, "find RTX 3090 workers under 0.5 ETH"),
    Tool("cost_estimate", "What a training would cost: the best offers for the hardware asked, workers x price "
         "x rounds, as run --dry-run shows it. Spends nothing.", CostArgs, "read", cost_estimate,
         "how much would 8 RTX 4090s for 20 rounds cost?"),
    Tool("wallet_balance", "A wallet's address and ETH balance on the devnet chain.", WalletArgs, "read",
         wallet_balance, "what is my wallet balance?"),
)
