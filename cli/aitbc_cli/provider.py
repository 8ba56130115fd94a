"""``aitbc provider start|status``: rent out this machine on the devnet's market."""

from __future__ import annotations

import asyncio
import json
import signal
from decimal import Decimal
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.profile import load_profile

from .common import HomeOption, JsonOption, print_json, resolve_home, unlock, wallet_store

app = typer.Typer(help="Run a provider daemon and see its jobs and earnings.", no_args_is_help=True)


@app.command()
def start(
    wallet: Annotated[str, typer.Option(help="wallet that signs offers and receives payments")],
    price: Annotated[Decimal, typer.Option(help="price per training round, in ETH")],
    gpu: Annotated[str, typer.Option(help="'auto' (NVML) or 'none' to offer CPU only")] = "auto",
    slots: Annotated[int, typer.Option(min=1)] = 1,
    home: HomeOption = None,
) -> None:
    """Serve until interrupted: signed offer, heartbeats, jobs in a separate training process."""
    if gpu not in ("auto", "none"):
        raise ConfigError("--gpu must be 'auto' or 'none'")
    root = resolve_home(home)

    async def serve() -> None:
        from aitbc_agent_sdk.provider.daemon import serve_provider

        account, _ = await unlock(root, wallet)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        Console(stderr=True).print(f"provider {account.address} serving at {price} ETH per round (Ctrl-C stops)")
        await serve_provider(root, account, price_wei=int(price * 10**18), slots=slots, gpu=gpu, stop=stop)

    asyncio.run(serve())


@app.command()
def status(
    wallet: Annotated[str, typer.Option(help="the provider's wallet")],
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """The provider's jobs (from its daemon) and its earnings (from the escrow's events on chain)."""
    from aitbc_agent_sdk.provider.daemon import STATUS_FILE, provider_dir

    root = resolve_home(home)
    address = asyncio.run(wallet_store(root).get(wallet)).address
    path = provider_dir(root, address) / STATUS_FILE
    state = json.loads(path.read_text()) if path.is_file() else {"address": address, "running": False, "jobs": []}
    earnings = asyncio.run(_earnings(root, address))
    state["earned_wei"] = sum(e["amount"] for e in earnings)
    state["payments"] = earnings
    if as_json:
        print_json(state)
        return
    table = Table(title=f"provider {address} ({'running' if state.get('running') else 'stopped'})")
    for col in ("job", "training", "round", "status", "epoch", "loss"):
        table.add_column(col)
    for job in state["jobs"]:
        table.add_row(job["job_id"], job["training_id"], str(job["round"]), job["status"],
                      f"{job['epoch']}/{job['epochs']}", f"{job['loss']:.4f}" if job["loss"] is not None else "-")
    console = Console()
    console.print(table)
    console.print(f"earned {state['earned_wei'] / 10**18:.6f} ETH in {len(earnings)} payments")


async def _earnings(home, address: str) -> list[dict]:
    from aitbc_agent_sdk.chain import EscrowClient, connect_rpc

    profile = load_profile(home)
    w3 = await connect_rpc(profile.chain.rpc_url)
    escrow = EscrowClient(w3, profile.chain.escrow)
    return [{"training": e.args["trainingId"].hex(), "amount": e.args["amount"], "tx": e.tx_hash}
            for e in await escrow.worker_payments(address, from_block=profile.chain.deployed_block)]
