"""Hostile task: allocate (and touch) memory until something stops it."""

from __future__ import annotations

import torch
from torch import nn

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask


class MemoryParams(TaskParams):
    chunk_bytes: int = 64 << 20
    total_bytes: int = 4 << 30  # the test's own cap: past it the allocation counts as uncontained


class EatMemory(TrainingTask):
    name = "hostile-eat-memory"
    Params = MemoryParams

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, MemoryParams)
        held = []
        while len(held) * params.chunk_bytes < params.total_bytes:
            held.append(torch.ones(params.chunk_bytes, dtype=torch.uint8))  # ones: every page touched
        raise RuntimeError(f"held {len(held) * params.chunk_bytes} bytes unhindered")
