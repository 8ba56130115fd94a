"""Opened boundary states are checked against what the task's own model, optimizer and scheduler could be in
(training/opened_state.py) before a spot check replays them: attack 7 of issue #25 opened Adam betas of
(1.0, 0.999), which divide by zero in the replay. The attack itself: tests/security/test_checks_fail_closed.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import JobConfig, TaskRef
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.wire._checkpoint import decode_metadata, decode_state, encode_state
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.data._shard_files import TokenData
from aitbc_agent_sdk.tasks._task_loop import train_step
from aitbc_agent_sdk.proof._trajectory import encode_boundary, load_boundary, opened_state_problem

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MLP = bind_task(TaskRef(name="mlp", params={"hidden": 16}))
GPT = bind_task(TaskRef(name="gpt", params={"layers": 1, "heads": 2, "width": 32, "context": 16,
                                            "windows_per_epoch": 48, "eval_windows": 8, "warmup_steps": 2}))
CONFIG = JobConfig(epochs=1, batch_size=32, learning_rate=1e-2, segments=4)


def _data() -> LabeledData:
    features = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    return LabeledData(features, (features[:, 0] > 0).long(), 2)


def _job(bound, spec):
    model = bound.build(spec, samples=64, seed=1)
    optimizer, scheduler = bound.task.configure_optimizer(model, bound.params, CONFIG, 8)
    return model, optimizer, scheduler


@pytest.fixture(scope="module")
def mlp_boundary():
    """A boundary after two honest Adam steps, and the task's fresh model, optimizer and scheduler."""
    data = _data()
    spec = MLP.model_spec(data)
    model, optimizer, scheduler = _job(MLP, spec)
    for start in (0, 32):
        train_step(MLP.task, model, (data.features[start:start + 32], data.labels[start:start + 32]), MLP.params,
                   optimizer, scheduler, torch.device("cpu"), None)
    return encode_boundary(model, optimizer, scheduler), spec


def _tampered(blob: bytes, *, groups=None, tensors=None, scalars=None, scheduler=None) -> bytes:
    state, metadata = decode_state(blob), decode_metadata(blob)
    if groups is not None:
        metadata["param_groups"] = json.dumps(groups(json.loads(metadata["param_groups"])))
    if scalars is not None:
        metadata["scalars"] = scalars
    if scheduler is not None:
        metadata["scheduler"] = json.dumps(scheduler(json.loads(metadata["scheduler"])))
    if tensors is not None:
        tensors(state)
    return encode_state(state, metadata)


def _group(**values):
    def change(groups):
        groups[0].update(values)
        return groups
    return change


def _tensor(key, value):
    def change(state):
        state[key] = value(state[key])
    return change


