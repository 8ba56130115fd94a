"""The seed's step-by-step flow, each step its own process against the devnet profile:
init, upload-data, discover-workers, distribute, monitor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc_agent_sdk.agent import Agent

from aitbc_agent_sdk.config import AgentConfig
from aitbc_agent_sdk.coordinator.store import TrainingStore
from aitbc_agent_sdk.models import FaultPolicy, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.profile import training_dir
from aitbc_agent_sdk.coordinator.monitor import Snapshot, snapshot
from aitbc_agent_sdk.devnet.service import pid_alive, tail
from aitbc_agent_sdk.errors import AitbcError, ConfigError, NotEnoughWorkersError
from aitbc_agent_sdk.models import TrainingRecord, new_id

from .common import (
    AggregationOption, HeartbeatOption, HomeOption, JsonOption, MaxWorkersOption, MinWorkersOption,
    ScaleWindowOption, SparesOption, TargetThroughputOption, elastic_policy, print_json, resolve_home, unlock,
    wallet_store,
)
from .render import eth, short

T = TypeVar("T")


async def with_agent(home: Path, account: LocalAccount, work: Callable[[Agent], Awaitable[T]]) -> T:
    from aitbc_agent_sdk.agent import Agent

    async with Agent(AgentConfig(name="aitbc-cli", blockchain_network="devnet", home=home), account=account) as agent:
        return await work(agent)


def run_as(home: Path, training_id: str, work: Callable[[Agent], Awaitable[T]]) -> T:
    """Unlock the training's wallet and run ``work`` with a devnet agent signing as it."""
    async def go() -> T:
        account, _ = await unlock(home, await wallet_of(home, training_id))
        return await with_agent(home, account, work)
    return asyncio.run(go())


async def wallet_of(home: Path, training_id: str) -> str:
    async with TrainingStore(home / "aitbc.db") as db:
        record = await db.training(training_id)
    if record.wallet is None:
        raise ConfigError(f"training {training_id} has no wallet recorded")
    return record.wallet


