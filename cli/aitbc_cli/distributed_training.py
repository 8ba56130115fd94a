"""``aitbc distributed-training``: run a federated training end to end, or step by step."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.models import FaultPolicy, JobConfig, TrainingReport, TrainingSpec
from aitbc_agent_sdk.models.inert import terminal_markup

from . import sample, steps, training_views
from .common import (
    ConfirmationRequired, DryRunOption, HeartbeatOption, HomeOption, JsonOption, MaxWorkersOption, MinWorkersOption,
    ScaleWindowOption, SparesOption, SpendPreview, TargetThroughputOption, YesOption, confirm_spend,
    elastic_policy, eth_amount_option, print_json, EncryptOption,
)
from .plot import plot_report
from .render import LiveTraining
from .report_view import final_text, report_tables
from .task_options import TaskOption, TaskParamOption
from .training_options import (
    FAULTS, JOB, SPEC, AggregationChoiceOption, AssumedSpeedOption, OuterLrOption, OuterMomentumOption, OuterOption,
    UpdateEncodingOption, BatchSizeOption, EpochsOption, FetchTimeoutOption,
    FirstRoundDeadlineOption, LrOption, MinDeadlineOption, MinGpuOption, MinRoundTimeoutOption, ModelType,
    ModelTypeOption, PartitionOption, PingTimeoutOption, PlotOption, ResendTimeoutOption, RoundsOption,
    SpotChecksOption, OpeningTimeoutOption, MinStakeOption,
    RoundTimeoutOption, SeedOption, TargetWorkersOption,
)

if TYPE_CHECKING:
    from aitbc_agent_sdk.agent import Agent

app = typer.Typer(help="Coordinate federated training across GPU providers: `run` does it all in one process; "
                       "init, upload-data, discover-workers, distribute follow the seed's steps on the devnet; "
                       "list, logs, monitor, stop and resume manage what runs.", no_args_is_help=True)
steps.register(app)
training_views.register(app)
sample.register(app)


@app.command()
def run(
    dataset: Annotated[str, typer.Option(help="bundled dataset name (digits)")] = "digits",
    data_path: Annotated[Optional[Path], typer.Option(help=".npz/.pt/.csv file or a directory (text corpus, CLASS/ image folders, your task's files); overrides --dataset")] = None,
    label_column: Annotated[Optional[str], typer.Option(help="label column of a CSV file")] = None,
    model_type: ModelTypeOption = ModelType.mlp,
    task: TaskOption = None,
    task_param: TaskParamOption = None,
    target_workers: TargetWorkersOption = 4,
    rounds: RoundsOption = 5,
    epochs: EpochsOption = JOB["epochs"].default,
    batch_size: BatchSizeOption = JOB["batch_size"].default,
    lr: LrOption = JOB["learning_rate"].default,
    partition: PartitionOption = "iid",
    alpha: Annotated[float, typer.Option(help="Dirichlet concentration, above 0: lower is more "
                                                       "skewed (with --partition dirichlet)")] = 0.5,
    seed: SeedOption = 0,
    spares: SparesOption = 0,
    encrypt: EncryptOption = False,
    aggregation: AggregationChoiceOption = "fedavg",
    outer: OuterOption = "fedavg",
    outer_lr: OuterLrOption = SPEC["outer_lr"].default,
    outer_momentum: OuterMomentumOption = SPEC["outer_momentum"].default,
    update_encoding: UpdateEncodingOption = None,
    heartbeat_timeout: HeartbeatOption = FAULTS["heartbeat_timeout_s"].default,
    ping_timeout: PingTimeoutOption = FAULTS["ping_timeout_s"].default,
    first_round_deadline: FirstRoundDeadlineOption = FAULTS["first_round_deadline_s"].default,
    assumed_samples_per_s: AssumedSpeedOption = FAULTS["assumed_samples_per_s"].default,
    min_deadline: MinDeadlineOption = FAULTS["min_deadline_s"].default,
    round_timeout: RoundTimeoutOption = None,
    min_round_timeout: MinRoundTimeoutOption = FAULTS["min_round_timeout_s"].default,
    fetch_timeout: FetchTimeoutOption = FAULTS["fetch_timeout_s"].default,
    resend_timeout: ResendTimeoutOption = FAULTS["resend_timeout_s"].default,
    spot_checks: SpotChecksOption = FAULTS["spot_checks"].default,
    opening_timeout: OpeningTimeoutOption = FAULTS["opening_timeout_s"].default,
    target_throughput: TargetThroughputOption = None,
    min_workers: MinWorkersOption = 1,
    max_workers: MaxWorkersOption = 64,
    scale_window: ScaleWindowOption = 2,
    min_gpu: MinGpuOption = None,
    min_stake: MinStakeOption = None,
    providers: Annotated[Optional[int], typer.Option(
        min=0, help="local provider agents on the embedded stack [default: workers + spares]")] = None,
    wallet_funds: Annotated[int, eth_amount_option("--wallet-funds", "--wallet-funds-eth",
                                                   help="embedded wallet funding")] = 100 * 10**18,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    home: HomeOption = None,
    as_json: JsonOption = False,
    plot: PlotOption = None,
) -> None:
    """Train across several workers with FedAvg, pay them on-chain, print the result.

    Before the escrow is funded it shows the cost (workers x price x rounds, plus what spares could add) and asks; --yes skips the question, --dry-run only plans (no training is kept).

    Example: aitbc distributed-training run --dataset digits --target-workers 4 --rounds 5 --yes --plot curves.png
    """
    # Long because: typer declares every option in the signature; the body is some 40 lines.
    if data_path is not None and not data_path.exists():
        raise ConfigError(f"dataset not found: {data_path}")
    if plot is not None:
        check_writable_png(plot)  # before anything is paid, not after
    if not (yes or dry_run) and not sys.stdin.isatty():
        raise ConfirmationRequired("run funds an escrow and there is no terminal to ask: pass --yes to confirm, "
                                   "or --dry-run to see the plan and its cost")
    source = data_path or dataset
    flow.check_dataset(source, label_column)  # a bad file: a clear error now, not a traceback mid-run
    flow.check_task_source(task)
    task_choice = flow.TaskChoice(task, flow.parse_task_params(task_param))
    spec = TrainingSpec(model_type=ModelType(model_type).value, target_workers=target_workers, rounds=rounds,
                        partition=getattr(partition, "value", partition), dirichlet_alpha=alpha, seed=seed,
                        spare_workers=spares, encrypt=encrypt, outer=getattr(outer, "value", outer), outer_lr=outer_lr, outer_momentum=outer_momentum,
                        min_stake_wei=min_stake,
                        update_encoding=getattr(update_encoding, "value", update_encoding),
                        aggregation=getattr(aggregation, "value", aggregation),
                        faults=FaultPolicy(
                            heartbeat_timeout_s=heartbeat_timeout, ping_timeout_s=ping_timeout,
                            first_round_deadline_s=first_round_deadline, assumed_samples_per_s=assumed_samples_per_s,
                            min_deadline_s=min_deadline, round_timeout_s=round_timeout,
                            min_round_timeout_s=min_round_timeout, fetch_timeout_s=fetch_timeout,
                            resend_timeout_s=resend_timeout, spot_checks=spot_checks,
                            opening_timeout_s=opening_timeout),
                        elastic=elastic_policy(target_throughput, min_workers, max_workers, scale_window),
                        job=JobConfig(batch_size=batch_size, learning_rate=lr, epochs=epochs))
    settings: dict[str, Any] = {"providers": target_workers + spares if providers is None else providers,
                                "wallet_funding_wei": wallet_funds}
    console = Console(stderr=True, quiet=as_json)
    if dry_run:  # the embedded stack in a scratch home: this home and its chain stay untouched
        with tempfile.TemporaryDirectory(prefix="aitbc-dry-run-") as scratch:
            config = AgentConfig(name="aitbc-cli", home=Path(scratch), **settings)
            plan = asyncio.run(_plan(config, spec, task_choice, source, label_column, min_gpu, console))
        if as_json:
            print_json({"dry_run": True, **plan})
        return
    if home is not None:
        settings["home"] = home
    config = AgentConfig(name="aitbc-cli", **settings)
    report = asyncio.run(_run(config, spec, task_choice, source, label_column, min_gpu, console, yes=yes,
                              live=not as_json))
    if plot is not None:
        plot_report(report, plot)
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    out = Console()
    for table in report_tables(report):
        out.print(table)
    out.print(f"[bold green]complete[/]: {terminal_markup(final_text(report))}, model {report.model_cid}")
    if plot is not None:
        out.print(f"plot written to {plot}")


def check_writable_png(path: Path) -> None:
    """A .png that can be written: its directory exists (or can be made) and is writable."""
    if path.suffix.lower() != ".png":
        raise ConfigError(f"--plot must name a .png file, got {path}")
    if path.is_dir():
        raise ConfigError(f"--plot {path} is a directory; name a .png file")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"--plot {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"--plot {path}: cannot write there (permission denied)")


async def _start(config: AgentConfig, console: Console, view: LiveTraining | None = None) -> Agent:
    from aitbc_agent_sdk.agent import Agent  # torch and web3: import only when a run starts

    with console.status("starting the embedded stack (bus, content store, chain, providers)..."):
        return await Agent(config, observer=view.observe if view else None).start()


async def _cost(agent: Agent, spec: TrainingSpec, source: str | Path, label_column: str | None,
                min_gpu: str | None) -> tuple[flow.CostPreview, Any]:
    """Everything ``run`` checks before it writes (data, model, market, funds), and the escrow's cost."""
    from aitbc_agent_sdk.coordinator import RunRequest, prepare

    request = RunRequest(spec=spec, dataset=source, label_column=label_column, min_gpu=min_gpu)
    prepared = await prepare(agent.coordinator, request)
    _, selected, spares = prepared
    cost = flow.preview([w.price for w in selected], [w.price for w in spares], spec.rounds,
                        min_stake_wei=agent.coordinator.min_stake(spec.min_stake_wei),
                        stake_skipped=len(agent.coordinator.stake_skipped))
    return cost, prepared


