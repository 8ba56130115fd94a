"""``aitbc distributed-training``: run a federated training end to end, or step by step."""

from __future__ import annotations

import asyncio
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.records import TrainingReport, TrainingSpec
from aitbc_agent_sdk.records import describe
from aitbc_agent_sdk.records import terminal_markup

from . import export, sample, steps, training_views
from .common import (
    DryRunOption, HomeOption, JsonOption, SpendPreview, YesOption, confirm_spend, exit_code_for, eth_amount_option,
    print_json,
)
from .interrupts import Interruption, interrupted_line, stop_on_signal
from .paths import check_writable_png
from .plot import plot_report
from .render import LiveTraining, hiring_warnings
from .report_view import cost_line, final_text, report_tables
from .spec_options import TrainingOptions, with_training_options
from .training_options import MinGpuOption, PlotOption

if TYPE_CHECKING:
    from aitbc_agent_sdk import Agent

app = typer.Typer(help="Coordinate federated training across GPU providers: `run` does it all in one process; "
                       "init, upload-data, discover-workers, distribute follow the seed's steps on the devnet; "
                       "list, logs, monitor, stop and resume manage what runs.", no_args_is_help=True)
steps.register(app)
training_views.register(app)
sample.register(app)
export.register(app)


@app.command()
@with_training_options()
def run(
    dataset: Annotated[str, typer.Option(help="bundled dataset name (digits)")] = "digits",
    data_path: Annotated[Optional[Path], typer.Option(help=".npz/.pt/.csv file or a directory (text corpus, CLASS/ image folders, your task's files); overrides --dataset")] = None,
    label_column: Annotated[Optional[str], typer.Option(help="label column of a CSV file")] = None,
    options: TrainingOptions = TrainingOptions(),  # the options init has too (spec_options), in their place
    min_gpu: MinGpuOption = None,
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

    Before the escrow is funded it shows the cost (workers x price x rounds, plus what spares could add); the embedded network's play money needs no confirmation, so it runs without a terminal. --dry-run only plans (no training is kept).

    Ctrl-C or SIGTERM settles as `stop` does: the accepted rounds are paid, the rest refunded, one line says so (exit 130 or 143); a second signal while settling is ignored.

    Example: aitbc distributed-training run --dataset digits --target-workers 4 --rounds 5 --yes --plot curves.png
    """
    if data_path is not None and not data_path.exists():
        raise ConfigError(f"dataset not found: {data_path}")
    if plot is not None:
        check_writable_png(plot)  # before anything is paid, not after
    source = data_path or dataset
    flow.check_dataset(source, label_column, options.target_kind, options.vocab_size)  # a bad file: a clear error now
    flow.check_task_source(options.task)
    task_choice = flow.TaskChoice(options.task, flow.parse_task_params(options.task_param))
    spec = options.spec()
    workers = options.target_workers + options.spares
    settings: dict[str, Any] = {"providers": workers if providers is None else providers,
                                "wallet_funding_wei": wallet_funds}
    console = Console(stderr=True, quiet=as_json)
    if dry_run:
        _dry_run(settings, spec, task_choice, source, label_column, min_gpu, console, as_json)
        return
    if home is not None:
        settings["home"] = home
    config = AgentConfig(name="aitbc-cli", **settings)
    warnings: list[str] = []
    report = asyncio.run(_run(config, spec, task_choice, source, label_column, min_gpu, console, yes=yes,
                              live=not as_json, warnings=warnings))
    _show(report, plot, as_json, warnings)


def _show(report: Any, plot: Path | None, as_json: bool, warnings: list[str]) -> None:
    """The run's outcome: tables (or one JSON object), the plot, and the exit an interruption or a
    failed plot calls for."""
    if isinstance(report, Interruption):
        _say_interrupted(report, as_json)
    plot_failure = _write_plot(report, plot)  # whatever happens to the plot, the results are shown
    if as_json:
        print_json({**report.model_dump(mode="json"), "warnings": warnings,
                    **({"plot_error": str(plot_failure)} if plot_failure else {})})
    else:
        out = Console()
        for table in report_tables(report):
            out.print(table)
        if report.cost is not None:
            out.print(cost_line(report.cost))
        out.print(f"[bold green]complete[/]: {terminal_markup(final_text(report))}, model {report.model_cid}")
        if plot is not None and plot_failure is None:
            out.print(f"plot written to {plot}")
    if plot_failure is not None and as_json:  # one JSON object: the error is in it already
        raise typer.Exit(exit_code_for(plot_failure))
    if plot_failure is not None:
        raise plot_failure


def _dry_run(settings: dict[str, Any], spec: Any, task_choice: Any, source: Any, label_column: str | None,
             min_gpu: Any, console: Console, as_json: bool) -> None:
    """Plan on the embedded stack in a scratch home: the user's home and its chain stay untouched."""
    with tempfile.TemporaryDirectory(prefix="aitbc-dry-run-") as scratch:
        config = AgentConfig(name="aitbc-cli", home=Path(scratch), warm_providers=False, **settings)
        plan = asyncio.run(_plan(config, spec, task_choice, source, label_column, min_gpu, console))
    if as_json:
        print_json({"dry_run": True, **plan})


def _write_plot(report: TrainingReport, plot: Path | None) -> Exception | None:
    """The plot's failure, returned rather than raised: the paid-for results are printed first."""
    if plot is None:
        return None
    try:
        plot_report(report, plot)
    except Exception as exc:  # noqa: BLE001 - any failure; the caller raises it after the results
        return exc
    return None


async def _start(config: AgentConfig, console: Console, view: LiveTraining | None = None) -> Agent:
    from aitbc_agent_sdk import Agent  # torch and web3: import only when a run starts

    with console.status("starting the embedded stack (bus, content store, chain, providers)..."):
        return await Agent(config, observer=view.observe if view else None).start()


async def _cost(agent: Agent, spec: TrainingSpec, source: str | Path, label_column: str | None,
                min_gpu: str | None) -> tuple[flow.CostPreview, Any]:
    """Everything ``run`` checks before it writes (data, model, market, funds), and the escrow's cost."""
    from aitbc_agent_sdk.coordinator import RunRequest, prepare

    request = RunRequest(spec=spec, dataset=source, label_column=label_column, min_gpu=min_gpu)
    prepared = await prepare(agent.coordinator, request)
    selected, spares = prepared.workers, prepared.spares
    cost = flow.preview([w.price for w in selected], [w.price for w in spares], spec.rounds,
                        min_stake_wei=agent.coordinator.min_stake(spec.min_stake_wei),
                        stake_skipped=len(agent.coordinator.stake_skipped),
                        spot_checks=spec.faults.spot_checks, segments=spec.job.segments,
                        verify_on=flow.checks_where(spec.faults, prepared.footprint),
                        canary_rate=spec.faults.canary_rate)
    return cost, prepared


async def _plan(config: AgentConfig, spec: TrainingSpec, task: flow.TaskChoice, source: str | Path,
                label_column: str | None, min_gpu: str | None, console: Console) -> dict[str, Any]:
    from aitbc_agent_sdk.coordinator import spec_for_dataset  # torch: only when a plan is made
    from aitbc_agent_sdk.tasks import task_ref_of

    agent = await _start(config, console)
    try:
        spec = await flow.attach_task(agent, spec, task.source, task.params)
        cost, prepared = await _cost(agent, spec, source, label_column, min_gpu)
        dataset_cid, selected, spares, footprint = prepared
        # What will train: the data decides it (transformer on a corpus is the gpt language model).
        planned = spec_for_dataset(spec, (await agent.coordinator.data.manifest(dataset_cid)).kind)
        target = await flow.dataset_target(agent, dataset_cid)
    finally:
        await agent.stop()
    spend = SpendPreview("fund the escrow of a new training", tuple(cost.items()), tuple(cost.notes()))
    confirm_spend(spend, yes=False, dry_run=True)
    console.print(f"task: {terminal_markup(task_ref_of(planned).name)}, outer: {planned.outer}, "
                  f"uploads: {planned.upload_encoding}")
    console.print(f"model: {describe(footprint, spec.job.batch_size)}")
    if (line := flow.target_line(target, spec.target is not None)) is not None:
        console.print(line)
    workers = [{"worker_id": w.worker_id, "role": role, "gpu": w.gpu_type, "price_wei": w.price}
               for role, group in (("worker", selected), ("spare", spares)) for w in group]
    return {"cost": cost.as_json(), "workers": workers, "task": task_ref_of(planned).name, "outer": planned.outer,
            "target": target, "warnings": _shortfall(spec, prepared), "model": footprint.model_dump(),
            "update_encoding": planned.upload_encoding, **spend.as_json()}


async def _run(config: AgentConfig, spec: TrainingSpec, task: flow.TaskChoice, source: str | Path,
               label_column: str | None, min_gpu: str | None, console: Console, *, yes: bool,
               live: bool, warnings: list[str]) -> TrainingReport | Interruption:
    """The report; or, after Ctrl-C or SIGTERM, the signal, with the training settled as ``stop`` settles it."""
    view = LiveTraining(console, spec) if live else None
    agent = await _start(config, console, view)
    try:
        known = {r.training_id for r in await agent.coordinator.db.trainings()}
        work = asyncio.ensure_future(_train(agent, spec, task, source, label_column, min_gpu, view, yes=yes,
                                            warnings=warnings))
        async with stop_on_signal(work, lambda line: typer.echo(line, err=True)) as caught:
            try:
                return await work
            except asyncio.CancelledError:
                if caught.signum is None:
                    raise
                caught.outcome = await flow.settle_interrupted(agent.coordinator, known)
                return caught
    finally:
        await agent.stop()


async def _train(agent: Agent, spec: TrainingSpec, task: flow.TaskChoice, source: str | Path,
                 label_column: str | None, min_gpu: str | None, view: LiveTraining | None, *, yes: bool,
                 warnings: list[str]) -> TrainingReport:
    spec = await flow.attach_task(agent, spec, task.source, task.params)
    # The workers priced are the workers hired: the run reuses what the preview checked.
    cost, prepared = await _cost(agent, spec, source, label_column, min_gpu)
    warnings.extend(_shortfall(spec, prepared))
    if view is not None and (line := flow.target_line(await flow.dataset_target(agent, prepared.dataset_cid),
                                                      spec.target is not None)):
        typer.echo(line, err=True)
    spend = SpendPreview("fund the escrow of a new training", tuple(cost.items()), tuple(cost.notes()))
    # The embedded network's chain is play money in this process: shown, not asked.
    confirm_spend(spend, yes=yes, dry_run=False, play_money=agent.config.network == "embedded")
    with view or nullcontext():
        return await agent.run_distributed_training(spec, dataset=source, label_column=label_column,
                                                    min_gpu=min_gpu, prepared=prepared)


def _say_interrupted(caught: Interruption, as_json: bool) -> None:
    """One line (or one JSON object) on what the interrupted run paid and refunded; exit 130 or 143."""
    assert caught.outcome is not None
    line = interrupted_line(caught.outcome)
    if as_json:
        print_json({"status": "interrupted", "message": line, "training_id": caught.outcome.training_id,
                    "accepted_rounds": caught.outcome.accepted_rounds, "paid_wei": caught.outcome.paid_wei,
                    "refunded_wei": caught.outcome.refunded_wei, "resumable": False})
    else:
        typer.echo(line, err=True)
    raise typer.Exit(caught.exit_code)


def _shortfall(spec: TrainingSpec, prepared: Any) -> list[str]:
    """Warnings (also on stderr at once) when the market filled fewer places than asked."""
    selected, spares = prepared.workers, prepared.spares
    lines = hiring_warnings(asked_workers=spec.target_workers, asked_spares=spec.spare_workers,
                            workers=len(selected), spares=len(spares))
    for line in lines:
        typer.echo(f"warning: {line}", err=True)
    return lines
