"""Training curves as a PNG (matplotlib, headless)."""

from __future__ import annotations

import os
from pathlib import Path

from aitbc_agent_sdk import TrainingReport
from aitbc_agent_sdk.errors import ConfigError


class PlotPathError(ConfigError):
    """--plot names a place the PNG cannot be written to."""


def check_plot_path(path: Path) -> Path:
    """PATH if a PNG can be written there (its nearest existing parent is a writable directory);
    PlotPathError otherwise. Call it before anything is paid, so a bad --plot costs nothing."""
    if path.is_dir():
        raise PlotPathError(f"--plot {path} is a directory: name the PNG file to write")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise PlotPathError(f"--plot {path} is not writable")
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PlotPathError(f"--plot {path}: cannot create it under {parent} (not a writable directory)")
    return path


def plot_report(report: TrainingReport, path: Path) -> None:
    """Write the curves to PATH; PlotPathError (never a traceback) if the file cannot be written."""
    try:
        _plot(report, path)
    except OSError as exc:
        raise PlotPathError(f"cannot write the plot to {path}: {exc.strerror or exc}") from exc


def _plot(report: TrainingReport, path: Path) -> None:
    # Long because: one figure, its two or three panels laid out in order.
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none needed
    import matplotlib.pyplot as plt

    rounds = [r.round for r in report.rounds]
    elastic = len({r.workers for r in report.rounds}) > 1
    fig, axes = plt.subplots(1, 3 if elastic else 2, figsize=(16 if elastic else 11, 4.2))
    acc_ax, loss_ax = axes[0], axes[1]
    acc_ax.plot(rounds, [r.accuracy for r in report.rounds], marker="o", color="tab:green")
    acc_ax.set(title="Test accuracy of the global model", xlabel="round", ylabel="accuracy")
    acc_ax.grid(alpha=0.3)
    loss_ax.plot(rounds, [r.loss for r in report.rounds], marker="o", color="black", linewidth=2, label="global (test)")
    for worker in report.workers:
        losses = [r.worker_losses.get(worker.address) for r in report.rounds]
        loss_ax.plot(rounds, losses, marker=".", linestyle="--", alpha=0.7,
                     label=f"worker {worker.address[:8]} (train)")
    loss_ax.set(title="Loss per round", xlabel="round", ylabel="cross-entropy")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend(fontsize=7)
    if elastic:  # the pool changed size: show why (throughput) and what (pool size)
        pool_ax = axes[2]
        pool_ax.plot(rounds, [r.throughput or 0 for r in report.rounds], marker="o", color="tab:blue")
        pool_ax.set(title="Throughput and pool size", xlabel="round", ylabel="samples/s")
        size_ax = pool_ax.twinx()
        size_ax.step(rounds, [r.workers or 0 for r in report.rounds], where="mid", color="tab:orange")
        size_ax.set_ylabel("workers", color="tab:orange")
        pool_ax.grid(alpha=0.3)
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(f"{report.training_id}: final accuracy {report.final_accuracy:.4f}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
