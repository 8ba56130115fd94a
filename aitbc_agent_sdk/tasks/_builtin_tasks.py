"""The built-in tasks: the registry's classifiers (``mlp``, ``cnn``, ``transformer``) on the task interface,
and the ``gpt`` language model (:mod:`~aitbc_agent_sdk.tasks._gpt_task`) for token datasets.

The classifiers train exactly as before the interface existed: Adam at the job's learning rate,
cross-entropy on integer labels, the seeded shuffle, input normalisation fitted to the training
split on the coordinator. On a values target the same models regress: one output per target value,
the default task's MSE, and ``mse`` (with ``mae`` and ``r2``) as the metric. ``--model-type`` and ``--task NAME`` pick among them.
"""

from __future__ import annotations

from pydantic import Field
from torch import nn

from aitbc_agent_sdk import limits
from aitbc_agent_sdk.records import ModelSpec
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.tasks._gpt_task import GptTask
from aitbc_agent_sdk.tasks._networks import MODEL_NAMES, build_model, fit_normalization
from aitbc_agent_sdk.tasks._task import DataInfo, TaskParams, TrainingTask


class ClassifierParams(TaskParams):
    hidden: int = Field(default=128, ge=1, le=limits.MAX_HIDDEN, description="hidden width")


class RegistryClassifier(TrainingTask):
    """One of :mod:`aitbc_agent_sdk.tasks._networks`' classifiers, by name."""

    Params = ClassifierParams

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.name = model_name  # type: ignore[misc]  # one class, three named tasks

    def spec(self, info: DataInfo, params: ClassifierParams) -> ModelSpec:
        return ModelSpec(name=self.model_name, input_shape=info.feature_shape, num_classes=info.num_classes,
                         hidden=params.hidden, target=info.target, target_width=info.target_width)

    def build_model(self, info: DataInfo, params: TaskParams) -> nn.Module:
        assert isinstance(params, ClassifierParams)
        return build_model(self.spec(info, params))

    def prepare(self, model: nn.Module, train: LabeledData, params: TaskParams) -> None:
        fit_normalization(model, train)


BUILTIN_TASKS: dict[str, TrainingTask] = {**{name: RegistryClassifier(name) for name in MODEL_NAMES},
                                          GptTask.name: GptTask()}
