"""``aitbc provider start|status``: rent out this machine on the devnet's market."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.market import DEFAULT_MIN_STAKE_WEI
from aitbc_agent_sdk.records import TaskPolicy, parse_size
from aitbc_agent_sdk.records import terminal_markup
from aitbc_agent_sdk.profile import load_profile

from .common import (
    HomeOption, JsonOption, PasswordFileOption, PasswordSource, cli_parser, eth_amount_option, print_json,
    resolve_home, unlock, wallet_store,
)
from .params import format_eth
from .render import output_console

app = typer.Typer(help="Run a provider daemon and see its jobs and earnings.", no_args_is_help=True)

WalletOption = Annotated[str, typer.Option(help="the provider's wallet (in $AITBC_HOME/wallets)")]


class GpuChoice(str, Enum):
    auto = "auto"  # detect with NVML
    none = "none"  # offer CPU only


class TaskChoice(str, Enum):
    builtin = "builtin"
    allow_list = "allow-list"
    any = "any"


def task_policy(accepts: str, allowed: list[str]) -> TaskPolicy:
    """The policy from the options; a bad CID or an allow-list without CIDs is a usage error (exit 2)."""
    if accepts == "allow-list" and not allowed:
        raise typer.BadParameter("--tasks allow-list needs at least one --allow-task CID", param_hint="--allow-task")
    try:
        return TaskPolicy(accepts=accepts, allowed=tuple(allowed))  # type: ignore[arg-type]
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="--allow-task") from exc


@app.command()
def start(
    wallet: Annotated[str, typer.Option(help="wallet that signs offers and receives payments")],
    price: Annotated[int, eth_amount_option("--price", "--price-eth", help="price per training round")],
    gpu: Annotated[GpuChoice, typer.Option(help="'auto' detects GPUs with NVML; 'none' offers CPU only")
                   ] = GpuChoice.auto,
    slots: Annotated[Optional[int], typer.Option(
        min=1, max=64, help="jobs served at once (default: one per GPU, each on its own GPU; 1 on a CPU host)")] = None,
    threads: Annotated[Optional[int], typer.Option(
        min=1, max=1024, help="torch threads per slot (default: the host's cores shared among the slots)")] = None,
    tasks: Annotated[TaskChoice, typer.Option(
        help="code to run: 'builtin' tasks only, 'allow-list' (built-ins and --allow-task CIDs), or 'any' task "
             "(always in the sandbox)")] = TaskChoice.builtin,
    allow_task: Annotated[Optional[list[str]], typer.Option(
        "--allow-task", metavar="CID", help="a task CID this provider runs (repeatable; with --tasks allow-list)")] = None,
    stake: Annotated[int, eth_amount_option("--stake", help="bond to post in the registry if not registered "
                                            f"(coordinators hire only providers bonded with "
                                            f"{format_eth(DEFAULT_MIN_STAKE_WEI)} ETH or more unless they choose "
                                            f"otherwise)", default_wei=0)] = 0,
    no_sandbox: Annotated[bool, typer.Option(
        "--no-sandbox", help="train jobs without the bwrap sandbox: they can then read this user's files")] = False,
    cache_dir: Annotated[Optional[Path], typer.Option(
        metavar="DIR", help="where fetched shards and weights are kept between jobs (default: the provider's "
                            "directory under --home, providers/ADDRESS/cache)")] = None,
    cache_size: Annotated[Optional[int], typer.Option(
        metavar="SIZE", parser=cli_parser(parse_size),
        help="the most the cache keeps: 20GiB, 500MB or bytes (default 20GiB); least recently used content goes "
             "first, content a running job uses never")] = None,
    kept_size: Annotated[Optional[int], typer.Option(
        metavar="SIZE", parser=cli_parser(parse_size),
        help="the most delivered results and their boundary states kept for re-sends and spot checks until "
             "their training closes (default 32GiB); past it the oldest job of the training holding the most "
             "goes first")] = None,
    max_unreceipted_rounds: Annotated[Optional[int], typer.Option(
        min=0, max=1000, metavar="N",
        help="stop working for a coordinator once N delivered rounds lack its signed payment receipt "
             "(default 2; 0: never stop, trusting it to pay)")] = None,
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="once serving, print one JSON object on stdout: "
                                                         "{address, price_wei, slots, tasks}; errors too")] = False,
) -> None:
    """Serve until interrupted: signed offer, heartbeats, jobs in a separate training process.

    Example: aitbc provider start --wallet provider-0 --price 0.01
    """
    # Long because: typer declares every option in the signature; the body is some 20 lines.
    root = resolve_home(home)
    policy = task_policy(tasks.value, allow_task or [])

    async def serve() -> None:
        from aitbc_agent_sdk.flow import serve_provider
        from aitbc_agent_sdk.provider import TrainingSandbox

        account, _ = await unlock(root, wallet, PasswordSource(password_file, interactive=not as_json))
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        _announce(account.address, price, slots, policy, as_json)
        await serve_provider(root, account, price_wei=price, slots=slots, gpu=gpu.value,
                             stake_wei=stake or None, stop=stop, threads=threads, tasks=policy,
                             sandbox=None if no_sandbox else TrainingSandbox(hidden_paths=(root,)),
                             cache_dir=cache_dir, cache_bytes=cache_size,
                             max_unreceipted_rounds=max_unreceipted_rounds, kept_bytes=kept_size)

    asyncio.run(serve())


def _announce(address: str, price: int, slots: int | None, policy: TaskPolicy, as_json: bool) -> None:
    if as_json:  # the address a script needs, at once (the daemon runs on)
        print_json({"address": address, "price_wei": price, "slots": slots, "tasks": policy.accepts})
    else:
        Console(stderr=True).print(f"provider {address} serving at {format_eth(price)} ETH per round (Ctrl-C stops)")


@app.command()
def status(wallet: WalletOption, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The provider's jobs (from its daemon) and its earnings (from the escrow's events on chain).

    Example: aitbc provider status --wallet provider-0 --json
    """
    from aitbc_agent_sdk.flow import STATUS_FILE, provider_dir

    root = resolve_home(home)
    address = asyncio.run(wallet_store(root).get(wallet)).address
    path = provider_dir(root, address) / STATUS_FILE
    state = json.loads(path.read_text()) if path.is_file() else {"address": address, "running": False, "jobs": []}
    earnings = asyncio.run(_earnings(root, address))
    state["earned_wei"] = sum(e["amount_wei"] for e in earnings)
    state["payments"] = earnings
    if as_json:
        print_json(state)
        return
    table = Table(title=f"provider {address} ({'running' if state.get('running') else 'stopped'})")
    for col in ("job", "training", "round", "status", "epoch", "loss"):
        table.add_column(col)
    for job in state["jobs"]:
        table.add_row(terminal_markup(job["job_id"]), terminal_markup(job["training_id"]), str(job["round"]),
                      terminal_markup(job["status"]),
                      f"{job['epoch']}/{job['epochs']}", f"{job['loss']:.4f}" if job["loss"] is not None else "-")
    console = output_console()
    console.print(table)
    console.print(f"earned {format_eth(state['earned_wei'])} ETH in {len(earnings)} payments")


