"""Read-only views of trainings: list, logs, monitor, payments, audit (``sky status/logs``, ``flwr ls/log``).
None of them writes to the home."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.coordinator.monitor import Snapshot, snapshot
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.models.inert import terminal_markup, visible
from aitbc_agent_sdk.profile import training_dir

from .common import ExitCode, HomeOption, JsonOption, print_json, resolve_home
from .report_view import narrow_table, round_columns, short
from .training_options import TrainingIdArgument, TrainingIdOption


def list_trainings(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Every training under the home, newest first: phase, round, workers, and whether a coordinator drives it.

    Example: aitbc distributed-training list --json
    """
    rows = asyncio.run(flow.list_trainings(resolve_home(home)))
    if as_json:
        print_json({"trainings": [r.__dict__ for r in rows]})
        return
    table = narrow_table(f"{len(rows)} trainings", "training", "model", "phase", "round", "workers", "driven",
                         "created", right=("round", "workers"))
    for r in rows:
        created = datetime.fromtimestamp(r.created_at).strftime("%m-%d %H:%M")
        table.add_row(terminal_markup(r.training_id), terminal_markup(r.model_type), terminal_markup(r.phase),
                      f"{r.round}/{r.rounds}",
                      f"{r.workers}/{r.target_workers}", "yes" if r.driven else "no", created)
    Console().print(table)


def logs(
    training_id: TrainingIdArgument,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="wait for new lines until the training ends "
                                                                "(Ctrl-C stops watching, not the training)")] = False,
    source: Annotated[str, typer.Option(
        help="auto: the coordinator daemon's log if it has one, else the audit log; or coordinator, audit")] = "auto",
    home: HomeOption = None,
) -> None:
    """Print a training's log: the coordinator daemon's, or its audit log one readable line per event.

    Example: aitbc distributed-training logs training_0123456789abcdef --follow
    """
    if source not in ("auto", "coordinator", "audit"):
        raise typer.BadParameter(f"{source!r} is not one of auto, coordinator, audit", param_hint="--source")
    root = resolve_home(home)

    async def show() -> None:
        async for line in flow.log_lines(root, training_id, source, follow=follow):  # type: ignore[arg-type]
            typer.echo(visible(line))  # the log holds workers' reasons

    try:
        asyncio.run(show())
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None


