"""Rich rendering: live per-worker progress while training (the final tables are in report_view)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from aitbc_agent_sdk import Payment, RoundMetrics, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.records import Progress as JobProgress
from aitbc_agent_sdk.records import terminal_markup

from .report_view import bytes_text, is_classifier, metric_text, task_metric_names

WEI_PER_ETH = 10**18
PIPE_WIDTH = 1000  # columns when stdout is not a terminal: a table's ids are never cut or wrapped


def output_console() -> Console:
    """stdout's console: the terminal's width on a terminal; in a pipe or a file wide enough for whole ids."""
    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def eth(wei: int) -> str:
    return f"{wei / WEI_PER_ETH:.6f}"


def short(address: str) -> str:
    return f"{address[:8]}…{address[-4:]}"


def round_detail(event: RoundMetrics) -> str:
    """A finished round in a line: accuracy (a classifier's) or the task's metrics, loss, bytes each way."""
    parts = [f"accuracy {event.accuracy:.4f}"] if is_classifier([event]) else [
        f"{terminal_markup(name)} {metric_text(event.metrics[name])}" for name in task_metric_names([event])]
    parts.append(f"val loss {event.loss:.4f}")
    if event.bytes_sent is not None or event.bytes_received is not None:
        parts.append(f"sent {bytes_text(event.bytes_sent)} received {bytes_text(event.bytes_received)}")
    return "  ".join(parts)


class LiveTraining:
    """Observer for the coordinator's events; one bar per worker plus one for the rounds."""

    def __init__(self, console: Console, spec: TrainingSpec) -> None:
        self.spec = spec
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console, transient=False)
        self.rounds: TaskID = self.progress.add_task("rounds", total=spec.rounds, detail="initializing")
        self.workers: dict[str, TaskID] = {}

    def __enter__(self) -> LiveTraining:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def observe(self, event: object) -> None:
        if isinstance(event, JobProgress):
            self._worker(event)
        elif isinstance(event, RoundMetrics):
            self.progress.update(self.rounds, completed=event.round, detail=round_detail(event))
        elif isinstance(event, TrainingPhase):
            self.progress.update(self.rounds, detail=event.value)
        elif isinstance(event, Payment):
            task = self.workers.get(event.worker_id)
            if task is not None:
                self.progress.update(task, detail=f"paid {eth(event.amount_wei)} ETH")

    def _worker(self, p: JobProgress) -> None:
        epochs_total = self.spec.rounds * p.epochs
        if p.worker_id not in self.workers:
            self.workers[p.worker_id] = self.progress.add_task(f"worker {short(p.worker_id)}", total=epochs_total,
                                                               detail="")
        done = (p.round - 1) * p.epochs + p.epoch
        loss = f"loss {p.loss:.4f}" if p.loss is not None else ""
        speed = f"{p.samples_per_s:,.0f} samples/s" if p.samples_per_s else ""
        self.progress.update(self.workers[p.worker_id], completed=done,
                             detail=f"round {p.round} {p.status} {loss} {speed}".strip())


def hiring_warnings(*, asked_workers: int, asked_spares: int, workers: int, spares: int) -> list[str]:
    """One line per role hired short of what was asked (the rest of the market did not qualify)."""
    lines = []
    if workers < asked_workers:
        lines.append(f"asked for {asked_workers} workers, the market has {workers} that "
                     f"{'qualifies' if workers == 1 else 'qualify'}: training with {workers} "
                     f"(see --min-gpu/--min-stake)")
    if spares < asked_spares:
        lines.append(f"asked for {asked_spares} spares, the market has {spares} more that "
                     f"{'qualifies' if spares == 1 else 'qualify'}: training with {spares} "
                     f"spare{'' if spares == 1 else 's'} (see --min-gpu/--min-stake)")
    return lines
