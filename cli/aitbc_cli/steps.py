"""The seed's step-by-step flow, each step its own process against the devnet profile:
init, upload-data, discover-workers, distribute, resume, stop. The steps themselves live in
``aitbc_agent_sdk.flow``, shared with the assistant; here are only options and output."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.errors import AitbcError, ConfigError
from aitbc_agent_sdk.records import format_size, parse_size
from aitbc_agent_sdk.records import terminal_markup

from .common import (
    DryRunOption, HomeOption, JsonOption, SpendPreview, YesOption, confirm_spend, eth_amount_option, print_json,
    resolve_home, unlock, PasswordFileOption, PasswordSource,
)
from .params import format_eth
from .render import hiring_warnings, output_console
from .spec_options import TrainingOptions, with_training_options
from .training_views import LATEST, TrainingRefArgument, resolve_training_id
from .training_options import MinGpuOption, Strategy, TargetOption, TrainingIdOption, VocabSizeOption

if TYPE_CHECKING:
    from aitbc_agent_sdk import Agent
    from aitbc_agent_sdk.records import TargetKind

T = TypeVar("T")


def run_as(home: Path, training_id: str, work: Callable[[Agent], Awaitable[T]],
           password: PasswordSource = PasswordSource()) -> T:
    """Unlock the training's wallet and run ``work`` with a devnet agent signing as it."""
    async def go() -> T:
        account, _ = await unlock(home, await flow.wallet_of(home, training_id), password)
        async with flow.devnet_agent(home, account) as agent:
            return await work(agent)
    return asyncio.run(go())


@with_training_options(target_workers=3)  # the local devnet's providers (DEVNET_PROVIDERS); run's default is 4
def init(
    wallet: Annotated[str, typer.Option(help="the coordinator's wallet (pays the escrow later)")],
    options: TrainingOptions = TrainingOptions(),  # the options run has too (spec_options), in their place
    dataset_size: Annotated[Optional[int], typer.Option(
        metavar="SIZE", parser=parse_size,
        help="the most the dataset may hold: 100GB, 512MiB, 1.5TB or bytes (kB/MB/GB/TB are powers of 1000, "
             "KiB/MiB/GiB/TiB of 1024); upload-data refuses a larger dataset before anything is funded")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="no devnet here: start the local one without asking")
                   ] = False,
    password_file: PasswordFileOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a training on the devnet; nothing is spent yet.

    With no devnet in the home it offers to start the local one (as 'aitbc devnet up' does, with the wallet
    named here funded as a coordinator); --yes starts it without asking.

    Example: aitbc distributed-training init --wallet dev --model-type mlp --target-workers 3 --rounds 3
    """
    root = resolve_home(home)
    spec = options.spec(dataset_size=dataset_size)
    task = options.task
    target_workers = options.target_workers

    flow.check_task_source(task)
    params = flow.parse_task_params(options.task_param)

    _ensure_devnet(root, wallet, providers=target_workers + options.spares, yes=yes,
                   can_ask=not as_json and sys.stdin.isatty(), quiet=as_json)

    async def create() -> Any:
        account, _ = await unlock(root, wallet, PasswordSource(password_file, interactive=not as_json))
        async with flow.devnet_agent(root, account) as agent:
            return await flow.create_training(agent, await flow.attach_task(agent, spec, task, params), wallet)

    record = asyncio.run(create())
    if as_json:
        print_json({"training_id": record.training_id, "status": record.status, "model_type": record.spec.model_type,
                    "task": record.spec.task.model_dump(mode="json") if record.spec.task else None,
                    "target_workers": target_workers, "coordinator": record.coordinator,
                    "min_stake_wei": flow.min_stake_of(record.spec)})
        return
    console = Console()
    console.print("Distributed training initialized")
    console.print(f"Training ID: {record.training_id}")
    console.print(f"Model Type: {terminal_markup(record.spec.model_type)}")
    if record.spec.task is not None and record.spec.task.cid is not None:
        console.print(f"Task: {terminal_markup(record.spec.task.name)} ({record.spec.task.cid})")
    console.print(f"Dataset Size: {format_size(dataset_size) if dataset_size is not None else '-'}")
    console.print(f"Target Workers: {target_workers}")
    console.print(f"Min Stake: {format_eth(flow.min_stake_of(record.spec))} ETH")
    console.print(f"Status: {record.status}")


DevnetChoice = Literal["use", "start", "ask", "refuse"]
DEVNET_PROVIDERS = 3  # what 'aitbc devnet up' starts; init starts more when the training asks for more


def devnet_choice(*, has_profile: bool, yes: bool, can_ask: bool) -> DevnetChoice:
    """What init does about the devnet: use the one the home has, start one (--yes), ask (a terminal, no
    --json), or refuse (nobody to ask)."""
    if has_profile:
        return "use"
    if yes:
        return "start"
    return "ask" if can_ask else "refuse"


def _ensure_devnet(home: Path, wallet: str, *, providers: int, yes: bool, can_ask: bool, quiet: bool) -> None:
    """Start the local devnet when the home has none and the user agrees (see devnet_choice)."""
    from aitbc_agent_sdk.profile import profile_path

    choice = devnet_choice(has_profile=profile_path(home).is_file(), yes=yes, can_ask=can_ask)
    if choice == "use":
        return
    if choice == "refuse":
        raise ConfigError(f"no devnet runs from {home} and there is no terminal to ask: pass --yes to start the "
                          f"local one, or run 'aitbc devnet up' first")
    if choice == "ask" and not typer.confirm(f"No devnet runs from {home}. Start the local one (broker, chain, "
                                             f"content store, provider daemons) now?", default=True, err=True):
        raise AitbcError("no devnet started, so there is nowhere to create the training: run 'aitbc devnet up', "
                         "or answer yes")
    from aitbc_agent_sdk.devnet import DevnetOptions

    from .devnet import start_devnet

    start_devnet(home, DevnetOptions(providers=min(max(DEVNET_PROVIDERS, providers), 64), wallets=(wallet,)),
                 quiet=quiet)


def _value(choice: Any) -> Any:
    """An enum member's value (typer passes members; a default given as text passes as it is)."""
    return getattr(choice, "value", choice)