def register(app: typer.Typer) -> None:
    """Add the step commands to the ``distributed-training`` app."""
    register_payments(app)
    register_audit(app)

    @app.command()
    def init(
        wallet: Annotated[str, typer.Option(help="the coordinator's wallet (pays the escrow)")],
        model_type: Annotated[str, typer.Option(help="mlp, cnn or transformer")] = "mlp",
        target_workers: Annotated[int, typer.Option(min=1)] = 3,
        dataset_size: Annotated[Optional[int], typer.Option(help="informational, as in the seed")] = None,
        rounds: Annotated[int, typer.Option(min=1)] = 5,
        epochs: Annotated[int, typer.Option(min=1)] = 2,
        batch_size: Annotated[int, typer.Option(min=1)] = 32,
        lr: Annotated[float, typer.Option(min=0.0)] = 1e-2,
        partition: Annotated[str, typer.Option(help="iid or dirichlet")] = "iid",
        seed: Annotated[int, typer.Option()] = 0,
        spares: SparesOption = 0,
        aggregation: AggregationOption = "fedavg",
        heartbeat_timeout: HeartbeatOption = 10.0,
        target_throughput: TargetThroughputOption = None,
        min_workers: MinWorkersOption = 1,
        max_workers: MaxWorkersOption = 64,
        scale_window: ScaleWindowOption = 2,
        home: HomeOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Create a training; nothing is spent yet."""
        root = resolve_home(home)
        from aitbc_agent_sdk.training.models import MODEL_NAMES
        if model_type not in MODEL_NAMES:
            raise ConfigError(f"unknown model {model_type!r}; valid models are {list(MODEL_NAMES)}")
        spec = TrainingSpec(model_type=model_type, target_workers=target_workers, rounds=rounds,
                            dataset_size=dataset_size, partition=partition, seed=seed,  # type: ignore[arg-type]
                            spare_workers=spares, aggregation=aggregation,  # type: ignore[arg-type]
                            faults=FaultPolicy(heartbeat_timeout_s=heartbeat_timeout),
                        elastic=elastic_policy(target_throughput, min_workers, max_workers, scale_window),
                            job=JobConfig(batch_size=batch_size, learning_rate=lr, epochs=epochs))
        address = asyncio.run(wallet_store(root).get(wallet)).address

        async def create() -> TrainingRecord:
            record = TrainingRecord(training_id=new_id("training"), spec=spec, coordinator=address, wallet=wallet)
            async with TrainingStore(root / "aitbc.db") as db:
                await db.save_training(record)
            return record

        record = asyncio.run(create())
        if as_json:
            print_json({"training_id": record.training_id, "status": record.status, "model_type": model_type,
                        "target_workers": target_workers, "coordinator": address})
            return
        console = Console()
        console.print("Distributed training initialized")
        console.print(f"Training ID: {record.training_id}")
        console.print(f"Model Type: {model_type}")
        console.print(f"Dataset Size: {dataset_size if dataset_size is not None else '-'}")
        console.print(f"Target Workers: {target_workers}")
        console.print(f"Status: {record.status}")

    @app.command("upload-data")
    def upload_data(
        training_id: Annotated[str, typer.Option()],
        data_path: Annotated[Path, typer.Option(help=".npz, .pt or .csv file, or 'digits'")],
        label_column: Annotated[Optional[str], typer.Option()] = None,
        home: HomeOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Validate the dataset and store it by CID in the devnet's content store."""
        root = resolve_home(home)
        source: str | Path = data_path if str(data_path) != "digits" else "digits"
        if source != "digits" and not data_path.is_file():
            raise ConfigError(f"dataset file not found: {data_path}")
        from aitbc_agent_sdk.training import load_dataset
        load_dataset(source, label_column=label_column)  # fail before connecting anywhere

        async def upload(agent: Agent) -> str:
            return await agent.upload_training_data(training_id, source, label_column=label_column)

        cid = run_as(root, training_id, upload)
        if as_json:
            print_json({"training_id": training_id, "dataset_cid": cid})
        else:
            Console().print(f"Dataset uploaded: {cid}")

    @app.command("discover-workers")
    def discover_workers(
        training_id: Annotated[str, typer.Option()],
        required_workers: Annotated[int, typer.Option(min=1)],
        min_gpu: Annotated[Optional[str], typer.Option(help="e.g. RTX3090; 'cpu' or omitted accepts any")] = None,
        max_price: Annotated[Optional[Decimal], typer.Option(help="highest price per round, in ETH")] = None,
        home: HomeOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Discover offers, score them, and sign contracts with the best workers."""
        root = resolve_home(home)
        max_wei = int(max_price * 10**18) if max_price is not None else None

        async def hire(agent: Agent) -> list[dict[str, Any]]:
            workers = await agent.discover_gpu_workers(min_gpu=min_gpu, max_price_wei=max_wei)
            if len(workers) < required_workers:
                raise NotEnoughWorkersError(f"asked for {required_workers} workers, {len(workers)} suitable offers")
            from aitbc_agent_sdk.coordinator.reassign import hire as hire_workers
            scores = dict(zip([w.worker_id for w in workers], agent.scoring.score(workers), strict=True))
            record = await agent.coordinator.db.training(training_id)
            ranked = await agent.select_best_workers(workers, required_workers + record.spec.spare_workers)
            by_id = {w.worker_id: w for w in ranked}
            contracts = await hire_workers(agent.coordinator, training_id, ranked[:required_workers],
                                           ranked[required_workers:])
            return [{"worker_id": c.worker_id, "gpu": by_id[c.worker_id].gpu_type, "price_wei": c.price_wei,
                     "reputation": by_id[c.worker_id].reputation, "score": float(scores[c.worker_id]),
                     "contract_id": c.contract_id, "role": c.role} for c in contracts]

        rows = run_as(root, training_id, hire)
        if as_json:
            print_json({"training_id": training_id, "workers": rows})
            return
        table = Table(title=f"Selected {len(rows)} workers")
        for col in ("worker", "role", "hardware", "price/round ETH", "reputation", "score", "contract"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["worker_id"], r["role"], r["gpu"], eth(r["price_wei"]), f"{r['reputation']:.2f}",
                          f"{r['score']:.3f}", r["contract_id"])
        Console().print(table)

    @app.command()
    def distribute(
        training_id: Annotated[str, typer.Option()],
        strategy: Annotated[str, typer.Option(help="only data-parallel (FedAvg) is supported")] = "data-parallel",
        home: HomeOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Fund the escrow, shard the data, and hand the rounds to a detached coordinator daemon."""
        if strategy != "data-parallel":
            raise ConfigError(f"unknown strategy {strategy!r}; supported: data-parallel")
        root = resolve_home(home)
        wallet = asyncio.run(wallet_of(root, training_id))

        async def prepare(agent: Agent) -> tuple[str, int]:
            contracts = await agent.coordinator.db.contracts(training_id, "worker")
            record = await agent.coordinator.db.training(training_id)
            if record.phase != TrainingPhase.INITIALIZING:
                raise ConfigError(f"training {training_id} is already {record.phase.value}")
            if not contracts:
                raise ConfigError("no workers under contract; run discover-workers first")
            if record.dataset_cid is None:
                raise ConfigError("no dataset; run upload-data first")
            await agent.coordinator.check_budget(training_id)  # before anything is written
            await agent.create_data_shards(training_id, len(contracts))
            tx = await agent.fund_escrow(training_id)
            return tx, len(contracts)

        from aitbc_agent_sdk.coordinator.daemon import spawn_coordinator
        account, password = asyncio.run(unlock(root, wallet))
        tx, workers = asyncio.run(with_agent(root, account, prepare))
        proc = spawn_coordinator(root, wallet, password, training_id)
        _wait_until_started(root, training_id, proc.pid)
        if as_json:
            print_json({"training_id": training_id, "escrow_tx": tx, "workers": workers,
                        "coordinator_pid": proc.pid, "log": str(training_dir(root, training_id) / "coordinator.log")})
            return
        Console().print(f"Escrow funded in {tx}; {workers} jobs distributed; coordinator daemon pid {proc.pid} "
                        f"(log: {training_dir(root, training_id) / 'coordinator.log'})")

    @app.command()
    def resume(
        training_id: Annotated[str, typer.Option()],
        home: HomeOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Carry on a funded training whose coordinator died, in a new detached coordinator daemon."""
        from aitbc_agent_sdk.coordinator.daemon import spawn_coordinator
        from aitbc_agent_sdk.coordinator.lock import is_driven
        from aitbc_agent_sdk.coordinator.phases import is_terminal
        root = resolve_home(home)

        async def load() -> TrainingRecord:
            async with TrainingStore(root / "aitbc.db") as db:
                return await db.training(training_id)

        record = asyncio.run(load())
        if is_terminal(record.phase):
            raise ConfigError(f"training {training_id} already ended ({record.phase.value}); nothing to resume")
        if is_driven(root, training_id):
            raise ConfigError(f"training {training_id} already has a running coordinator")
        wallet = asyncio.run(wallet_of(root, training_id))
        _, password = asyncio.run(unlock(root, wallet))
        proc = spawn_coordinator(root, wallet, password, training_id, resume=True)
        _wait_until_driven(root, training_id, proc.pid)
        log = training_dir(root, training_id) / "coordinator.log"
        if as_json:
            print_json({"training_id": training_id, "round": record.round, "phase": record.phase.value,
                        "coordinator_pid": proc.pid, "log": str(log)})
            return
        Console().print(f"Resuming {training_id} after round {record.round} ({record.phase.value}); "
                        f"coordinator daemon pid {proc.pid} (log: {log})")

    @app.command()
    def monitor(
        training_id: Annotated[str, typer.Option()],
        follow: Annotated[bool, typer.Option("--follow", help="refresh until the training ends")] = False,
        interval: Annotated[float, typer.Option(min=0.1)] = 1.0,
        home: HomeOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Each worker's progress, epoch, loss, throughput and status, and each round's accuracy."""
        root = resolve_home(home)
        if as_json:
            while True:
                snap = asyncio.run(_snapshot(root, training_id))
                print_json(snap.model_dump(mode="json"))
                if not follow or snap.finished:
                    return
                time.sleep(interval)
        console = Console()
        snap = asyncio.run(_snapshot(root, training_id))
        if not follow:
            console.print(render_snapshot(snap))
            return
        with Live(render_snapshot(snap), console=console, refresh_per_second=4) as live:
            while not snap.finished:
                time.sleep(interval)
                snap = asyncio.run(_snapshot(root, training_id))
                live.update(render_snapshot(snap))


def register_audit(app: typer.Typer) -> None:
    @app.command()
    def audit(
        training_id: Annotated[str, typer.Option()],
        home: HomeOption = None,
        as_json: JsonOption = False,
        repair: Annotated[bool, typer.Option(
            "--repair", help="cut off a partial last line left by a crash, recording it in the chain "
                             "(the next append does this too); anything else broken is refused")] = False,
    ) -> None:
        """Print the training's hash-chained audit log and verify the chain (exit 1 if it was tampered with)."""
        from aitbc_agent_sdk.audit import AuditEntry, parse_line, repair_log, verify_log

        path = training_dir(resolve_home(home), training_id) / "audit.jsonl"
        if not path.exists():
            raise ConfigError(f"no audit log for {training_id} at {path}")
        if repair:
            repair_log(path)  # AuditLogError (exit 2) when the damage is not a crash's partial line
        result = verify_log(path)
        lines = path.read_bytes().splitlines()[: result.entries]
        entries = [AuditEntry.model_validate(parse_line(line)) for line in lines]
        if as_json:
            print_json({"training_id": training_id, "ok": result.ok, "entries": [e.model_dump() for e in entries],
                        "first_bad_line": result.first_bad_line, "reason": result.reason})
        else:
            table = Table(title=f"audit log of {training_id}")
            for col in ("seq", "time", "event", "details"):
                table.add_column(col)
            for e in entries:
                details = ", ".join(f"{k}={v}" for k, v in e.fields.items())
                table.add_row(str(e.seq), time.strftime("%H:%M:%S", time.localtime(e.ts)), e.event, details)
            console = Console()
            console.print(table)
            console.print("[green]chain verified[/]" if result.ok else
                          f"[red]chain broken at line {result.first_bad_line}: {result.reason}[/]")
        if not result.ok:
            raise typer.Exit(1)


def register_payments(app: typer.Typer) -> None:
    @app.command()
    def payments(
        training_id: Annotated[str, typer.Option()],
        home: HomeOption = None,
        as_json: JsonOption = False,
    ) -> None:
        """Every payment of a training, with its transaction hash, and the escrow's totals."""
        snap = asyncio.run(_snapshot(resolve_home(home), training_id))
        if as_json:
            print_json({"training_id": training_id, "payments": [p.model_dump(mode="json") for p in snap.payments],
                        "escrow": snap.escrow.model_dump(mode="json") if snap.escrow else None})
            return
        table = Table(title=f"Payments of {training_id}")
        for col in ("worker", "amount ETH", "result hash", "tx hash"):
            table.add_column(col)
        for p in snap.payments:
            table.add_row(p.worker_id, eth(p.amount_wei), p.result_hash[:18] + "…", p.tx_hash)
        console = Console()
        console.print(table)
        if snap.escrow is not None:
            console.print(f"escrow {snap.escrow.address}: deposited {eth(snap.escrow.deposited_wei)} ETH, "
                          f"paid {eth(snap.escrow.paid_wei)}, refunded {eth(snap.escrow.refunded_wei)}")


async def _snapshot(home: Path, training_id: str) -> Snapshot:
    async with TrainingStore(home / "aitbc.db") as db:
        return await snapshot(db, training_id, audit_dir=home / "trainings")


def _wait_until_started(home: Path, training_id: str, pid: int, timeout: float = 60.0) -> None:
    """Return once the daemon moved the training on; fail with its log if it died."""
    _wait_for_daemon(lambda: asyncio.run(_snapshot(home, training_id)).phase != TrainingPhase.INITIALIZING,
                     home, training_id, pid, timeout, "start the training")


def _wait_until_driven(home: Path, training_id: str, pid: int, timeout: float = 60.0) -> None:
    """Return once the new daemon holds the training's lock; fail with its log if it died first."""
    from aitbc_agent_sdk.coordinator.lock import is_driven
    _wait_for_daemon(lambda: is_driven(home, training_id), home, training_id, pid, timeout,
                     "take the training over")


def _wait_for_daemon(ready: Callable[[], bool], home: Path, training_id: str, pid: int, timeout: float,
                     what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if not pid_alive(pid):
            log = training_dir(home, training_id) / "coordinator.log"
            raise AitbcError(f"the coordinator daemon exited; last log lines:\n{tail(log)}")
        time.sleep(0.2)
    raise AitbcError(f"the coordinator daemon did not {what} within {timeout:.0f}s")


def render_snapshot(snap: Snapshot) -> Group:
    workers = Table(title=f"{snap.training_id}: {snap.phase.value}, round {snap.round}/{snap.rounds}")
    for col in ("worker", "role", "round", "status", "epoch", "progress", "loss", "samples/s", "paid ETH"):
        workers.add_column(col)
    for w in snap.workers:
        workers.add_row(short(w.worker_id), w.role, str(w.round), w.status, f"{w.epoch}/{w.epochs}",
                        f"{w.progress:.0f}%", f"{w.loss:.4f}" if w.loss is not None else "-",
                        f"{w.samples_per_s:,.0f}" if w.samples_per_s else "-", eth(w.paid_wei))
    target = f", target {snap.target_throughput:,.0f} samples/s" if snap.target_throughput else ""
    rounds = Table(title=f"per round{target}")
    for col in ("round", "test accuracy", "test loss", "pool", "throughput", "vs target"):
        rounds.add_column(col)
    for r in snap.round_metrics:
        ratio = f"{r.throughput / snap.target_throughput:.0%}" if r.throughput and snap.target_throughput else "-"
        rounds.add_row(str(r.round), f"{r.accuracy:.4f}", f"{r.loss:.4f}", str(r.workers),
                       f"{r.throughput:,.0f}/s" if r.throughput else "-", ratio)
    parts: list[Any] = [workers, rounds]
    if snap.events:
        events = Table(title="pool and fault events")
        for col in ("event", "worker", "round", "detail"):
            events.add_column(col)
        for e in snap.events[-12:]:
            detail = e.get("reason") or (f"moved {e['moved']} samples" if "moved" in e else "") or (
                f"throughput {e['throughput']}/s" if "throughput" in e else "")
            events.add_row(e["event"], short(e["worker"]) if e.get("worker") else "-", str(e.get("round", "-")),
                           str(detail)[:70])
        parts.append(events)
    if snap.escrow is not None:
        parts.append(f"escrow {snap.escrow.address}: deposited {eth(snap.escrow.deposited_wei)} ETH, "
                     f"paid {eth(snap.escrow.paid_wei)}, refunded {eth(snap.escrow.refunded_wei)}")
    return Group(*parts)
