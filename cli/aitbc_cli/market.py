"""``aitbc market list``: the offers on the devnet's market, scored as the coordinator scores them."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk.errors import ConfigError

from .common import HomeOption, JsonOption, print_json, resolve_home, unlock
from .render import eth

app = typer.Typer(help="Browse the market: signed offers, bonds and on-chain reputation.", no_args_is_help=True)

SORT_KEYS = {"score": True, "price": False, "stake": True, "reputation": True}


@app.command("list")
def list_offers(
    wallet: Annotated[str, typer.Option(help="wallet to sign the discovery requests with")] = "dev",
    sort: Annotated[str, typer.Option(help="score, price, stake or reputation")] = "score",
    min_gpu: Annotated[str, typer.Option(help="e.g. RTX3090; 'cpu' accepts any")] = "cpu",
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every current offer with its score, price, bond and reputation."""
    if sort not in SORT_KEYS:
        raise ConfigError(f"--sort must be one of {', '.join(SORT_KEYS)}")
    root = resolve_home(home)

    async def discover() -> list[dict]:
        from aitbc_agent_sdk.agent import Agent
        from aitbc_agent_sdk.config import AgentConfig

        account, _ = await unlock(root, wallet)
        async with Agent(AgentConfig(name="aitbc-market", blockchain_network="devnet", home=root),
                         account=account) as agent:
            workers = await agent.discover_gpu_workers(min_gpu=min_gpu, include_busy=True)
            scores = agent.scoring.score(workers) if workers else []
        return [{"provider": w.worker_id, "hardware": w.gpu_type, "price": w.price, "stake": w.stake_wei,
                 "reputation": w.reputation, "completed": w.jobs_completed, "failed": w.jobs_failed,
                 "slashes": w.slashes, "free_slots": w.offer.free_slots, "score": float(s)}
                for w, s in zip(workers, scores, strict=True)]

    rows = sorted(asyncio.run(discover()), key=lambda r: r[sort], reverse=SORT_KEYS[sort])
    if as_json:
        print_json({"offers": rows})
        return
    table = Table(title=f"{len(rows)} offers, by {sort}")
    for col in ("provider", "hardware", "price/round ETH", "bond ETH", "reputation", "done/failed/slashed",
                "free", "score"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["provider"], r["hardware"], eth(r["price"]), eth(r["stake"]), f"{r['reputation']:.2f}",
                      f"{r['completed']}/{r['failed']}/{r['slashes']}", str(r["free_slots"]), f"{r['score']:.3f}")
    Console().print(table)
