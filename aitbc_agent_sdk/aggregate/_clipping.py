"""Norm clipping: bound each update's L2 norm, then hand the clipped states to an inner strategy.

The dtype and weight rules are those of ``_aggregation.py`` and ``_robust.py``; the buffered form
(``max_norm=None``) keeps the states in ``robust``'s flat layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from aitbc_agent_sdk.aggregate._aggregation import (
    AggregationStrategy,
    FedAvg,
    _acc_dtype,
    _averaged,
    _check_same,
    _check_weight,
    _spec,
)
from aitbc_agent_sdk.aggregate._robust import _Layout, median_rows

__all__ = ["NormClipping"]


class NormClipping(AggregationStrategy):
    """Clip each update to a norm bound, then hand the clipped states to ``inner`` (FedAvg by default).

    The update of a state is ``state - reference`` over the floating keys, where ``reference``
    is the global state the round started from; its norm is the L2 norm over all of them.
    An update longer than the bound is scaled down to exactly the bound; integer buffers pass
    through unchanged. ``inner`` receives ``reference + clipped update`` with the original
    weight, so with FedAvg the result is reference + weighted mean of the clipped updates.

    ``max_norm`` given: streams. Memory is the reference copy, inner's own (2 models for
    FedAvg) and one clipped copy while a clipped state is folded in, whatever the number of
    clients. ``max_norm=None``: the bound is the median norm of the round's positive-weight
    updates, which is only known at the end, so every state is buffered as in
    ``CoordinateMedian`` (K x P elements) and replayed into ``inner`` by ``result()``.
    """

    def __init__(
        self,
        reference: Mapping[str, torch.Tensor],
        *,
        max_norm: float | None = None,
        inner: AggregationStrategy | None = None,
    ) -> None:
        if max_norm is not None:
            bound = float(max_norm)
            if not math.isfinite(bound) or bound <= 0:
                raise ValueError(f"max_norm must be finite and > 0 (or None), got {max_norm!r}")
            max_norm = bound
        self.max_norm = max_norm
        self.inner = inner if inner is not None else FedAvg()
        self._ref = {k: t.detach().clone() for k, t in reference.items()}
        self._ref_spec = _spec(self._ref)
        self._layout = _Layout(self._ref_spec)
        self.begin()

    def begin(self) -> None:
        self.inner.begin()
        self._pending: list[tuple[torch.Tensor, dict[str, torch.Tensor], float, float]] = []
        self.bound: float | None = self.max_norm

    def accumulate(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        w = _check_weight(weight)
        _check_same(self._ref_spec, state)
        norm = self._update_norm(state)
        if self.max_norm is not None:
            self.inner.accumulate(self._clipped(state, norm, self.max_norm), w)
            return
        discrete = {k: t.detach().clone() for k, t in state.items() if not _averaged(t.dtype)}
        self._pending.append((self._layout.flatten(state), discrete, norm, w))

    def result(self) -> dict[str, torch.Tensor]:
        if self.max_norm is None:
            if not self._pending:
                raise ValueError("NormClipping.result() called before any state was accumulated")
            norms = [n for _, _, n, w in self._pending if w > 0] or [n for _, _, n, _ in self._pending]
            self.bound = float(median_rows(torch.tensor(norms, dtype=torch.float64)))
            self.inner.begin()
            for flat, discrete, norm, w in self._pending:
                self.inner.accumulate(self._clipped(self._unflatten(flat, discrete), norm, self.bound), w)
        return self.inner.result()

    def _update_norm(self, state: Mapping[str, torch.Tensor]) -> float:
        total = 0.0
        for key in self._layout.slots:
            diff = state[key].detach().to(torch.float64) - self._ref[key].to(torch.float64)
            total += float(diff.square_().sum())
        return math.sqrt(total)

    def _clipped(self, state: Mapping[str, torch.Tensor], norm: float, bound: float) -> Mapping[str, torch.Tensor]:
        if not (math.isfinite(norm) and norm > bound):
            # Within the bound, or non-finite (no scale fixes inf/NaN): left for a robust inner to reject.
            return {k: (t.to(self._ref[k].dtype) if _averaged(self._ref[k].dtype) else t) for k, t in state.items()}
        scale = bound / norm
        out: dict[str, torch.Tensor] = {}
        for key, t in state.items():
            ref = self._ref[key]
            if not _averaged(ref.dtype):
                out[key] = t
                continue
            acc = _acc_dtype(ref.dtype)
            r = ref.to(acc)
            out[key] = (t.detach().to(acc) - r).mul_(scale).add_(r).to(ref.dtype)
        return out

    def _unflatten(self, flat: torch.Tensor, discrete: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for key, (shape, _) in self._ref_spec.items():
            where = self._layout.slots.get(key)
            out[key] = discrete[key] if where is None else flat[where].view(shape)
        return out
