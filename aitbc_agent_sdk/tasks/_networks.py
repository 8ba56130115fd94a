"""Model registry: small CPU-friendly classifiers that all start with a Normalize layer.

Normalization statistics are buffers, not parameters: they travel in the state
dict to every worker, the optimizer never touches them, and FedAvg of identical
values returns the same values, so the whole federation shares one scaling.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pydantic import ValidationError
from torch import nn

from aitbc_agent_sdk.errors import ConfigError, UnknownModelError
from aitbc_agent_sdk.records import ModelSpec
from aitbc_agent_sdk.data._datasets import LabeledData

MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "transformer")


class Normalize(nn.Module):
    """(x - mean) / std with per-feature statistics stored as buffers."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("std", torch.ones(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm = Normalize(spec.input_shape)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(spec.input_shape), spec.hidden),
            nn.ReLU(),
            nn.Linear(spec.hidden, spec.outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.norm(x))


def _square_side(input_shape: tuple[int, ...]) -> int | None:
    """Side of the square image a flat feature vector (or [H, W]/[1, H, W]) maps to."""
    n = math.prod(input_shape)
    side = math.isqrt(n)
    return side if side * side == n and side >= 4 else None


class CNN(nn.Module):
    """Two 3x3 conv layers and one 2x2 pool; sized for 8x8 digits, works on any square >= 4."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        side = _square_side(spec.input_shape)
        assert side is not None  # checked in model_spec_for / build_model
        self.side = side
        channels = max(spec.hidden // 8, 4)
        self.norm = Normalize(spec.input_shape)
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * channels * (side // 2) ** 2, spec.hidden),
            nn.ReLU(),
            nn.Linear(spec.hidden, spec.outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).reshape(x.shape[0], 1, self.side, self.side)
        return self.head(self.features(x))


def _token_layout(input_shape: tuple[int, ...]) -> tuple[int, int]:
    """(tokens, dims per token): rows of a square image, else one feature per token."""
    side = _square_side(input_shape)
    if side is not None:
        return side, side
    return math.prod(input_shape), 1


class TinyTransformer(nn.Module):
    """Feature vector -> tokens -> 2 pre-norm encoder layers -> mean pool -> linear head."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tokens, token_dim = _token_layout(spec.input_shape)
        d_model = 32 if spec.hidden < 64 else 64
        self.norm = Normalize(spec.input_shape)
        self.embed = nn.Linear(token_dim, d_model)
        self.pos = nn.Parameter(torch.randn(self.tokens, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model,
            nhead=4,
            dim_feedforward=spec.hidden,
            dropout=0.0,  # tiny data, few epochs: dropout only slows convergence here
            batch_first=True,
            norm_first=True,
        )
        # enable_nested_tensor only matters for padding masks, which we never use.
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, spec.outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.norm(x).reshape(x.shape[0], self.tokens, -1)
        h = self.encoder(self.embed(tokens) + self.pos)
        return self.head(h.mean(dim=1))


_BUILDERS: dict[str, Callable[[ModelSpec], nn.Module]] = {
    "mlp": MLP,
    "cnn": CNN,
    "transformer": TinyTransformer,
}


def _check_name(name: str) -> None:
    if name not in _BUILDERS:
        raise UnknownModelError(f"unknown model {name!r}; valid models are {list(MODEL_NAMES)}")


def _check_shape(name: str, input_shape: tuple[int, ...]) -> None:
    if name == "cnn" and _square_side(input_shape) is None:
        raise UnknownModelError(
            f"model 'cnn' needs features that form a square image of side >= 4 "
            f"(e.g. 64 -> 8x8); got feature shape {input_shape}. Use 'mlp' or 'transformer'."
        )


def model_spec_for(name: str, data: LabeledData, hidden: int = 128) -> ModelSpec:
    """The ModelSpec a job ships to workers, derived from the dataset's shape and its target (classes or values;
    a built-in model needs one)."""
    _check_name(name)
    _check_shape(name, data.feature_shape)
    if data.target == "none":
        raise ConfigError(f"the built-in model {name!r} needs a target (classes or values), and this data has "
                          f"none; write a task for self-supervised training (--task FILE.py)")
    try:
        return ModelSpec(name=name, input_shape=data.feature_shape, num_classes=data.num_classes, hidden=hidden,
                         target=data.target, target_width=data.target_width)
    except ValidationError as exc:  # past a size limit (aitbc_agent_sdk.limits): say which, as a user error
        raise ConfigError(f"no {name!r} model for this dataset: {exc.errors()[0]['msg']}") from exc


def build_model(spec: ModelSpec, *, seed: int | None = None) -> nn.Module:
    """Instantiate a model; with ``seed`` the initial weights are identical on every host."""
    _check_name(spec.name)
    _check_shape(spec.name, spec.input_shape)
    if seed is None:
        return _BUILDERS[spec.name](spec)
    # fork_rng keeps the caller's global RNG stream untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _BUILDERS[spec.name](spec)


def fit_normalization(model: nn.Module, data: LabeledData) -> None:
    """Set the Normalize buffers from training data (per-feature mean/std, std floored)."""
    norm = next((m for m in model.modules() if isinstance(m, Normalize)), None)
    if norm is None:
        raise TypeError(f"{type(model).__name__} has no Normalize layer")
    if tuple(norm.mean.shape) != data.feature_shape:
        raise ValueError(f"model expects features {tuple(norm.mean.shape)}, data has {data.feature_shape}")
    x = data.features.to(torch.float32)
    mean = x.mean(dim=0)
    # Constant features (e.g. digit corner pixels) have std 0; floor it to avoid dividing by 0.
    std = x.std(dim=0, unbiased=False).clamp_min(1e-2) if len(data) > 1 else torch.ones_like(mean)
    with torch.no_grad():
        norm.mean.copy_(mean)
        norm.std.copy_(std)