TAMPERED = {
    "betas (1.0, 0.999)": (dict(groups=_group(betas=[1.0, 0.999])), r"betas is \[1\.0, 0\.999\], outside \[0, 1\)"),
    "betas NaN": (dict(groups=_group(betas=[float("nan"), 0.999])), "betas"),
    "negative lr": (dict(groups=_group(lr=-1e-3)), "lr is -0.001"),
    "infinite lr": (dict(groups=_group(lr=float("inf"))), "lr is inf"),
    "zero eps": (dict(groups=_group(eps=0.0)), r"eps is 0\.0, outside \(0, 1\]"),
    "negative weight decay": (dict(groups=_group(weight_decay=-1.0)), "weight_decay"),
    "amsgrad switched on": (dict(groups=_group(amsgrad=True)), "amsgrad is True, the task's is False"),
    "a field of its own": (dict(groups=_group(boost=2.0)), "other fields"),
    "betas of another length": (dict(groups=_group(betas=[0.9])), "betas"),
    "a negative step": (dict(tensors=_tensor("optim/0.step", lambda t: torch.tensor(-3.0))), "step count"),
    "a fractional step": (dict(tensors=_tensor("optim/0.step", lambda t: torch.tensor(1.5))), "step count"),
    "a huge step": (dict(tensors=_tensor("optim/0.step", lambda t: torch.tensor(1e30))), "step count"),
    "NaN moments": (dict(tensors=_tensor("optim/0.exp_avg", lambda t: t * float("nan"))), "non-finite"),
    "negative second moments": (dict(tensors=_tensor("optim/0.exp_avg_sq", lambda t: -1 - t)), "negative"),
    "moments of another shape": (dict(tensors=_tensor("optim/0.exp_avg", lambda t: t.reshape(-1))), "its parameter"),
    "float64 moments": (dict(tensors=_tensor("optim/0.exp_avg", lambda t: t.double())), "its parameter"),
    "a scalar moment": (dict(tensors=_tensor("optim/0.exp_avg", lambda t: t.sum())), "its parameter"),
    "infinite weights": (dict(tensors=_tensor("model/net.1.weight", lambda t: t / 0)), "non-finite"),
    "NaN scalar state": (dict(scalars='{"0": {"step": NaN}}'), "out of bounds"),
    "state of no parameter": (dict(scalars='{"²": {"step": 1}}'), "parameter"),
    "a scheduler where none is": (dict(scheduler=lambda _: {"last_epoch": 3}), "scheduler"),
}


def test_an_honest_opened_state_fits_and_loads(mlp_boundary):
    blob, spec = mlp_boundary
    assert opened_state_problem(blob, *_job(MLP, spec)) is None
    load_boundary(blob, *_job(MLP, spec))


@pytest.mark.parametrize("name", sorted(TAMPERED))
def test_an_opened_state_the_task_could_not_be_in_is_refused_before_it_loads(mlp_boundary, name):
    blob, spec = mlp_boundary
    change, pattern = TAMPERED[name]
    bad = _tampered(blob, **change)
    problem = opened_state_problem(bad, *_job(MLP, spec))
    assert problem is not None and re.search(pattern, problem), problem
    with pytest.raises(TrainingError, match="does not fit"):
        load_boundary(bad, *_job(MLP, spec))


def test_a_buffer_may_hold_the_tasks_own_infinities_and_no_others(mlp_boundary):
    blob, spec = mlp_boundary
    model, optimizer, scheduler = _job(MLP, spec)
    model.register_buffer("mask", torch.tensor([0.0, float("-inf")]))  # as a causal mask holds them
    state = decode_state(blob)
    for mask, fits in ([0.0, float("-inf")], True), ([float("-inf"), 0.0], False), ([0.0, float("inf")], False):
        state["model/mask"] = torch.tensor(mask)
        problem = opened_state_problem(encode_state(state, decode_metadata(blob)), model, optimizer, scheduler)
        assert (problem is None) == fits, (mask, problem)


def test_a_scheduler_differs_from_the_tasks_only_in_its_bounded_position():
    tokens = TokenData(((np.arange(4000) % 256).astype(np.uint16),), vocab_size=256, eot=0)
    spec = GPT.model_spec(tokens)
    model, optimizer, scheduler = _job(GPT, spec)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    blob = encode_boundary(model, optimizer, scheduler)
    assert opened_state_problem(blob, *_job(GPT, spec)) is None  # moved on: its position is free, in bounds
    for change, pattern in [
        (lambda s: {**s, "last_epoch": -7}, "last_epoch"),
        (lambda s: {**s, "_step_count": 2.5}, "_step_count"),
        (lambda s: {**s, "_last_lr": [float("inf")] * len(s["_last_lr"])}, "_last_lr"),
        (lambda s: {**s, "base_lrs": [1.0] * len(s["base_lrs"])}, "base_lrs"),
        (lambda s: {k: v for k, v in s.items() if k != "lr_lambdas"}, "fields"),
    ]:
        problem = opened_state_problem(_tampered(blob, scheduler=change), *_job(GPT, spec))
        assert problem is not None and re.search(pattern, problem), problem
