"""How a training's data becomes shards (pure: no I/O). The round-0 model is the task's (BoundTask.initial_state)."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..models import TrainingSpec
from ..training import LabeledData, dirichlet_partition, iid_partition, train_test_split


def plan_shards(spec: TrainingSpec, data: LabeledData,
                num_shards: int) -> tuple[LabeledData, LabeledData, list[np.ndarray]]:
    """(train split, test split, each shard's sample indices into the train split)."""
    train, test = train_test_split(data, spec.test_fraction, spec.seed)
    if num_shards < 1 or num_shards > len(train):
        raise ConfigError(f"cannot make {num_shards} shards from {len(train)} training samples")
    if spec.partition == "iid":
        parts = iid_partition(len(train), num_shards, spec.seed)
    else:
        parts = dirichlet_partition(train.labels.numpy(), num_shards, spec.dirichlet_alpha, spec.seed)
    return train, test, list(parts)
