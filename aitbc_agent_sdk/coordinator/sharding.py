"""How a training's data becomes shards, and its round-0 model (pure: no I/O)."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ConfigError
from ..models import TrainingSpec
from ..training import (
    LabeledData, build_model, dirichlet_partition, encode_state, evaluate, fit_normalization, iid_partition,
    model_spec_for, train_test_split,
)


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


def initial_model(spec: TrainingSpec, train: LabeledData) -> bytes:
    """The round-0 model: seeded weights, input normalisation fitted to the training split."""
    model = build_model(model_spec_for(spec.model_type, train), seed=spec.seed)
    fit_normalization(model, train)
    return encode_state({k: v.detach().contiguous() for k, v in model.state_dict().items()})


def evaluate_state(spec: TrainingSpec, test: LabeledData, state: dict[str, torch.Tensor]):
    model = build_model(model_spec_for(spec.model_type, test))
    model.load_state_dict(state, strict=True)
    return evaluate(model, test)
