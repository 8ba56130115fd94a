"""Byzantine-robust aggregation strategies, swappable for ``FedAvg``.

All of them implement ``AggregationStrategy`` (``begin`` / ``accumulate`` /
``result``) and follow the dtype rules of ``_aggregation.py``: floating tensors
are combined, integer and bool tensors (counters, flags) become the
element-wise max, and every state must have the keys, shapes and dtypes of the
first one.

Weights. Weights are self-reported (sample counts), so they are attack
surface: a weighted median or weighted Krum lets one client that claims many
samples decide the result. The order statistics here (``CoordinateMedian``,
``TrimmedMean``, ``Krum``/``MultiKrum``) therefore give every state one equal
vote. The one exception is weight 0, which means "contributes nothing" exactly
as in FedAvg: such a state is validated and its integer buffers join the max,
but it gets no vote and is not stored. ``NormClipping`` bounds each update's
norm first (last in this module), so there the weights are kept and used by the inner strategy.
The table of strategies by name is ``_strategies.py``.

Memory. Median, trimmed mean and Krum need every state before they can answer,
so they cannot stream like FedAvg. Each accepted state is copied once into a
single flat vector of its floating elements (P elements in the state's widest
float dtype, so the copy is exact); ``result()`` then works one key at a time,
stacking only that key across the K states. Peak memory is therefore about
K x P stored elements plus a few K x (largest tensor) temporaries, never a
K-model stack of everything. The bound of each strategy is in its docstring.

Non-finite values sort last (PyTorch orders NaN above +inf), so a minority of
clients sending NaN or inf cannot move the median, the trimmed mean or Krum's
choice.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

from aitbc_agent_sdk.aggregate._aggregation import (
    AggregationStrategy,
    FedAvg,
    Spec,
    _acc_dtype,
    _averaged,
    _check_same,
    _check_weight,
    _spec,
)

__all__ = [
    "CoordinateMedian",
    "Krum",
    "MultiKrum",
    "NormClipping",
    "TrimmedMean",
    "krum_scores",
    "median_rows",
    "trimmed_mean_rows",
]


# --- the math: plain functions over a K x N stack (one row per client) -------------------


def median_rows(x: torch.Tensor) -> torch.Tensor:
    """Column-wise median of a K x N stack; for even K the mean of the two middle values."""
    k = x.shape[0]
    if k == 0:
        raise ValueError("median of zero rows")
    ordered = torch.sort(x, dim=0).values
    mid = k // 2
    if k % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def trimmed_mean_rows(x: torch.Tensor, trim: int) -> torch.Tensor:
    """Column-wise mean of a K x N stack after dropping the ``trim`` largest and ``trim`` smallest values."""
    k = x.shape[0]
    if trim < 0 or k - 2 * trim < 1:
        raise ValueError(f"cannot trim {trim} from each end of {k} values")
    ordered = torch.sort(x, dim=0).values
    return ordered[trim : k - trim].mean(dim=0)


def krum_scores(sq_dist: torch.Tensor, f: int) -> torch.Tensor:
    """Krum score of each of n clients: sum of squared distances to its n - f - 2 nearest others.

    ``sq_dist`` is the n x n matrix of pairwise squared distances. Needs n > 2f + 2.
    NaN distances sort last, so they only count when fewer finite neighbours exist.
    """
    n = sq_dist.shape[0]
    if f < 0 or n <= 2 * f + 2:
        raise ValueError(f"Krum with f={f} needs more than 2f+2 = {2 * f + 2} states, got {n}")
    others = sq_dist.masked_fill(torch.eye(n, dtype=torch.bool, device=sq_dist.device), math.inf)
    nearest = torch.sort(others, dim=1).values[:, : n - f - 2]
    return nearest.sum(dim=1)


# --- shared buffering ---------------------------------------------------------------------


class _Layout:
    """Where each floating key lives in a state's flat vector."""

    def __init__(self, spec: Spec) -> None:
        self.slots: dict[str, slice] = {}
        offset = 0
        float_dtypes = []
        for key, (shape, dtype) in spec.items():
            if _averaged(dtype):
                n = math.prod(shape)
                self.slots[key] = slice(offset, offset + n)
                offset += n
                float_dtypes.append(dtype)
        self.size = offset
        # The widest float dtype holds every value exactly (f16 + bf16 promote to f32).
        dtype = float_dtypes[0] if float_dtypes else torch.float32
        for d in float_dtypes[1:]:
            dtype = torch.promote_types(dtype, d)
        self.dtype = dtype

    def flatten(self, state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        device = next((state[k].device for k in self.slots), torch.device("cpu"))
        flat = torch.empty(self.size, dtype=self.dtype, device=device)
        for key, where in self.slots.items():
            flat[where].copy_(state[key].detach().reshape(-1))  # casts in place, no temporary
        return flat


class _Buffered(AggregationStrategy):
    """Keeps every positive-weight state as one flat vector; subclasses reduce per key.

    Memory: K x P stored elements (P = floating elements per state) plus one copy of the
    integer buffers. ``result()`` adds the temporaries of ``_reduce`` for one key at a time.
    """

    def __init__(self) -> None:
        self.begin()

    def begin(self) -> None:
        self._spec: Spec | None = None
        self._layout: _Layout | None = None
        self._rows: list[torch.Tensor] = []
        self._discrete: dict[str, torch.Tensor] = {}
        self._count = 0

    @property
    def count(self) -> int:
        """How many states have been accumulated since ``begin()`` (zero-weight ones included)."""
        return self._count

    def accumulate(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
        w = _check_weight(weight)
        if self._spec is None:
            self._spec = _spec(state)
            self._layout = _Layout(self._spec)
            self._discrete = {k: t.detach().clone() for k, t in state.items() if not _averaged(t.dtype)}
        else:
            _check_same(self._spec, state)
            for key, acc in self._discrete.items():
                torch.maximum(acc, state[key].detach(), out=acc)
        assert self._layout is not None
        if w > 0:
            self._rows.append(self._layout.flatten(state))
        self._count += 1

    def result(self) -> dict[str, torch.Tensor]:
        name = type(self).__name__
        if self._spec is None or self._layout is None:
            raise ValueError(f"{name}.result() called before any state was accumulated")
        if not self._rows:
            raise ValueError(f"{name}: all {self._count} states had weight 0; nothing to aggregate")
        self._prepare(len(self._rows))
        out: dict[str, torch.Tensor] = {}
        for key, (shape, dtype) in self._spec.items():
            if _averaged(dtype):
                out[key] = self._reduce(self._column(key)).reshape(shape).to(dtype)
            else:
                out[key] = self._discrete[key].clone()
        return out

    def _column(self, key: str, rows: list[int] | None = None) -> torch.Tensor:
        """One key across the stored states (or the chosen ``rows``): a K x N stack in the accumulation dtype."""
        assert self._layout is not None
        where = self._layout.slots[key]
        picked = self._rows if rows is None else [self._rows[i] for i in rows]
        return torch.stack([r[where] for r in picked]).to(_acc_dtype(self._layout.dtype))

    def _columns(self) -> Iterator[torch.Tensor]:
        assert self._layout is not None
        for key in self._layout.slots:
            yield self._column(key)

    def _prepare(self, n: int) -> None:
        """Hook run once before the per-key reductions, with the number of voting states."""

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


# --- the strategies -----------------------------------------------------------------------


class CoordinateMedian(_Buffered):
    """Coordinate-wise median; unweighted (each positive-weight state one vote).

    For an even number of states the two middle values are averaged.
    Memory: K x P stored elements, plus about 3 x K x (largest tensor) during
    ``result()`` (the stacked key, its sorted copy and sort's int64 indices).
    """

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        return median_rows(x)


class TrimmedMean(_Buffered):
    """Coordinate-wise trimmed mean; unweighted.

    With K voting states, k = floor(trim_fraction * K) values are dropped from each end of
    every coordinate and the remaining K - 2k are averaged. ``trim_fraction`` is in [0, 0.5),
    so at least one value always remains; 0 is the plain (unweighted) mean.
    Memory: as ``CoordinateMedian``.
    """

    def __init__(self, trim_fraction: float = 0.1) -> None:
        beta = float(trim_fraction)
        if not 0.0 <= beta < 0.5:
            raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction!r}")
        self.trim_fraction = beta
        super().__init__()

    def _prepare(self, n: int) -> None:
        self._trim = math.floor(self.trim_fraction * n)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        return trimmed_mean_rows(x, self._trim)


class MultiKrum(_Buffered):
    """Multi-Krum (Blanchard et al. 2017; El Mhamdi et al. 2018): average the m best-scored states.

    Tolerates up to ``f`` Byzantine states. A state's score is the sum of squared Euclidean
    distances (over all floating elements) to its n - f - 2 nearest other states; the ``m``
    lowest scores are averaged, unweighted. Needs n > 2f + 2 voting states and m <= n - f
    (more would necessarily include a Byzantine state); ``result()`` raises ValueError otherwise.
    Ties in score go to the state accumulated first. After ``result()``, ``selected`` holds the
    chosen indices, counted among the positive-weight states in the order they were accumulated.
    Memory: K x P stored elements, an n x n float64 distance matrix, and about
    3 x K x (largest tensor) temporaries while distances are computed key by key.
    """

    def __init__(self, f: int, m: int) -> None:
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise ValueError(f"f must be an int >= 0, got {f!r}")
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"m must be an int >= 1, got {m!r}")
        self.f = f
        self.m = m
        super().__init__()

    def begin(self) -> None:
        super().begin()
        self.selected: list[int] = []

    def _prepare(self, n: int) -> None:
        name = type(self).__name__
        if n <= 2 * self.f + 2:
            raise ValueError(
                f"{name} with f={self.f} needs more than 2f+2 = {2 * self.f + 2} states with weight > 0, got {n}"
            )
        if self.m > n - self.f:
            raise ValueError(f"{name}: m={self.m} exceeds n - f = {n - self.f} with n={n} states")
        sq_dist = torch.zeros(n, n, dtype=torch.float64)
        for x in self._columns():
            # The direct (non-matmul) kernel avoids the cancellation of |a|^2 + |b|^2 - 2ab.
            d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
            sq_dist += d.to(torch.float64).cpu().square()
        scores = krum_scores(sq_dist, self.f)
        order = torch.sort(scores, stable=True).indices  # NaN scores sort last
        self.selected = sorted(order[: self.m].tolist())

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.selected].mean(dim=0)


class Krum(MultiKrum):
    """Krum: the single best-scored state (``MultiKrum`` with m = 1)."""

    def __init__(self, f: int) -> None:
        super().__init__(f, m=1)


# --- norm clipping: bound each update's L2 norm, then hand the clipped states to an inner strategy


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
