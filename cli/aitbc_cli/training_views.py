"""Read-only views of trainings: list, logs, monitor, payments, audit (``sky status/logs``, ``flwr ls/log``).
None of them writes to the home."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.coordinator import Snapshot, snapshot
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.records import RoundMetrics, TrainingCost, VerificationSpend
from aitbc_agent_sdk.records import terminal_markup, visible
from aitbc_agent_sdk.profile import training_dir

from .common import ExitCode, HomeOption, JsonOption, print_json, resolve_home
from .render import output_console, round_detail
from .report_view import cost_line, narrow_table, round_columns, short

# -- which training: an id, or the newest one ------------------------------------------------------

LATEST = "latest"
_WHICH = "the training (training_...); 'latest' or omitted: the newest one in the home"
TrainingRefArgument = Annotated[str, typer.Argument(metavar="TRAINING_ID", help=_WHICH, show_default=False)]
TrainingRefOption = Annotated[str, typer.Option("--training-id", metavar="ID", help=_WHICH)]


class NoTrainingsError(ConfigError):
    """'latest' in a home that has no training yet (exit 2)."""


def newest_training(trainings: Sequence[flow.TrainingSummary]) -> str | None:
    """The id of the most recently created training, None when there is none."""
    return max(trainings, key=lambda t: t.created_at).training_id if trainings else None


def resolve_training_id(home: Path, given: str) -> str:
    """GIVEN, or for 'latest' the newest training of HOME, read from the store ``list`` reads."""
    if given != LATEST:
        return given
    newest = newest_training(asyncio.run(flow.list_trainings(home)))
    if newest is None:
        raise NoTrainingsError(f"no trainings yet in {home}: start one with 'aitbc distributed-training run', "
                               f"or 'aitbc distributed-training init' on a devnet")
    return newest


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
    output_console().print(table)


def logs(
    training_id: TrainingRefArgument = LATEST,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="wait for new lines until the training ends "
                                                                "(Ctrl-C stops watching, not the training)")] = False,
    source: Annotated[str, typer.Option(
        help="auto: the coordinator daemon's log if it has one, else the audit log; or coordinator, audit")] = "auto",
    home: HomeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object: {training_id, source, lines}; with "
                                                         "--follow one object per line as it comes (JSON Lines)")
                       ] = False,
) -> None:
    """Print a training's log: the coordinator daemon's, or its audit log one readable line per event.

    Example: aitbc distributed-training logs training_0123456789abcdef --follow
    """
    if source not in ("auto", "coordinator", "audit"):
        raise typer.BadParameter(f"{source!r} is not one of auto, coordinator, audit", param_hint="--source")
    root = resolve_home(home)
    training_id = resolve_training_id(root, training_id)
    kind = flow.log_file(root, training_id, source)[1]  # type: ignore[arg-type]
    lines: list[dict[str, Any]] = []

    async def show() -> None:
        async for raw in flow.log_lines(root, training_id, source, follow=follow, raw=True):  # type: ignore[arg-type]
            line = log_line_json(raw, kind)
            if not as_json:
                typer.echo(visible(line["line"]))  # the log holds workers' reasons
            elif follow:
                print_json({"training_id": training_id, "source": kind, **line})
            else:
                lines.append(line)

    try:
        asyncio.run(show())
    except KeyboardInterrupt:
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if as_json and not follow:
        print_json({"training_id": training_id, "source": kind, "lines": lines})


def log_line_json(raw: str, kind: str) -> dict[str, Any]:
    """A log line for --json: its readable text, and for an audit line the entry itself (None if damaged)."""
    if kind != "audit":
        return {"line": raw}
    try:
        entry = json.loads(raw)
    except ValueError:
        entry = None
    return {"line": flow.audit_text(raw), "entry": entry if isinstance(entry, dict) else None}


def monitor(
    training_id: TrainingRefOption = LATEST,
    follow: Annotated[bool, typer.Option("--follow", help="refresh until the training ends; in a pipe or with "
                                                          "--json one line (JSON object) per event as it happens")
                      ] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes with --follow")] = 1.0,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Each worker's progress, epoch, loss, throughput and status; each round's validation loss and model bytes.

    A round shows the task's own metrics with its validation loss (accuracy for a classifier, perplexity for a language model) and the model bytes the coordinator sent to its jobs and received back.

    Example: aitbc distributed-training monitor --training-id training_... --follow
    """
    root = resolve_home(home)
    training_id = resolve_training_id(root, training_id)
    if follow and (as_json or not sys.stdout.isatty()):
        console = Console(soft_wrap=True, highlight=False)
        follow_events(lambda: asyncio.run(_snapshot(root, training_id)), interval,
                      print_json if as_json else lambda event: console.print(event_line(event)))
        return
    snap = asyncio.run(_snapshot(root, training_id))
    if as_json:
        print_json(snap.model_dump(mode="json"))
        return
    console = output_console()
    if not follow:
        console.print(render_snapshot(snap))
        return
    with Live(render_snapshot(snap), console=console, refresh_per_second=4) as live:
        while not snap.finished:
            time.sleep(interval)
            snap = asyncio.run(_snapshot(root, training_id))
            live.update(render_snapshot(snap))


