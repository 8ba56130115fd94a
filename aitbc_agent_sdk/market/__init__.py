"""Market: discovery of offers and pure, swappable scoring strategies.

Names are imported on first use (PEP 562): scoring's numpy is not needed for the CLI's --help."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_discovery": ("OfferBook", "collect_offers", "DEFAULT_MIN_STAKE_WEI"),
    "_scoring": (
        "GPU_PERFORMANCE", "ScoringStrategy", "WeightedScore", "gpu_performance", "meets_min_gpu", "rank_workers",
        "reputation_from_earnings", "reputation_from_history", "reputation_unit", "weighted_scores",
    ),
}, globals())

if TYPE_CHECKING:  # static tools see ordinary imports
    from ._discovery import OfferBook, collect_offers
    from ._scoring import (
        GPU_PERFORMANCE, ScoringStrategy, WeightedScore, gpu_performance, meets_min_gpu, rank_workers,
        reputation_from_earnings, reputation_from_history, reputation_unit, weighted_scores,
    )
    from ._discovery import DEFAULT_MIN_STAKE_WEI