async def _earnings(home: Path, address: str) -> list[dict]:
    from aitbc_agent_sdk.chain import EscrowClient, connect_rpc

    profile = load_profile(home)
    w3 = await connect_rpc(profile.chain.rpc_url)
    escrow = EscrowClient(w3, profile.chain.escrow)
    return [{"training": e.args["trainingId"].hex(), "amount_wei": e.args["amount"], "tx": e.tx_hash}
            for e in await escrow.worker_payments(address, from_block=profile.chain.deployed_block)]


async def _registry_action(home: Path, wallet: str, action: str, password: PasswordSource,
                           amount_wei: int = 0) -> dict:
    """Run one registry transaction signed by the provider's wallet; return its new state."""
    from aitbc_agent_sdk.chain import EscrowClient, TransactionSender, connect_rpc
    from aitbc_agent_sdk.chain import RegistryClient
    from eth_utils import keccak

    account, _ = await unlock(home, wallet, password)
    profile = load_profile(home)
    w3 = await connect_rpc(profile.chain.rpc_url)
    registry = RegistryClient(w3, await EscrowClient(w3, profile.chain.escrow).registry())
    sender = TransactionSender(w3, account, confirmations=profile.chain.confirmations)
    state = await registry.provider(account.address)
    if action == "register":
        if state.registered:
            raise ConfigError(f"{account.address} is already registered; use 'aitbc provider stake' to add to its bond")
        receipt = await registry.register(sender, amount_wei, keccak(text=f"aitbc-provider:{account.address}"))
    elif action == "stake":
        if not state.registered:
            raise ConfigError(f"{account.address} is not registered; use 'aitbc provider register' first")
        receipt = await registry.update(sender, state.metadata_hash, add_stake=amount_wei)
    elif state.unbonding_at and state.unbonding_at <= int(time.time()):
        receipt = await registry.withdraw(sender)
    else:
        if not state.registered:
            raise ConfigError(f"{account.address} is not registered")
        receipt = await registry.begin_unbonding(sender)
    after = await registry.provider(account.address)
    return {"address": account.address, "tx_hash": receipt["transactionHash"].to_0x_hex(), "stake_wei": after.stake,
            "registered": after.registered, "unbonding_at": after.unbonding_at, "completed": after.completed,
            "failed": after.failed, "slashes": after.slashes, "assigned": after.assigned}