def upload_data(
    training_id: TrainingIdOption,
    data_path: Annotated[Path, typer.Option(help=".npz/.pt/.csv file, a directory (text corpus, CLASS/ image folders, your task's files), or 'digits'")],
    label_column: Annotated[Optional[str], typer.Option(help="label column of a CSV file")] = None,
    target: TargetOption = None,
    vocab_size: VocabSizeOption = None,
    password_file: PasswordFileOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Validate the dataset and store it by CID in the devnet's content store (--target: as init's, which it
    overrides).

    A text corpus is byte-level tokens unless --vocab-size learns a BPE on it (stored with the dataset).

    Example: aitbc distributed-training upload-data --training-id training_... --data-path data.csv --label-column y
    """
    root = resolve_home(home)
    source = flow.dataset_source(data_path)
    target_kind = _value(target)
    flow.check_dataset(source, label_column, target_kind, vocab_size)  # fail before connecting anywhere
    async def upload(agent: Agent) -> tuple[str, TargetKind | None]:
        cid = await flow.upload_data(agent, training_id, source, label_column, target_kind, vocab_size)
        return cid, await flow.dataset_target(agent, cid)

    cid, found = run_as(root, training_id, upload, PasswordSource(password_file, interactive=not as_json))
    if as_json:
        print_json({"training_id": training_id, "dataset_cid": cid, "target": found})
        return
    Console().print(f"Dataset uploaded: {cid}")
    if (line := flow.target_line(found, target_kind is not None)) is not None:
        Console().print(line)


def discover_workers(
    training_id: TrainingIdOption,
    required_workers: Annotated[int, typer.Option("--required-workers", "--workers", min=1, max=1024,
                                                  help="workers to hire")],
    min_gpu: MinGpuOption = None,
    max_price: Annotated[Optional[int], eth_amount_option("--max-price", help="highest price per round")] = None,
    password_file: PasswordFileOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Discover offers, score them, and sign contracts with the best workers (and the training's spares).

    Example: aitbc distributed-training discover-workers --training-id training_... --required-workers 3 --min-gpu cpu
    """
    root = resolve_home(home)

    async def hire(agent: Agent) -> tuple[list[flow.HiredWorker], str | None, int]:
        hired = await flow.hire_workers(agent, training_id, required_workers, min_gpu=min_gpu, max_price_wei=max_price)
        spec = (await agent.coordinator.db.training(training_id)).spec
        return hired, agent.coordinator.stake_skips(spec.min_stake_wei), spec.spare_workers

    hired, skipped, spares = run_as(root, training_id, hire, PasswordSource(password_file, interactive=not as_json))
    warnings = hiring_warnings(asked_workers=required_workers, asked_spares=spares,
                               workers=sum(h.role == "worker" for h in hired),
                               spares=sum(h.role == "spare" for h in hired))
    for line in warnings:
        typer.echo(f"warning: {line}", err=True)
    if as_json:
        print_json({"training_id": training_id, "workers": [h.as_dict() for h in hired], "stake_skipped": skipped,
                    "warnings": warnings})
        return
    if skipped:
        Console(stderr=True).print(skipped, markup=False, highlight=False)
    from .report_view import short

    table = Table(title=f"Selected {len(hired)} workers")
    for col in ("worker", "role", "hardware", "ETH/round", "reputation", "score", "contract"):
        table.add_column(col)
    for h in hired:
        table.add_row(terminal_markup(short(h.worker_id)), terminal_markup(h.role), terminal_markup(h.gpu),
                      flow.eth_text(h.price_wei), f"{h.reputation:.2f}", f"{h.score:.3f}", terminal_markup(h.contract_id))
    output_console().print(table)


