"""Split sample indices across workers. Pure numpy: no torch, no I/O.

Every partition is a list of disjoint, sorted int64 index arrays that together
cover ``range(num_samples)`` exactly once, and the same seed always gives the
same split (the coordinator and tests rely on replaying it).
"""

from __future__ import annotations

import numpy as np


def _check_shards(num_samples: int, num_shards: int, min_samples: int = 1) -> None:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if min_samples < 0:
        raise ValueError(f"min_samples must be >= 0, got {min_samples}")
    if num_samples < num_shards * max(min_samples, 1):
        raise ValueError(
            f"cannot give {num_shards} shards at least {max(min_samples, 1)} sample(s) each "
            f"from {num_samples} samples"
        )


def iid_partition(num_samples: int, num_shards: int, seed: int) -> list[np.ndarray]:
    """Shuffle then cut into ``num_shards`` nearly equal pieces (sizes differ by <= 1)."""
    _check_shards(num_samples, num_shards)
    order = np.random.default_rng(seed).permutation(num_samples)
    return [np.sort(part).astype(np.int64) for part in np.array_split(order, num_shards)]


def dirichlet_partition(
    labels: np.ndarray,
    num_shards: int,
    alpha: float,
    seed: int,
    min_samples: int = 1,
) -> list[np.ndarray]:
    """Label-skewed non-IID split: each class is spread over shards by Dirichlet(alpha) weights.

    Small ``alpha`` concentrates each class on few shards. Shards that end up
    below ``min_samples`` are topped up by moving samples from the largest
    shards, which keeps the skew but guarantees every worker can train.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    _check_shards(len(labels), num_shards, min_samples)
    rng = np.random.default_rng(seed)

    shards: list[list[np.ndarray]] = [[] for _ in range(num_shards)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        proportions = rng.dirichlet(np.full(num_shards, alpha))
        # Cumulative cut points turn proportions into contiguous slices of this class.
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for shard, part in zip(shards, np.split(members, cuts), strict=True):
            shard.append(part)
    parts = [np.concatenate(s) if s else np.empty(0, np.int64) for s in shards]

    # Top up starved shards from the currently largest one; a donor never drops below min.
    for i in range(num_shards):
        while len(parts[i]) < min_samples:
            donor = int(np.argmax([len(p) for p in parts]))
            take = min(min_samples - len(parts[i]), len(parts[donor]) - min_samples)
            moved, parts[donor] = parts[donor][:take], parts[donor][take:]
            parts[i] = np.concatenate([parts[i], moved])
    return [np.sort(p).astype(np.int64) for p in parts]


def label_counts(labels: np.ndarray, num_classes: int) -> tuple[int, ...]:
    """Samples per class, length ``num_classes`` (the manifest shows this per shard)."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]")
    return tuple(int(c) for c in np.bincount(labels.astype(np.int64), minlength=num_classes))
