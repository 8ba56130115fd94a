"""TensorBoard event files, written with torch's SummaryWriter under the training's ``tensorboard/``."""

from __future__ import annotations

import json
from typing import Mapping

from torch.utils.tensorboard import SummaryWriter

from ._port import ExperimentRun


class TensorBoardLog:
    def __init__(self, run: ExperimentRun) -> None:
        # A resumed training opens a second writer in the same directory: TensorBoard reads both files as one run.
        self._writer = SummaryWriter(log_dir=str(run.directory / "tensorboard"))
        spec = json.dumps(dict(run.config), indent=2, sort_keys=True, default=str)
        self._writer.add_text("training/spec", f"training `{run.training_id}`\n\n```\n{spec}\n```")

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # a round is minutes apart: make it visible to a TensorBoard reading along

    def close(self) -> None:
        self._writer.close()
