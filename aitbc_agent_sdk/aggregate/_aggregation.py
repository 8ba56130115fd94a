"""Aggregation strategies: pure math over state dicts, no I/O.

The coordinator calls ``begin()``, then ``accumulate()`` once per checkpoint as
it arrives, then ``result()``. ``FedAvg`` keeps only a running weighted sum, so
peak memory is about two models (the sum plus the checkpoint being folded in)
however many workers report. ``weighted_average`` is the plain stack-all-K
version: the test oracle and the benchmark baseline.

Dtype rules (shared by both):
- floating tensors are averaged; float16/bfloat16/float32 accumulate in float32,
  float64 in float64, and the result is cast back to the input dtype. float32
  accumulation of K weighted terms has relative error ~K * 6e-8, far below
  training noise, whereas float64 would add a third model's worth of memory
  and double the bytes written per fold.
- integer and bool tensors (e.g. BatchNorm's ``num_batches_tracked``) are
  counters or flags, not weights: averaging them is meaningless, so the result
  is the element-wise max.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import torch

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def _spec(state: Mapping[str, torch.Tensor]) -> Spec:
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


def _check_same(expected: Spec, state: Mapping[str, torch.Tensor]) -> None:
    """Raise ValueError naming the first key whose presence, shape or dtype differs."""
    missing = sorted(expected.keys() - state.keys())
    extra = sorted(state.keys() - expected.keys())
    if missing or extra:
        raise ValueError(f"state keys differ: missing {missing}, unexpected {extra}")
    for key, (shape, dtype) in expected.items():
        t = state[key]
        if tuple(t.shape) != shape:
            raise ValueError(f"key {key!r}: shape {tuple(t.shape)} != expected {shape}")
        if t.dtype != dtype:
            raise ValueError(f"key {key!r}: dtype {t.dtype} != expected {dtype}")


def _check_weight(weight: float) -> float:
    w = float(weight)
    if not math.isfinite(w) or w < 0:
        raise ValueError(f"weight must be finite and >= 0, got {weight!r}")
    return w


def _averaged(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class AggregationStrategy(ABC):
    """Fold client states into one. Implementations are pure and hold no I/O."""

    @abstractmethod
    def begin(self) -> None:
        """Forget everything accumulated so far (start of a round)."""

    @abstractmethod
    def accumulate(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        """Fold in one client's state with a non-negative weight."""

    @abstractmethod
    def result(self) -> dict[str, torch.Tensor]:
        """The aggregate; ValueError if nothing was accumulated or weights sum to 0."""


class FedAvg(AggregationStrategy):
    """Streaming weighted mean: memory ~ 2 models regardless of the number of clients."""

    def __init__(self) -> None:
        self.begin()

    def begin(self) -> None:
        self._spec: Spec | None = None
        self._acc: dict[str, torch.Tensor] = {}
        self._total = 0.0
        self._count = 0

    @property
    def count(self) -> int:
        """How many states have been accumulated since ``begin()``."""
        return self._count

    def accumulate(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        w = _check_weight(weight)
        if self._spec is None:
            self._spec = _spec(state)
            # First state: one private copy per tensor becomes the running sum.
            for key, t in state.items():
                t = t.detach()
                if _averaged(t.dtype):
                    self._acc[key] = t.to(_acc_dtype(t.dtype), copy=True).mul_(w)
                else:
                    self._acc[key] = t.clone()
        else:
            _check_same(self._spec, state)
            for key, t in state.items():
                acc = self._acc[key]
                if _averaged(t.dtype):
                    acc.add_(t.detach(), alpha=w)  # in place: no temporary the size of t
                else:
                    torch.maximum(acc, t.detach(), out=acc)
        self._total += w
        self._count += 1

    def result(self) -> dict[str, torch.Tensor]:
        if self._spec is None:
            raise ValueError("FedAvg.result() called before any state was accumulated")
        if self._total <= 0:
            raise ValueError(f"FedAvg weights sum to {self._total}; cannot average")
        out: dict[str, torch.Tensor] = {}
        for key, (_, dtype) in self._spec.items():
            acc = self._acc[key]
            out[key] = (acc / self._total).to(dtype) if _averaged(dtype) else acc.clone()
        return out


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """Reference FedAvg: stack all K states per key, then one weighted sum (O(K) memory)."""
    if len(states) == 0:
        raise ValueError("weighted_average needs at least one state")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    ws = [_check_weight(w) for w in weights]
    total = sum(ws)
    if total <= 0:
        raise ValueError(f"weights sum to {total}; cannot average")
    spec = _spec(states[0])
    for s in states[1:]:
        _check_same(spec, s)

    out: dict[str, torch.Tensor] = {}
    for key, (shape, dtype) in spec.items():
        if not _averaged(dtype):
            out[key] = torch.stack([s[key] for s in states]).amax(dim=0)
            continue
        acc_dtype = _acc_dtype(dtype)
        stacked = torch.stack([s[key].detach().to(acc_dtype) for s in states])
        coeffs = torch.tensor(ws, dtype=acc_dtype).div_(total).reshape(-1, *([1] * len(shape)))
        out[key] = (stacked * coeffs).sum(dim=0).to(dtype)
    return out


def sample_weights(samples: Sequence[int]) -> list[float]:
    """FedAvg weights proportional to each client's sample count, summing to 1."""
    if len(samples) == 0:
        raise ValueError("sample_weights needs at least one count")
    if any(s < 0 for s in samples):
        raise ValueError(f"sample counts must be >= 0, got {list(samples)}")
    total = sum(samples)
    if total == 0:
        raise ValueError("sample counts sum to 0")
    return [s / total for s in samples]
