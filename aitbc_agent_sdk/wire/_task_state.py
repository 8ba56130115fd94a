"""A task's state between rounds (its optimizer's moments and its scheduler's position) as safetensors.

Kept on the provider when the task sets ``keep_state``: written by the training process at the
end of a job, read back at the start of the same worker's next job of the same training. Tensors
go in the safetensors body, everything else (param groups, step counts, scheduler fields) as JSON
in its metadata, so nothing is ever unpickled.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.wire._checkpoint import decode_metadata, decode_state, encode_state

Scheduler = torch.optim.lr_scheduler.LRScheduler


def split_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """An optimizer's ``state_dict()["state"]`` as tensors named ``index.name`` and the other values by index."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, scalars


def encode_task_state(optimizer: torch.optim.Optimizer, scheduler: Scheduler | None) -> bytes:
    state = optimizer.state_dict()
    tensors, scalars = split_optimizer_state(state)
    metadata = {"kind": "task_state", "param_groups": json.dumps(state["param_groups"]),
                "scalars": json.dumps(scalars),
                "scheduler": json.dumps(scheduler.state_dict() if scheduler is not None else None)}
    return encode_state(tensors, metadata)


def restore_task_state(blob: bytes, optimizer: torch.optim.Optimizer, scheduler: Scheduler | None) -> None:
    """Load what :func:`encode_task_state` wrote into a freshly built optimizer (and scheduler)."""
    tensors, meta = decode_state(blob), decode_metadata(blob)
    try:
        if meta.get("kind") != "task_state":
            raise ValueError("not a task state")
        state: dict[int, dict[str, Any]] = {}
        for index, values in json.loads(meta["scalars"]).items():
            state.setdefault(int(index), {}).update(values)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for key, tensor in tensors.items():
            index, name = key.split(".", 1)
            # Moments have their parameter's shape (torch checks only the parameter count).
            if not 0 <= int(index) < len(params) or (tensor.ndim and tensor.shape != params[int(index)].shape):
                raise ValueError(f"{key} has shape {tuple(tensor.shape)}, not its parameter's")
            state.setdefault(int(index), {})[name] = tensor
        optimizer.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
        saved = json.loads(meta["scheduler"])
        if scheduler is not None and saved is not None:
            scheduler.load_state_dict(saved)
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise TrainingError(f"the task state kept from the last round does not fit this task: {exc}") from exc
