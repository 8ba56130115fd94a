"""The experiment logs' adapters, chosen by name, and the check that each can be opened here."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Iterable

from ..errors import ConfigError
from ._port import ExperimentLog, ExperimentRun


@dataclass(frozen=True)
class _Adapter:
    module: str  # the library that must be importable
    extra: str  # the pip extra that installs it
    open: Callable[[ExperimentRun], ExperimentLog]
    settings: Callable[[], str | None] | None = None  # what else it needs from the environment, if anything


def _tensorboard(run: ExperimentRun) -> ExperimentLog:
    from ._tensorboard import TensorBoardLog
    return TensorBoardLog(run)


def _wandb(run: ExperimentRun) -> ExperimentLog:
    from ._wandb import WandbLog
    return WandbLog(run)


def _mlflow(run: ExperimentRun) -> ExperimentLog:
    from ._mlflow import MlflowLog
    return MlflowLog(run)


def _mlflow_store() -> str | None:
    """MLflow 3 refuses its file store unless asked: without a tracking server, say so before funding."""
    if os.environ.get("MLFLOW_TRACKING_URI") or os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() == "true":
        return None
    return ("--log-to mlflow needs a tracking server: set MLFLOW_TRACKING_URI (or MLFLOW_ALLOW_FILE_STORE=true "
            "for a file store in the training's directory)")


EXPERIMENT_LOGS: dict[str, _Adapter] = {
    "tensorboard": _Adapter("tensorboard", "", _tensorboard),
    "wandb": _Adapter("wandb", "wandb", _wandb),
    "mlflow": _Adapter("mlflow", "mlflow", _mlflow, _mlflow_store),
}


def experiment_log_problems(names: Iterable[str]) -> list[str]:
    """One line per log in ``names`` that cannot be opened here: its library is not installed, no adapter
    serves it, or (MLflow) it has nowhere to write."""
    lines = []
    for name in dict.fromkeys(names):
        adapter = EXPERIMENT_LOGS.get(name)
        if adapter is None:
            lines.append(f"--log-to {name}: no such experiment log (choose from {', '.join(EXPERIMENT_LOGS)})")
        elif importlib.util.find_spec(adapter.module) is None:
            how = f"pip install 'aitbc-agent-sdk[{adapter.extra}]'" if adapter.extra else (
                f"pip install {adapter.module}")
            lines.append(f"--log-to {name} needs the {adapter.module} library, which is not installed: {how}")
        elif adapter.settings is not None and (problem := adapter.settings()) is not None:
            lines.append(problem)
    return lines


def open_experiment_log(name: str, run: ExperimentRun) -> ExperimentLog:
    """Blocking: the ``name`` log of ``run``; ConfigError when its library is missing."""
    if problems := experiment_log_problems([name]):
        raise ConfigError(problems[0])
    return EXPERIMENT_LOGS[name].open(run)
