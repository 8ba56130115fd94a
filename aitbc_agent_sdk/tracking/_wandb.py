"""Weights & Biases: one run per training, named and identified by its id (resumed under the same id).

W&B reads its usual variables: ``WANDB_MODE=offline`` keeps the run on disk (``wandb sync`` later),
``WANDB_PROJECT`` names the project (``aitbc`` otherwise), ``WANDB_API_KEY`` logs in.
"""

from __future__ import annotations

import os
from typing import Mapping

import wandb

from ._port import ExperimentRun


class WandbLog:
    def __init__(self, run: ExperimentRun) -> None:
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "aitbc"), name=run.training_id,
                               id=run.training_id, resume="allow", dir=str(run.directory), config=dict(run.config),
                               reinit="create_new")

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()
