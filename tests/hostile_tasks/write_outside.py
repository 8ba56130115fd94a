"""Hostile task: plant a file in directories outside its one writable job directory."""

from __future__ import annotations

import os

from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class WriteParams(TaskParams):
    directories: tuple[str, ...] = ()
    marker: str = "planted-by-a-task"


class WriteOutside(TrainingTask):
    name = "hostile-write-outside"
    Params = WriteParams

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, WriteParams)
        written, errors = [], []
        for directory in params.directories:
            path = os.path.join(directory, params.marker)
            try:
                with open(path, "w") as f:
                    f.write("x")
                written.append(path)
            except OSError as exc:
                errors.append(exc)
        if written:
            raise RuntimeError(f"wrote {written}")
        raise errors[0]
