"""``aitbc market list``: the offers on the devnet's market, scored as the coordinator scores them."""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from aitbc_agent_sdk.records import terminal_markup

from .common import (
    HomeOption, JsonOption, NetworkOption, PasswordFileOption, PasswordSource, network_or_default, print_json,
    resolve_home, unlock,
)
from .render import eth, output_console

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc_agent_sdk.config import AgentConfig

app = typer.Typer(help="Browse the market: signed offers, bonds and on-chain reputation.", no_args_is_help=True)


class SortKey(str, Enum):
    score = "score"
    price = "price"
    stake = "stake"
    reputation = "reputation"


# The row field each key sorts on, and whether the largest comes first.
SORT_KEYS = {SortKey.score: ("score", True), SortKey.price: ("price_wei", False), SortKey.stake: ("stake_wei", True),
             SortKey.reputation: ("reputation", True)}


async def offer_rows(config: AgentConfig, account: LocalAccount, min_gpu: str = "cpu") -> list[dict]:
    """Every current offer of CONFIG's network, scored, discovered with ACCOUNT signing the requests (the
    dashboard's too)."""
    from aitbc_agent_sdk import Agent

    async with Agent(config, account=account) as agent:
        # The whole market, unbonded offers too: the stake column says who a training would hire.
        workers = await agent.discover_gpu_workers(min_gpu=min_gpu, include_busy=True, min_stake_wei=0)
        scores = agent.scoring.score(workers) if workers else []
    return [{"provider": w.worker_id, "hardware": w.gpu_type, "price_wei": w.price, "stake_wei": w.stake_wei,
             "reputation": w.reputation, "completed": w.jobs_completed, "failed": w.jobs_failed,
             "slashes": w.slashes, "free_slots": w.offer.free_slots, "score": float(s)}
            for w, s in zip(workers, scores, strict=True)]


@app.command("list")
def list_offers(
    wallet: Annotated[str, typer.Option(help="wallet to sign the discovery requests with")] = "dev",
    sort: Annotated[SortKey, typer.Option(help="order: best score, lowest price, largest bond or best reputation "
                                               "first")] = SortKey.score,
    min_gpu: Annotated[str, typer.Option(help="least GPU an offer must have, e.g. RTX3090; 'cpu' accepts any")
                       ] = "cpu",
    network: NetworkOption = None,
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every current offer with its score, price, bond and reputation.

    Example: aitbc market list --sort price --json
    """
    root = resolve_home(home)
    name = network_or_default(network, fallback="devnet")  # the market of `aitbc devnet up` unless told

    async def discover() -> list[dict]:
        from aitbc_agent_sdk.config import AgentConfig

        config = AgentConfig(name="aitbc-market", network=name, home=root)  # a bad network fails before the prompt
        account, _ = await unlock(root, wallet, PasswordSource(password_file, interactive=not as_json))
        return await offer_rows(config, account, min_gpu)

    field, largest_first = SORT_KEYS[sort]
    rows = sorted(asyncio.run(discover()), key=lambda r: r[field], reverse=largest_first)
    if as_json:
        print_json({"offers": rows})
        return
    table = Table(title=f"{len(rows)} offers, by {sort.value}")
    for col in ("provider", "hardware", "price/round ETH", "bond ETH", "reputation", "done/failed/slashed",
                "free", "score"):
        table.add_column(col)
    for r in rows:
        table.add_row(terminal_markup(r["provider"]), terminal_markup(r["hardware"]), eth(r["price_wei"]), eth(r["stake_wei"]), f"{r['reputation']:.2f}",
                      f"{r['completed']}/{r['failed']}/{r['slashes']}", str(r["free_slots"]), f"{r['score']:.3f}")
    output_console().print(table)
