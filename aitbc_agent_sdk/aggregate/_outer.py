"""Outer optimizers: how the coordinator turns a round's aggregate into the next global weights. Pure.

``fedavg``: the aggregate is the new model. ``diloco`` (Douillard et al., 2023): the change the
workers made over the round is a pseudo-gradient ``global - aggregate``, applied with SGD and
Nesterov momentum (as ``torch.optim.SGD(nesterov=True, dampening=0)``). Its momentum buffers are
the coordinator's state; they serialize to safetensors bytes so a resumed coordinator keeps them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import torch
from torch import Tensor

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import OuterName
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state


class OuterOptimizer(Protocol):
    def step(self, global_state: Mapping[str, Tensor], aggregate: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The new global weights from this round's global weights and the workers' aggregate."""
        ...

    def state_bytes(self) -> bytes | None:
        """The optimizer's state to persist, or None when it has none (yet)."""
        ...

    def load_state(self, blob: bytes, reference: Mapping[str, Tensor]) -> None:
        """Restore ``state_bytes()``'s output, checked against the model's ``reference`` state."""
        ...


class FedAvgOuter:
    """The aggregate is the new model; nothing to remember."""

    def step(self, global_state: Mapping[str, Tensor], aggregate: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return dict(aggregate)

    def state_bytes(self) -> bytes | None:
        return None

    def load_state(self, blob: bytes, reference: Mapping[str, Tensor]) -> None:
        return None


class NesterovOuter:
    """SGD with Nesterov momentum on the pseudo-gradient ``global - aggregate`` (DiLoCo's outer step)."""

    def __init__(self, lr: float = 0.7, momentum: float = 0.9) -> None:
        if lr <= 0 or not 0 <= momentum < 1:
            raise TrainingError(f"outer lr must be > 0 and momentum in [0, 1); got lr={lr}, momentum={momentum}")
        self.lr, self.momentum = lr, momentum
        self._buffers: dict[str, Tensor] = {}

    def step(self, global_state: Mapping[str, Tensor], aggregate: Mapping[str, Tensor]) -> dict[str, Tensor]:
        new: dict[str, Tensor] = {}
        for key, weights in global_state.items():
            if not weights.is_floating_point():
                new[key] = aggregate[key]  # counters: the workers' own
                continue
            grad = weights.detach().float() - aggregate[key].detach().float()
            buf = self._buffers.get(key)
            buf = grad.clone() if buf is None else buf.mul_(self.momentum).add_(grad)
            self._buffers[key] = buf
            update = grad.add(buf, alpha=self.momentum)
            new[key] = (weights.detach().float() - self.lr * update).to(weights.dtype)
        return new

    def state_bytes(self) -> bytes | None:
        if not self._buffers:
            return None
        return encode_state(self._buffers, {"kind": "outer_state", "outer": "diloco"})

    def load_state(self, blob: bytes, reference: Mapping[str, Tensor]) -> None:
        buffers = decode_state(blob)
        floating = {k for k, v in reference.items() if v.is_floating_point()}
        if set(buffers) != floating:
            raise TrainingError(f"outer momentum keys differ from the model's: {sorted(set(buffers) ^ floating)[:5]}")
        for key, buf in buffers.items():
            if buf.dtype != torch.float32 or buf.shape != reference[key].shape or not bool(torch.isfinite(buf).all()):
                raise TrainingError(f"outer momentum {key!r} is {buf.dtype}{tuple(buf.shape)} or non-finite, "
                                    f"expected float32{tuple(reference[key].shape)}")
        self._buffers = dict(buffers)


OUTER_OPTIMIZERS: dict[str, Callable[[float, float], OuterOptimizer]] = {
    "fedavg": lambda lr, momentum: FedAvgOuter(),
    "diloco": lambda lr, momentum: NesterovOuter(lr, momentum),
}


def outer_for(name: OuterName, lr: float = 0.7, momentum: float = 0.9) -> OuterOptimizer:
    """The outer optimizer called ``name`` (fresh, no state)."""
    try:
        make = OUTER_OPTIMIZERS[name]
    except KeyError:
        raise TrainingError(f"unknown outer optimizer {name!r}; choose from {sorted(OUTER_OPTIMIZERS)}") from None
    return make(lr, momentum)
