"""Experiment logs: a training's rounds written where researchers already look (TensorBoard, W&B, MLflow).

One adapter per library, chosen from :data:`EXPERIMENT_LOGS` by the name a training's spec lists in
``log_to``. The libraries are imported only when a log is opened: ``wandb`` and ``mlflow`` are optional extras.
"""

from ._adapters import EXPERIMENT_LOGS, experiment_log_problems, open_experiment_log  # noqa: F401
from ._port import ExperimentLog, ExperimentRun  # noqa: F401
