"""A task bound to its parameters: what the coordinator and the training process call.

``bind_task`` turns a training's spec (a built-in's name, or a :class:`TaskRef` with the loaded
user task) into a :class:`BoundTask`; its methods are the only way the rest of the SDK builds,
initialises, scores and checks a model, so a built-in and a user's task take the same path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from pydantic import ValidationError
from torch import nn

from aitbc_agent_sdk.errors import ConfigError, TrainingError, UnknownModelError
from aitbc_agent_sdk.records import JobConfig, ModelFootprint, ModelSpec, TaskRef, TrainingSpec
from aitbc_agent_sdk.records._training import TASK_MODEL
from aitbc_agent_sdk.tasks._builtin_tasks import BUILTIN_TASKS, ClassifierParams, RegistryClassifier
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.tasks._footprint import measure_footprint
from aitbc_agent_sdk.tasks._networks import model_spec_for
from aitbc_agent_sdk.tasks._task import DataInfo, TaskParams, TrainingTask
from aitbc_agent_sdk.tasks._task_checks import TaskOrigin, check_metric, describe_task_error
from aitbc_agent_sdk.tasks._task_loop import LocalTrainResult, evaluate_task, task_loss, task_metrics, train_task

REHEARSAL_SAMPLES = 64  # what the dry run before funding trains and evaluates on
REHEARSAL_TOKENS = 1 << 16  # a token stream's rehearsal: enough for a few windows of context


def rehearsal_size(kind: str) -> int:
    """How much of a dataset of ``kind`` the rehearsal reads: tokens of a stream, else samples."""
    return REHEARSAL_TOKENS if kind == "tokens" else REHEARSAL_SAMPLES
USER_TASK_MODEL = TASK_MODEL  # ModelSpec.name of a user task's jobs: the shape travels, the model is the task's


@dataclass(frozen=True)
class BoundTask:
    ref: TaskRef
    task: TrainingTask
    params: TaskParams
    origin: TaskOrigin | None = None  # a user task's files, so its errors name their line
    # One model to score results with, loaded anew for each (building one costs more than a check's
    # forward pass at 85M parameters). Not copied by ``replace``: each bound task has its own.
    _scorer: dict[str, nn.Module] = field(default_factory=dict, init=False, repr=False, compare=False)
    _scoring: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def train(self, model: nn.Module, data: LabeledData, config: JobConfig, *, seed: int,
              **options: Any) -> LocalTrainResult:
        """``train_task`` with this task and its parameters (``options``: device, on_epoch, kept_state,
        trajectory)."""
        return train_task(self.task, model, data, self.params, config, seed=seed, **options)

    def model_spec(self, data: LabeledData) -> ModelSpec:
        """The data's shape as jobs carry it (and, for a registry classifier, its model); another task
        (a user's, or the built-in gpt) builds its own model, so its spec carries only the shape."""
        if isinstance(self.task, RegistryClassifier):
            assert isinstance(self.params, ClassifierParams)
            return model_spec_for(self.ref.name, data, hidden=self.params.hidden)
        try:
            return ModelSpec(name=USER_TASK_MODEL, input_shape=data.feature_shape, num_classes=data.num_classes,
                             hidden=1, target=data.target, target_width=data.target_width)
        except ValidationError as exc:
            raise ConfigError(f"task {self.ref.name!r}: {exc.errors()[0]['msg']}") from exc

    def build(self, spec: ModelSpec, *, samples: int = 0, seed: int | None = None,
              max_parameters: int | None = None) -> nn.Module:
        """The task's model for data of ``spec``'s shape; with ``seed`` the same weights everywhere. With
        ``max_parameters`` (what a provider's job declares) a larger model is an error before it trains."""
        info = DataInfo(feature_shape=tuple(spec.input_shape), num_classes=spec.num_classes, samples=samples,
                        target=spec.target, target_width=spec.target_width)
        with torch.random.fork_rng(devices=[]):  # the caller's RNG stream stays untouched
            if seed is not None:
                torch.manual_seed(seed)
            model = self.task.build_model(info, self.params)
        if not isinstance(model, nn.Module):
            raise TrainingError(f"task {self.ref.name!r}: build_model() returned {type(model).__name__}, not a Module")
        built = sum(p.numel() for p in model.parameters())
        if max_parameters is not None and built > max_parameters:
            raise TrainingError(f"task {self.ref.name!r} builds {built:,} parameters; the job declares "
                                f"{max_parameters:,}")
        return model

    def initial_state(self, train: LabeledData, seed: int) -> bytes:
        """The round-0 weights: seeded, then ``prepare``d on the training split (e.g. normalisation)."""
        model = self.build(self.model_spec(train), samples=len(train), seed=seed)
        self.task.prepare(model, train, self.params)
        return encode_state({k: v.detach().contiguous() for k, v in model.state_dict().items()})

    def loaded(self, spec: ModelSpec, state: dict[str, torch.Tensor]) -> nn.Module:
        model = self.build(spec)
        model.load_state_dict(dict(state), strict=True)
        return model

    def evaluate(self, test: LabeledData, state: dict[str, torch.Tensor]) -> dict[str, float]:
        return evaluate_task(self.task, self.loaded(self.model_spec(test), state), test, self.params)

    def validation_loss(self, spec: ModelSpec, state: dict[str, torch.Tensor], batch: LabeledData) -> float:
        key = spec.model_dump_json()
        with self._scoring:
            model = self._scorer.get(key)
            if model is None:
                self._scorer.clear()  # one model kept, of the latest shape
                model = self._scorer[key] = self.build(spec)
            model.load_state_dict(dict(state), strict=True)
            return task_loss(self.task, model, batch, self.params)

    def rehearse(self, data: LabeledData, config: JobConfig, seed: int,
                 samples: int = REHEARSAL_SAMPLES) -> ModelFootprint:
        """Every step of the task once, on a few samples, before anything is funded: a bug in the
        task's code is a usage error now, not a failed (and paid) round. Returns the model's footprint,
        measured on one more step at the job's batch size (or all the rehearsal has)."""
        small = data.subset(torch.arange(min(samples, len(data)))) if isinstance(data, LabeledData) else data
        try:
            trial = replace(self, params=self.task.rehearsal_params(self.params))  # e.g. fewer windows of a stream
            initial = trial.initial_state(small, seed)
            state = decode_state(initial)
            model = trial.loaded(trial.model_spec(small), state)
            train_task(self.task, model, small, trial.params, config.model_copy(update={"epochs": 1}), seed=seed,
                       device=torch.device("cpu"))
            trial.validation_loss(trial.model_spec(small), model.state_dict(), small)
            metrics: Any = task_metrics(self.task, model, small, trial.params)
            if isinstance(metrics, dict):
                metrics = {key: float(value) for key, value in metrics.items()}  # as every round reads them
            footprint = trial.measure(small, state, config, len(initial))
        except Exception as exc:  # the user's code: any failure is theirs to fix, with its message and line
            raise ConfigError(f"task {self.ref.name!r} failed a dry run on {len(small)} samples: "
                              f"{describe_task_error(exc, self.task, self.origin)}") from exc
        if not isinstance(metrics, dict):
            raise ConfigError(f"task {self.ref.name!r}: evaluate() returned {type(metrics).__name__}, not a dict "
                              f"of named metrics")
        check_metric(self.task.for_target(getattr(small, "target", "classes")), metrics, self.origin)
        return footprint

    def measure(self, data: LabeledData, state: dict[str, torch.Tensor], config: JobConfig,
                weights_bytes: int) -> ModelFootprint:
        """The footprint of one fresh model of ``state`` trained one step on ``data``'s first batch."""
        model = self.loaded(self.model_spec(data), state)
        batch_size = min(config.batch_size, len(data)) if isinstance(data, LabeledData) else config.batch_size
        generator = torch.Generator().manual_seed(0)
        batch = next(iter(self.task.batches(data, self.params, batch_size, generator, torch.device("cpu"))))
        return measure_footprint(self.task, model, batch, self.params, config, weights_bytes)


def task_ref_of(spec: TrainingSpec) -> TaskRef:
    """The task a spec names: its ``task``, else the built-in named by ``model_type``."""
    if spec.task is not None:
        return spec.task
    if spec.model_type not in BUILTIN_TASKS:
        raise UnknownModelError(f"unknown model {spec.model_type!r}; valid models are {list(BUILTIN_TASKS)}")
    return TaskRef(name=spec.model_type)


def job_task_ref(spec: ModelSpec, task: TaskRef | None) -> TaskRef:
    """The task a job runs: its own, else the built-in its model spec names (with the spec's width)."""
    return task if task is not None else TaskRef(name=spec.name, params={"hidden": spec.hidden})


def bind_task(ref: TaskRef, user_task: TrainingTask | None = None, origin: TaskOrigin | None = None) -> BoundTask:
    """``ref`` with its parameters validated; a user task's code must be loaded already (``user_task``, imported
    from ``origin``)."""
    if ref.builtin:
        if ref.name not in BUILTIN_TASKS:
            raise UnknownModelError(f"unknown task {ref.name!r}; built-in tasks are {list(BUILTIN_TASKS)}")
        task: TrainingTask = BUILTIN_TASKS[ref.name]
    elif user_task is None:
        raise TrainingError(f"task {ref.name!r} ({ref.cid}) is not loaded")
    else:
        task = user_task
    try:
        params = task.params(dict(ref.params))
    except ValidationError as exc:
        raise ConfigError(f"task {ref.name!r}: bad parameters: {exc.errors()[0]['loc']}: "
                          f"{exc.errors()[0]['msg']}") from exc
    return BoundTask(ref, task, params, origin)