def payments(training_id: TrainingRefOption = LATEST, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Every payment of a training, with its transaction hash, and the escrow's totals.

    Example: aitbc distributed-training payments --training-id training_... --json
    """
    root = resolve_home(home)
    training_id = resolve_training_id(root, training_id)
    snap = asyncio.run(_snapshot(root, training_id))
    if as_json:
        print_json({"training_id": training_id, "payments": [p.model_dump(mode="json") for p in snap.payments],
                    "escrow": snap.escrow.model_dump(mode="json") if snap.escrow else None})
        return
    table = narrow_table(f"Payments of {training_id}", "worker", "amount ETH", "result hash", "tx hash",
                         right=("amount ETH",))
    for p in snap.payments:
        table.add_row(terminal_markup(short(p.worker_id)), flow.eth_text(p.amount_wei),
                      terminal_markup(short(p.result_hash, 10)), terminal_markup(short(p.tx_hash, 10, 8)))
    console = output_console()
    console.print(table)
    if snap.escrow is not None:
        console.print(_escrow_line(snap))


def audit(
    training_id: TrainingRefOption = LATEST,
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

    root = resolve_home(home)
    training_id = resolve_training_id(root, training_id)
    path = training_dir(root, training_id) / "audit.jsonl"
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
        console = output_console()
        console.print(table)
        console.print("[green]chain verified[/]" if result.ok else
                      f"[red]chain broken at line {result.first_bad_line}: {terminal_markup(result.reason)}[/]")
    if not result.ok:
        raise typer.Exit(ExitCode.FAILED)


async def _snapshot(home: Path, training_id: str) -> Snapshot:
    from aitbc_agent_sdk.coordinator import TrainingDatabase

    await flow.load_training(home, training_id)  # no database yet: say so, do not create one
    async with TrainingDatabase(flow.db_path(home)) as db:
        return await snapshot(db, training_id, audit_dir=home / "trainings")


def verification_line(spend: VerificationSpend) -> str:
    """What the spot checks so far cost: this machine's seconds against the checked jobs' training, and the
    verifiers' reports apart."""
    ratio = "" if spend.ratio is None else f" ({spend.ratio:.2f}x)"
    market = (f"; {spend.on_market} re-executed by verifiers ({spend.verifier_reports} reports)"
              if spend.on_market else "")
    return (f"verification: {spend.checks} spot checks, {spend.failed} failed; {spend.coordinator_seconds:.1f} s "
            f"re-executing here for {spend.checked_training_seconds:.1f} s of checked training{ratio}{market}; "
            f"verifiers paid {flow.eth_text(spend.verifier_wei)} ETH")


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
            # The audit log's fields are other parties' words (a worker's error as the reason): cut, then escaped.
            worker = short(str(e["worker"])) if e.get("worker") else "-"
            events.add_row(terminal_markup(e["event"]), terminal_markup(worker), terminal_markup(e.get("round", "-")),
                           terminal_markup(_event_detail(e)[:70]))
        parts.append(events)
    if snap.failure is not None:  # the coordinator's words about other parties: escaped
        parts.append(f"[red]failed: {terminal_markup(snap.failure[:300])}[/]")
    if snap.escrow is not None:
        parts.append(_escrow_line(snap))
    if snap.cost is not None and snap.cost.spent_wei:
        parts.append(cost_line(snap.cost))
    if snap.verification is not None:
        parts.append(verification_line(snap.verification))
    return Group(*parts)


def _event_detail(e: dict[str, Any]) -> str:
    """What a pool or fault event from the audit log says, in a few words."""
    return str(e.get("reason") or (f"moved {e['moved']} samples" if "moved" in e else "") or (
        f"throughput {e['throughput']}/s" if "throughput" in e else "") or (
        f"segments {e['segments']} re-executed: passed" if e.get("passed") else "") or (
        f"{flow.eth_text(int(e['amount_wei']))} ETH for {e.get('reports')} verifications"
        if e.get("event") == "verifiers_paid" and isinstance(e.get("amount_wei"), int) else ""))


# -- monitor --follow in a pipe: one line (or JSON object) per event ------------------------------

_WORKER_STEP = ("round", "status", "epoch")  # a worker's progress worth a line


def snapshot_events(before: Snapshot | None, after: Snapshot) -> list[dict[str, Any]]:
    """What happened between two snapshots of a training, oldest kind first, as JSON-ready records with an
    ``event`` key: phase, round (a finished round's metrics), worker (a step of its job), payment, and the
    audit log's pool and fault events under their own names. BEFORE None: everything so far."""
    out: list[dict[str, Any]] = []
    if before is None or before.phase != after.phase:
        out.append({"event": "phase", "training_id": after.training_id, "phase": after.phase.value,
                    "round": after.round, "rounds": after.rounds})
    done = {r.round for r in before.round_metrics} if before else set()
    out += [{"event": "round", "rounds": after.rounds, **r.model_dump(mode="json")}
            for r in after.round_metrics if r.round not in done]
    seen = {w.worker_id: tuple(getattr(w, f) for f in _WORKER_STEP) for w in before.workers} if before else {}
    out += [{"event": "worker", **w.model_dump(mode="json")} for w in after.workers
            if seen.get(w.worker_id) != tuple(getattr(w, f) for f in _WORKER_STEP)]
    out += [{"event": "payment", **p.model_dump(mode="json")}
            for p in after.payments[len(before.payments) if before else 0:]]
    out += [dict(e) for e in after.events[len(before.events) if before else 0:]]
    return out


def event_line(event: dict[str, Any]) -> str:
    """One event as a line of rich markup; other parties' words are escaped."""
    kind = event["event"]
    if kind == "phase":
        return f"{terminal_markup(event['training_id'])}: {event['phase']}, round {event['round']}/{event['rounds']}"
    if kind == "round":
        metrics = RoundMetrics.model_validate({k: v for k, v in event.items() if k in RoundMetrics.model_fields})
        return f"round {event['round']}/{event['rounds']}: {round_detail(metrics)}"
    if kind == "worker":
        loss = f" loss {event['loss']:.4f}" if event.get("loss") is not None else ""
        speed = f" {event['samples_per_s']:,.0f} samples/s" if event.get("samples_per_s") else ""
        return (f"worker {terminal_markup(short(event['worker_id']))} round {event['round']} "
                f"{terminal_markup(event['status'])} epoch {event['epoch']}/{event['epochs']}{loss}{speed}")
    if kind == "payment":
        return (f"paid {flow.eth_text(int(event['amount_wei']))} ETH to {terminal_markup(short(event['worker_id']))} "
                f"(tx {terminal_markup(short(event['tx_hash'], 10, 8))})")
    if kind == "finished":
        return f"{terminal_markup(event['training_id'])} ended: {event['phase']} after round {event['round']}"
    worker = f" worker {short(str(event['worker']))}" if event.get("worker") else ""
    where = f" round {event['round']}" if "round" in event else ""
    detail = _event_detail(event)
    return terminal_markup(f"{kind}{worker}{where}{': ' + detail[:200] if detail else ''}")


def follow_events(read: Callable[[], Snapshot], interval: float, emit: Callable[[dict[str, Any]], None]) -> Snapshot:
    """Emit each event as it happens until the training ends, then ``finished`` with the last snapshot."""
    before: Snapshot | None = None
    while True:
        after = read()
        for event in snapshot_events(before, after):
            emit(event)
        if after.finished:
            emit({"event": "finished", **after.model_dump(mode="json")})
            return after
        before = after
        time.sleep(interval)


def register(app: typer.Typer) -> None:
    app.command("list")(list_trainings)
    app.command()(logs)
    app.command()(monitor)
    app.command()(payments)
    app.command()(audit)