def monitor(
    training_id: TrainingIdOption,
    follow: Annotated[bool, typer.Option("--follow", help="refresh until the training ends")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes with --follow")] = 1.0,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Each worker's progress, epoch, loss, throughput and status; each round's validation loss and model bytes.

    A round shows the task's own metrics with its validation loss (accuracy for a classifier, perplexity for a language model) and the model bytes the coordinator sent to its jobs and received back.

    Example: aitbc distributed-training monitor --training-id training_... --follow
    """
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


def payments(training_id: TrainingIdOption, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Every payment of a training, with its transaction hash, and the escrow's totals.

    Example: aitbc distributed-training payments --training-id training_... --json
    """
    snap = asyncio.run(_snapshot(resolve_home(home), training_id))
    if as_json:
        print_json({"training_id": training_id, "payments": [p.model_dump(mode="json") for p in snap.payments],
                    "escrow": snap.escrow.model_dump(mode="json") if snap.escrow else None})
        return
    table = narrow_table(f"Payments of {training_id}", "worker", "amount ETH", "result hash", "tx hash",
                         right=("amount ETH",))
    for p in snap.payments:
        table.add_row(terminal_markup(short(p.worker_id)), flow.eth_text(p.amount_wei),
                      terminal_markup(short(p.result_hash, 10)), terminal_markup(short(p.tx_hash, 10, 8)))
    console = Console()
    console.print(table)
    if snap.escrow is not None:
        console.print(_escrow_line(snap))


def audit(
    training_id: TrainingIdOption,
    home: HomeOption = None,
    as_json: JsonOption = False,
    repair: Annotated[bool, typer.Option(
        "--repair", help="cut off a partial last line left by a crash, recording it in the chain "
                         "(the next append does this too); anything else broken is refused")] = False,
) -> None:
    """Print the training's hash-chained audit log and verify the chain (exit 1 if it was tampered with).

    Example: aitbc distributed-training audit --training-id training_... --json
    """
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
        table = narrow_table(f"audit log of {terminal_markup(training_id)}", "seq", "time", "event", "details",
                             right=("seq",))
        table.columns[-1].no_wrap = False
        for e in entries:
            details = ", ".join(f"{k}={v}" for k, v in e.fields.items())
            table.add_row(str(e.seq), time.strftime("%H:%M:%S", time.localtime(e.ts)), terminal_markup(e.event),
                          terminal_markup(details))
        console = Console()
        console.print(table)
        console.print("[green]chain verified[/]" if result.ok else
                      f"[red]chain broken at line {result.first_bad_line}: {terminal_markup(result.reason)}[/]")
    if not result.ok:
        raise typer.Exit(ExitCode.FAILED)


async def _snapshot(home: Path, training_id: str) -> Snapshot:
    from aitbc_agent_sdk.coordinator.store import TrainingStore

    await flow.load_training(home, training_id)  # no database yet: say so, do not create one
    async with TrainingStore(flow.db_path(home)) as db:
        return await snapshot(db, training_id, audit_dir=home / "trainings")


def _escrow_line(snap: Snapshot) -> str:
    assert snap.escrow is not None
    return (f"escrow {short(snap.escrow.address)}: deposited {flow.eth_text(snap.escrow.deposited_wei)} ETH, "
            f"paid {flow.eth_text(snap.escrow.paid_wei)}, refunded {flow.eth_text(snap.escrow.refunded_wei)}")


def render_snapshot(snap: Snapshot) -> Group:
    workers = narrow_table(f"{terminal_markup(snap.training_id)}: {snap.phase.value}, round {snap.round}/{snap.rounds}",
                           "worker",
                           "role", "round", "status", "epoch", "done", "loss", "samples/s", "paid ETH",
                           right=("round", "epoch", "done", "loss", "samples/s", "paid ETH"))
    for w in snap.workers:
        workers.add_row(terminal_markup(short(w.worker_id)), terminal_markup(w.role), str(w.round),
                        terminal_markup(w.status), f"{w.epoch}/{w.epochs}",
                        f"{w.progress:.0f}%", f"{w.loss:.4f}" if w.loss is not None else "-",
                        f"{w.samples_per_s:,.0f}" if w.samples_per_s else "-", flow.eth_text(w.paid_wei))
    target = f", target {snap.target_throughput:,.0f} samples/s" if snap.target_throughput else ""
    measures = round_columns(snap.round_metrics)
    names = [name for name, _ in measures]
    rounds = narrow_table(f"per round{target}", "round", *names, "pool", "throughput", "vs target",
                          right=("round", *names, "pool", "throughput", "vs target"))
    for r in snap.round_metrics:
        ratio = f"{r.throughput / snap.target_throughput:.0%}" if r.throughput and snap.target_throughput else "-"
        rounds.add_row(str(r.round), *(cell(r) for _, cell in measures), str(r.workers),
                       f"{r.throughput:,.0f}/s" if r.throughput else "-", ratio)
    parts: list[Any] = [workers, rounds]
    if snap.events:
        events = narrow_table("pool and fault events", "event", "worker", "round", "detail")
        events.columns[-1].no_wrap = False
        for e in snap.events[-12:]:
            detail = e.get("reason") or (f"moved {e['moved']} samples" if "moved" in e else "") or (
                f"throughput {e['throughput']}/s" if "throughput" in e else "") or (
                f"segments {e['segments']} re-executed: passed" if e.get("passed") else "")
            # The audit log's fields are other parties' words (a worker's error as the reason): cut, then escaped.
            worker = short(str(e["worker"])) if e.get("worker") else "-"
            events.add_row(terminal_markup(e["event"]), terminal_markup(worker), terminal_markup(e.get("round", "-")),
                           terminal_markup(str(detail)[:70]))
        parts.append(events)
    if snap.escrow is not None:
        parts.append(_escrow_line(snap))
    return Group(*parts)


def register(app: typer.Typer) -> None:
    app.command("list")(list_trainings)
    app.command()(logs)
    app.command()(monitor)
    app.command()(payments)
    app.command()(audit)
