"""Aggregation strategies by name: the table the training spec's ``aggregation`` field selects from."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

import torch

from aitbc_agent_sdk.aggregate._aggregation import AggregationStrategy, FedAvg
from aitbc_agent_sdk.aggregate._robust import CoordinateMedian, Krum, MultiKrum, NormClipping, TrimmedMean

__all__ = ["STRATEGIES", "make_strategy", "strategy_for_round"]

STRATEGIES: dict[str, Callable[..., AggregationStrategy]] = {
    "fedavg": FedAvg,
    "median": CoordinateMedian,
    "trimmed-mean": TrimmedMean,
    "krum": Krum,
    "multi-krum": MultiKrum,
    "norm-clip": NormClipping,
}


def make_strategy(name: str, **params: object) -> AggregationStrategy:
    """Build the strategy registered as ``name`` with ``params``; ValueError for unknown names or parameters."""
    try:
        factory = STRATEGIES[name]
    except KeyError:
        valid = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown aggregation strategy {name!r}; valid names: {valid}") from None
    try:
        inspect.signature(factory).bind(**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for aggregation strategy {name!r}: {exc}") from exc
    return factory(**params)


def strategy_for_round(name: str, workers: int, reference: Mapping[str, torch.Tensor]) -> AggregationStrategy:
    """The named strategy with parameters that suit a round of ``workers`` results.

    Krum tolerates f = (n - 3) // 2 Byzantine states (it needs n > 2f + 2); multi-Krum
    averages the n - max(f, 1) best, so the worst-scored state is always left out; the trimmed mean drops a quarter from each end; norm clipping
    bounds updates at the round's median norm.
    """
    f = max(0, (workers - 3) // 2)
    params: dict[str, object] = {
        "trimmed-mean": {"trim_fraction": 0.25},
        "krum": {"f": f},
        "multi-krum": {"f": f, "m": max(1, workers - max(f, 1))},
        "norm-clip": {"reference": reference},
    }.get(name, {})
    return make_strategy(name, **params)
