"""The experiment-log port: what a log is opened with, and what it is asked to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol


@dataclass(frozen=True)
class ExperimentRun:
    """What every experiment log is opened with: a name, a directory of its own, the hyperparameters."""

    training_id: str
    directory: Path  # the training's directory; each adapter writes below it (or where its library is told to)
    config: Mapping[str, Any] = field(default_factory=dict)  # the spec, flattened to "job.epochs": 3 style keys


class ExperimentLog(Protocol):
    """Blocking, as the libraries are: the coordinator calls these from a worker thread."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...
