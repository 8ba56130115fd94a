"""Hostile task: fork until something stops it; every child leaves its session and sleeps."""

from __future__ import annotations

import os

from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class ForkParams(TaskParams):
    marker: str = "86399.5"  # each child becomes `sleep MARKER`, so survivors can be found on the host
    forks: int = 2000  # the test's own cap: past it the bomb counts as unbounded


class ForkBomb(TrainingTask):
    name = "hostile-fork-bomb"
    Params = ForkParams

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, ForkParams)
        for started in range(params.forks):
            try:
                pid = os.fork()
            except OSError as exc:
                raise OSError(exc.errno, f"fork bomb stopped after {started} processes: {exc.strerror}") from exc
            if pid == 0:
                try:
                    os.setsid()  # out of the worker's process group
                    os.execv("/bin/sleep", ["sleep", params.marker])
                finally:
                    os._exit(1)
        raise RuntimeError(f"fork bomb unbounded: {params.forks} processes started")
