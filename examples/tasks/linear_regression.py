"""A regressor on a float target, trained with mean squared error: a task to copy for any numeric target.

Run it on a CSV whose label column holds numbers (``make_data.py`` writes one from scikit-learn's
bundled diabetes table, whose target is disease progression, 25 to 346)::

    python examples/tasks/make_data.py diabetes.csv
    aitbc distributed-training run --task examples/tasks/linear_regression.py --data-path diabetes.csv \
        --label-column progression --target values --target-workers 2 --rounds 5 --yes

``--target values`` is what the data says anyway (non-integer floats, or integers with many distinct
values, are detected as values); it is given here so that a target of few integers trains as a
regression too. The same file works on ``.npz``/``.pt`` arrays whose ``y`` is float, one value or a
vector per row.

What it shows:
- ``prepare`` fits the inputs' and the target's mean and scale on the training split (once, on the
  coordinator); they are buffers, so they travel with the weights, and the model predicts in the
  target's own units;
- ``loss`` is the MSE of the standardized target, so one learning rate suits targets of any scale;
- ``evaluate`` reports ``mse`` (the metric; lower is better), ``mae`` and ``r2`` in the target's units.
  ``--task-param hidden=0`` makes it plain linear regression; the default adds one hidden layer.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn
from torch.nn import functional as F

from aitbc_agent_sdk import DataInfo, TaskParams, TrainingTask
from aitbc_agent_sdk.tasks import regression_metrics


class RegressionParams(TaskParams):
    hidden: int = Field(default=32, ge=0, le=4096, description="width of the hidden layer; 0: linear regression")
    weight_decay: float = Field(default=1e-4, ge=0.0, le=1.0, description="AdamW's decoupled weight decay")


class StandardizedRegressor(nn.Module):
    """``y = net((x - x_mean) / x_scale) * y_scale + y_mean``, all four fitted by ``prepare``."""

    def __init__(self, features: int, outputs: int, hidden: int) -> None:
        super().__init__()
        self.register_buffer("x_mean", torch.zeros(features))
        self.register_buffer("x_scale", torch.ones(features))
        self.register_buffer("y_mean", torch.zeros(outputs))
        self.register_buffer("y_scale", torch.ones(outputs))
        self.net = (nn.Linear(features, outputs) if hidden == 0 else
                    nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, outputs)))

    def standardized(self, x: torch.Tensor) -> torch.Tensor:
        """The prediction in standardized target units (what the loss compares)."""
        return self.net((x.flatten(1) - self.x_mean) / self.x_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.standardized(x) * self.y_scale + self.y_mean


class LinearRegression(TrainingTask):
    name = "linear-regression"
    Params = RegressionParams
    metric = "mse"
    higher_is_better = False
    loss_name = "mse (standardized target)"

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, RegressionParams)
        if info.target != "values":
            raise ValueError(f"linear-regression predicts numbers, and this data's target is {info.target}; "
                             f"pass --target values for a numeric target")
        features = 1
        for dim in info.feature_shape:
            features *= dim
        return StandardizedRegressor(features, info.target_width, params.hidden)

    def prepare(self, model: nn.Module, train, params: TaskParams) -> None:  # type: ignore[no-untyped-def]
        assert isinstance(model, StandardizedRegressor)
        x, y = train.features.flatten(1).float(), train.labels.float()
        with torch.no_grad():
            model.x_mean.copy_(x.mean(dim=0))
            model.x_scale.copy_(x.std(dim=0, unbiased=False).clamp_min(1e-6))  # a constant column stays finite
            model.y_mean.copy_(y.mean(dim=0))
            model.y_scale.copy_(y.std(dim=0, unbiased=False).clamp_min(1e-6))

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], params: TaskParams) -> torch.Tensor:
        assert isinstance(model, StandardizedRegressor)
        inputs, targets = batch
        return F.mse_loss(model.standardized(inputs).float(), ((targets - model.y_mean) / model.y_scale).float())

    def configure_optimizer(self, model, params, config, total_steps):  # type: ignore[no-untyped-def]
        assert isinstance(params, RegressionParams)
        return torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=params.weight_decay), None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data, params: TaskParams,  # type: ignore[no-untyped-def]
                 device: torch.device) -> dict[str, float]:
        assert isinstance(model, StandardizedRegressor)
        predictions = torch.cat([model(data.features[i : i + 1024].to(device)).float().cpu()
                                 for i in range(0, len(data), 1024)])
        targets = data.labels.float()
        standardized = F.mse_loss((predictions - model.y_mean.cpu()) / model.y_scale.cpu(),
                                  (targets - model.y_mean.cpu()) / model.y_scale.cpu()).item()
        return {**regression_metrics(predictions, targets), "loss": standardized}
