"""Market: discovery of offers and pure, swappable scoring strategies."""

from .discovery import collect_offers
from .scoring import (
    GPU_PERFORMANCE, ScoringStrategy, WeightedScore, gpu_performance, meets_min_gpu, rank_workers,
    reputation_from_earnings, reputation_from_history, reputation_unit, weighted_scores,
)

__all__ = [
    "GPU_PERFORMANCE", "ScoringStrategy", "WeightedScore", "collect_offers", "gpu_performance",
    "meets_min_gpu", "rank_workers", "reputation_from_earnings", "reputation_from_history", "reputation_unit",
    "weighted_scores",
]
