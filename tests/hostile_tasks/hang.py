"""Hostile task: never return from build_model (the job would hold its slot forever)."""

from __future__ import annotations

import threading

from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class Hang(TrainingTask):
    name = "hostile-hang"

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        threading.Event().wait()  # forever, without burning CPU
        raise AssertionError("unreachable")
