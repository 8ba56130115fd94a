"""Measure a task's model footprint in the rehearsal: what :class:`~aitbc_agent_sdk.records.ModelFootprint` declares.

Activations are counted as autograd keeps them: every tensor saved for the backward pass of one
training step, once per storage, parameters excepted. That is the memory a batch costs whatever
the architecture (attention, convolutions, a user's own layers), measured rather than guessed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from aitbc_agent_sdk.records import JobConfig, ModelFootprint
from aitbc_agent_sdk.tasks._task import Batch, TaskParams, TrainingTask


class SavedBytes:
    """Counts the storages autograd saves for backward while installed (one count per storage)."""

    def __init__(self, model: nn.Module) -> None:
        self._skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._seen: set[int] = set()
        self.total = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._skip and key not in self._seen:
            self._seen.add(key)
            self.total += storage.nbytes()
        return tensor

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))


def measure_footprint(task: TrainingTask, model: nn.Module, batch: Batch, params: TaskParams, config: JobConfig,
                      weights_bytes: int) -> ModelFootprint:
    """One training step of ``model`` on ``batch`` (a copy the caller discards), counted."""
    rows = max(len(batch[0]), 1)
    optimizer, _ = task.configure_optimizer(model, params, config, 1)
    counter = SavedBytes(model)
    with counter.hooks():
        loss = task.loss(model, batch, params)
    loss.backward()
    optimizer.step()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return ModelFootprint(parameters=sum(p.numel() for p in model.parameters()), weights_bytes=weights_bytes,
                          parameter_bytes=sum(p.numel() * p.element_size() for p in trainable),
                          optimizer_bytes=_state_bytes(optimizer), activation_bytes=-(-counter.total // rows))