async def _plan(config: AgentConfig, spec: TrainingSpec, task: flow.TaskChoice, source: str | Path,
                label_column: str | None, min_gpu: str | None, console: Console) -> dict[str, Any]:
    from aitbc_agent_sdk.coordinator.tasks import spec_for_dataset  # torch: only when a plan is made
    from aitbc_agent_sdk.training.bound_task import task_ref_of

    agent = await _start(config, console)
    try:
        spec = await flow.attach_task(agent, spec, task.source, task.params)
        cost, (dataset_cid, selected, spares) = await _cost(agent, spec, source, label_column, min_gpu)
        # What will train: the data decides it (transformer on a corpus is the gpt language model).
        planned = spec_for_dataset(spec, (await agent.coordinator.data.manifest(dataset_cid)).kind)
    finally:
        await agent.stop()
    spend = SpendPreview("fund the escrow of a new training", tuple(cost.items()), tuple(cost.notes()))
    confirm_spend(spend, yes=False, dry_run=True)
    console.print(f"task: {terminal_markup(task_ref_of(planned).name)}, outer: {planned.outer}, "
                  f"uploads: {planned.upload_encoding}")
    workers = [{"worker_id": w.worker_id, "role": role, "gpu": w.gpu_type, "price_wei": w.price}
               for role, group in (("worker", selected), ("spare", spares)) for w in group]
    return {"cost": cost.as_json(), "workers": workers, "task": task_ref_of(planned).name, "outer": planned.outer,
            "update_encoding": planned.upload_encoding, **spend.as_json()}


async def _run(config: AgentConfig, spec: TrainingSpec, task: flow.TaskChoice, source: str | Path,
               label_column: str | None, min_gpu: str | None, console: Console, *, yes: bool,
               live: bool) -> TrainingReport:
    view = LiveTraining(console, spec) if live else None
    agent = await _start(config, console, view)
    try:
        spec = await flow.attach_task(agent, spec, task.source, task.params)
        # The workers priced are the workers hired: the run reuses what the preview checked.
        cost, prepared = await _cost(agent, spec, source, label_column, min_gpu)
        spend = SpendPreview("fund the escrow of a new training", tuple(cost.items()), tuple(cost.notes()))
        # Asked off the event loop: the embedded providers keep answering meanwhile.
        await asyncio.to_thread(confirm_spend, spend, yes=yes, dry_run=False)
        if view is None:
            return await agent.run_distributed_training(spec, dataset=source, label_column=label_column,
                                                        min_gpu=min_gpu, prepared=prepared)
        with view:
            return await agent.run_distributed_training(spec, dataset=source, label_column=label_column,
                                                        min_gpu=min_gpu, prepared=prepared)
    finally:
        await agent.stop()