def distribute(
    training_id: TrainingIdOption,
    strategy: Annotated[Strategy, typer.Option(help="how the work is split; only data-parallel (FedAvg)")] =
    Strategy.data_parallel,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    password_file: PasswordFileOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fund the escrow, shard the data, and hand the rounds to a detached coordinator daemon.

    Shows what the escrow will hold and asks first; --yes skips the question, --dry-run only shows it.

    Example: aitbc distributed-training distribute --training-id training_... --yes
    """
    root = resolve_home(home)
    cost = asyncio.run(flow.distribution_cost(root, training_id))
    spend = SpendPreview(f"fund the escrow of {training_id}", tuple(cost.items()), tuple(cost.notes()))
    if not confirm_spend(spend, yes=yes, dry_run=dry_run):
        if as_json:
            print_json({"training_id": training_id, "dry_run": True, "cost": cost.as_json(), **spend.as_json()})
        return

    async def go() -> flow.Started:
        wallet = await flow.wallet_of(root, training_id)
        account, password = await unlock(root, wallet, PasswordSource(password_file, interactive=not as_json))
        return await flow.distribute(root, training_id, account, password)

    started = asyncio.run(go())
    if as_json:
        print_json({"training_id": training_id, "escrow_tx": started.escrow_tx, "workers": started.workers,
                    "coordinator_pid": started.pid, "log": str(started.log)})
        return
    Console().print(f"Escrow funded in {started.escrow_tx}; {started.workers} jobs distributed; coordinator daemon "
                    f"pid {started.pid} (log: {started.log})")


def resume(
    training_id: TrainingIdOption,
    password_file: PasswordFileOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Carry on a funded training whose coordinator died, in a new detached coordinator daemon.

    Example: aitbc distributed-training resume --training-id training_...
    """
    root = resolve_home(home)

    async def go() -> tuple[Any, flow.Started]:
        record = await flow.load_training(root, training_id)
        if (reason := flow.resume_blocker(root, record)) is not None:
            raise ConfigError(reason)
        _, password = await unlock(root, await flow.wallet_of(root, training_id),
                                   PasswordSource(password_file, interactive=not as_json))
        return record, await flow.resume(root, training_id, password)

    record, started = asyncio.run(go())
    if as_json:
        print_json({"training_id": training_id, "round": record.round, "phase": record.phase.value,
                    "coordinator_pid": started.pid, "log": str(started.log)})
        return
    Console().print(f"Resuming {training_id} after round {record.round} ({record.phase.value}); "
                    f"coordinator daemon pid {started.pid} (log: {started.log})")


def stop(
    training_id: TrainingRefArgument = LATEST,
    password_file: PasswordFileOption = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop a training for good, as `sky cancel` and `flwr stop` do.

    Ends its coordinator daemon (SIGTERM), tells the workers to drop the open round's jobs, pays the rounds already accepted, refunds the rest of the escrow and marks the training failed (reason: stopped by the user). It cannot be resumed afterwards; start a new one instead.

    Example: aitbc distributed-training stop training_0123456789abcdef
    """
    root = resolve_home(home)
    training_id = resolve_training_id(root, training_id)

    async def go() -> flow.Stopped:
        account, _ = await unlock(root, await flow.wallet_of(root, training_id),
                                  PasswordSource(password_file, interactive=not as_json))
        return await flow.stop_training(root, training_id, account)

    stopped = asyncio.run(go())
    if as_json:
        print_json({"training_id": training_id, "phase": "failed", "reason": flow.STOPPED_REASON,
                    "coordinator_pid": stopped.daemon_pid, "paid_wei": stopped.paid_wei,
                    "refunded_wei": stopped.refunded_wei, "refund_tx": stopped.refund_tx})
        return
    ended = f"coordinator daemon {stopped.daemon_pid} ended; " if stopped.daemon_pid else ""
    Console().print(f"Stopped {training_id}: {ended}paid {flow.eth_text(stopped.paid_wei)} ETH for accepted work, "
                    f"refunded {flow.eth_text(stopped.refunded_wei)} ETH ({stopped.refund_tx or 'no refund tx'}).")


def register(app: typer.Typer) -> None:
    """Add the step commands to the ``distributed-training`` app."""
    app.command()(init)
    app.command("upload-data")(upload_data)
    app.command("discover-workers")(discover_workers)
    app.command()(distribute)
    app.command()(resume)
    app.command()(stop)