def _show_registry(result: dict, as_json: bool, what: str) -> None:
    if as_json:
        print_json(result)
        return
    unbonding = (f", unbonding until {time.strftime('%Y-%m-%d %H:%M', time.localtime(result['unbonding_at']))}"
                 if result["unbonding_at"] else "")
    Console().print(f"{what} {result['address']}: bond {format_eth(result['stake_wei'])} ETH{unbonding} "
                    f"(completed {result['completed']}, failed {result['failed']}, slashes {result['slashes']}); "
                    f"tx {result['tx_hash']}")


@app.command()
def register(
    wallet: WalletOption,
    stake: Annotated[int, eth_amount_option("--stake", help="bond to post")],
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register in the on-chain provider registry with a bond.

    Example: aitbc provider register --wallet provider-0 --stake 0.1 --json
    """
    if stake <= 0:
        raise ConfigError("--stake must be positive")
    _show_registry(asyncio.run(_registry_action(resolve_home(home), wallet, "register",
                                                  PasswordSource(password_file, not as_json), stake)),
                   as_json, "registered")


@app.command("stake")
def add_stake(
    wallet: WalletOption,
    add: Annotated[int, eth_amount_option("--amount", "--add", help="amount to add to the bond")],
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add to the bond (this also cancels a pending unbonding).

    Example: aitbc provider stake --wallet provider-0 --amount 0.05 --json
    """
    if add <= 0:
        raise ConfigError("--amount must be positive")
    _show_registry(asyncio.run(_registry_action(resolve_home(home), wallet, "stake",
                                                  PasswordSource(password_file, not as_json), add)),
                   as_json, "bonded")


@app.command()
def unregister(wallet: WalletOption, home: HomeOption = None, password_file: PasswordFileOption = None,
               as_json: JsonOption = False) -> None:
    """Start unbonding; run again after the delay to withdraw the bond (never while assigned).

    Example: aitbc provider unregister --wallet provider-0
    """
    _show_registry(asyncio.run(_registry_action(resolve_home(home), wallet, "unregister",
                                                PasswordSource(password_file, not as_json))), as_json, "unregistering")
