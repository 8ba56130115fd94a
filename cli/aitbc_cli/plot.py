"""Training curves as a PNG (matplotlib, headless)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aitbc_agent_sdk import TrainingReport
from aitbc_agent_sdk.errors import ConfigError

from .report_view import direction, final_text, is_classifier, task_metric_names

BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("bytes", 1))


class PlotPathError(ConfigError):
    """--plot names a place the PNG cannot be written to."""


def plot_report(report: TrainingReport, path: Path) -> None:
    """Write the curves to PATH; PlotPathError (never a traceback) if the file cannot be written."""
    try:
        _plot(report, path)
    except OSError as exc:
        raise PlotPathError(f"cannot write the plot to {path}: {exc.strerror or exc}") from exc


def _plot(report: TrainingReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none needed
    import matplotlib.pyplot as plt

    rounds = list(report.rounds)
    panels = [_score_panel, _loss_panel]
    if any(r.bytes_sent is not None or r.bytes_received is not None for r in rounds):
        panels.append(_bytes_panel)
    if len({r.workers for r in rounds}) > 1:  # the pool changed size: show why (throughput) and what (pool size)
        panels.append(_pool_panel)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for panel, ax in zip(panels, axes[0], strict=True):
        panel(ax, report)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report.training_id}: {final_text(report)}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _score_panel(ax: Any, report: TrainingReport) -> None:
    """A classifier's test accuracy; another task (a regression, a language model): its own metric."""
    rounds = [r.round for r in report.rounds]
    names = task_metric_names(report.rounds, first=report.metric)
    if (report.metric == "accuracy" and is_classifier(report.rounds)) or not names:
        ax.plot(rounds, [r.accuracy for r in report.rounds], marker="o", color="tab:green")
        ax.set(title="Test accuracy of the global model", xlabel="round", ylabel="accuracy")
        return
    name = names[0]
    ax.plot(rounds, [r.metrics.get(name, math.nan) for r in report.rounds], marker="o", color="tab:green")
    ax.set(title=f"Validation {name} of the global model ({direction(report)})", xlabel="round", ylabel=name)


def _loss_panel(ax: Any, report: TrainingReport) -> None:
    rounds = [r.round for r in report.rounds]
    ax.plot(rounds, [r.loss for r in report.rounds], marker="o", color="black", linewidth=2,
            label="global (validation)")
    for worker in report.workers:
        losses = [r.worker_losses.get(worker.address) for r in report.rounds]
        ax.plot(rounds, losses, marker=".", linestyle="--", alpha=0.7, label=f"worker {worker.address[:8]} (train)")
    ax.set(title="Loss per round", xlabel="round", ylabel=report.loss_name)
    ax.legend(fontsize=7)


def _bytes_panel(ax: Any, report: TrainingReport) -> None:
    """Model bytes the coordinator sent the round's jobs and fetched back from the workers."""
    rounds = [r.round for r in report.rounds]
    biggest = max(max(r.bytes_sent or 0, r.bytes_received or 0) for r in report.rounds)
    unit, factor = next(((u, f) for u, f in BYTE_UNITS if biggest >= f), BYTE_UNITS[-1])
    width = 0.4
    ax.bar([x - width / 2 for x in rounds], [(r.bytes_sent or 0) / factor for r in report.rounds], width,
           label="sent", color="tab:blue")
    ax.bar([x + width / 2 for x in rounds], [(r.bytes_received or 0) / factor for r in report.rounds], width,
           label="received", color="tab:orange")
    ax.set(title="Model bytes per round", xlabel="round", ylabel=unit)
    ax.legend(fontsize=7)


def _pool_panel(ax: Any, report: TrainingReport) -> None:
    rounds = [r.round for r in report.rounds]
    ax.plot(rounds, [r.throughput or 0 for r in report.rounds], marker="o", color="tab:blue")
    ax.set(title="Throughput and pool size", xlabel="round", ylabel="samples/s")
    size_ax = ax.twinx()
    size_ax.step(rounds, [r.workers or 0 for r in report.rounds], where="mid", color="tab:orange")
    size_ax.set_ylabel("workers", color="tab:orange")
