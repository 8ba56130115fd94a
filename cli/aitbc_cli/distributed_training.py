"""``aitbc distributed-training``: run a federated training end to end."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.models import FaultPolicy, JobConfig, TrainingReport, TrainingSpec
from aitbc_agent_sdk.errors import ConfigError

from . import steps
from .common import (
    AggregationOption, HeartbeatOption, MaxWorkersOption, MinWorkersOption, ScaleWindowOption, SparesOption,
    TargetThroughputOption, elastic_policy,
)
from .plot import plot_report
from .render import LiveTraining, report_tables

app = typer.Typer(help="Coordinate federated training across GPU providers.", no_args_is_help=True)
steps.register(app)

WEI_PER_ETH = 10**18


@app.command()
def run(
    dataset: Annotated[str, typer.Option(help="bundled dataset name (digits)")] = "digits",
    data_path: Annotated[Optional[Path], typer.Option(help=".npz, .pt or .csv file; overrides --dataset")] = None,
    label_column: Annotated[Optional[str], typer.Option(help="label column of a CSV file")] = None,
    model: Annotated[str, typer.Option(help="mlp, cnn or transformer")] = "mlp",
    workers: Annotated[int, typer.Option(min=1, help="workers to hire")] = 4,
    rounds: Annotated[int, typer.Option(min=1, help="federated rounds")] = 5,
    epochs: Annotated[int, typer.Option(min=1, help="local epochs per round")] = 2,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    lr: Annotated[float, typer.Option(min=0.0, help="Adam learning rate (tuned on digits; see bench/bench_accuracy.py)")] = 1e-2,
    partition: Annotated[str, typer.Option(help="iid or dirichlet")] = "iid",
    alpha: Annotated[float, typer.Option(help="Dirichlet concentration (non-IID skew)")] = 0.5,
    seed: Annotated[int, typer.Option()] = 0,
    spares: SparesOption = 0,
    aggregation: AggregationOption = "fedavg",
    heartbeat_timeout: HeartbeatOption = 10.0,
    target_throughput: TargetThroughputOption = None,
    min_workers: MinWorkersOption = 1,
    max_workers: MaxWorkersOption = 64,
    scale_window: ScaleWindowOption = 2,
    providers: Annotated[Optional[int], typer.Option(min=0, help="local provider agents on the embedded stack (default: workers + spares)")] = None,
    wallet_funds_eth: Annotated[Decimal, typer.Option(help="embedded wallet funding, in ETH")] = Decimal(100),
    home: Annotated[Optional[Path], typer.Option(help="state directory (default $AITBC_HOME or ~/.aitbc)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object and nothing else")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="write accuracy/loss curves to this PNG")] = None,
) -> None:
    """Train across several workers with FedAvg, pay them on-chain, print the result."""
    if data_path is not None and not data_path.is_file():
        raise ConfigError(f"dataset file not found: {data_path}")
    if plot is not None and plot.suffix.lower() != ".png":
        raise ConfigError(f"--plot must name a .png file, got {plot}")
    spec = TrainingSpec(model_type=model, target_workers=workers, rounds=rounds, partition=partition,  # type: ignore[arg-type]
                        dirichlet_alpha=alpha, seed=seed, spare_workers=spares,
                        aggregation=aggregation,  # type: ignore[arg-type]
                        faults=FaultPolicy(heartbeat_timeout_s=heartbeat_timeout),
                        elastic=elastic_policy(target_throughput, min_workers, max_workers, scale_window),
                        job=JobConfig(batch_size=batch_size, learning_rate=lr, epochs=epochs))
    settings = {"providers": workers + spares if providers is None else providers, "wallet_funding_wei": int(wallet_funds_eth * WEI_PER_ETH)}
    if home is not None:
        settings["home"] = home
    config = AgentConfig(name="aitbc-cli", **settings)
    console = Console(stderr=True, quiet=as_json)
    report = asyncio.run(_run(config, spec, data_path or dataset, label_column, console, live=not as_json))
    if plot is not None:
        plot_report(report, plot)
    if as_json:
        typer.echo(json.dumps(report.model_dump(mode="json"), sort_keys=True))
        return
    out = Console()
    for table in report_tables(report):
        out.print(table)
    out.print(f"[bold green]complete[/]: final accuracy {report.final_accuracy:.4f}, model {report.model_cid}")
    if plot is not None:
        out.print(f"plot written to {plot}")


async def _run(config: AgentConfig, spec: TrainingSpec, dataset: str | Path, label_column: str | None,
               console: Console, *, live: bool) -> TrainingReport:
    from aitbc_agent_sdk.agent import Agent  # torch and web3: import only when a run starts

    view = LiveTraining(console, spec) if live else None
    with console.status("starting the embedded stack (bus, content store, chain, providers)..."):
        agent = await Agent(config, observer=view.observe if view else None).start()
    try:
        if view is None:
            return await agent.run_distributed_training(spec, dataset=dataset, label_column=label_column)
        with view:
            return await agent.run_distributed_training(spec, dataset=dataset, label_column=label_column)
    finally:
        await agent.stop()
