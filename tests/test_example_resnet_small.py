"""examples/tasks/resnet_small.py on data it was not written for: its defaults follow the image size,
so on small 8x8 3-channel images it keeps up with the built-in MLP (a few local steps, no market)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from aitbc_agent_sdk.records import JobConfig, TaskRef
from aitbc_agent_sdk.data._datasets import load_dataset, train_test_split
from aitbc_agent_sdk.tasks._bound_task import BoundTask, bind_task
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.tasks._task_loop import evaluate_task

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "resnet_small.py"
SOME_CID = "QmR1zGB5tUrV4ceRtsWq4NfNAN4zQjDgCqjyDrwDVdG3VM"


@pytest.fixture(scope="module")
def resnet():
    spec = importlib.util.spec_from_file_location("example_resnet_small_sizes", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("side", "stages", "pool", "crops", "flip"), [
    (8, 1, 4, 0, False), (12, 1, 4, 0, False), (16, 2, 4, 2, False), (32, 2, 4, 4, True), (64, 2, 4, 8, True),
    (4, 1, 4, 0, False), (2, 1, 2, 0, False),
])
def test_defaults_follow_the_image_size(resnet, side, stages, pool, crops, flip) -> None:
    chosen = resnet.for_images(resnet.ResNetParams(), side, side)
    assert (chosen.stages, chosen.pool, chosen.crop_padding, chosen.flip) == (stages, pool, crops, flip)


def test_what_the_user_sets_is_kept(resnet) -> None:
    chosen = resnet.for_images(resnet.ResNetParams(stages=3, pool=1, crop_padding=0, flip=True), 32, 32)
    assert (chosen.stages, chosen.pool, chosen.crop_padding, chosen.flip) == (3, 1, 0, True)


def colour_digits_8x8() -> tuple[LabeledData, LabeledData]:
    """The bundled 8x8 digits tiled into three channels: small images the example was not written for."""
    digits = load_dataset("digits")
    images = digits.features.view(-1, 1, 8, 8).repeat(1, 3, 1, 1)
    return train_test_split(LabeledData(images, digits.labels, digits.num_classes), 0.2, 0)


def accuracy(task: BoundTask, train: LabeledData, test: LabeledData, lr: float) -> float:
    model = task.build(task.model_spec(train), samples=len(train), seed=0)
    task.task.prepare(model, train, task.params)
    task.train(model, train, JobConfig(epochs=2, learning_rate=lr, batch_size=32), seed=0)
    return evaluate_task(task.task, model, test, task.params)["accuracy"]


def test_at_its_defaults_it_keeps_up_with_the_mlp_on_small_three_channel_images(resnet, one_torch_thread) -> None:
    train, test = colour_digits_8x8()
    mlp = accuracy(bind_task(TaskRef(name="mlp")), LabeledData(train.features.flatten(1), train.labels, 10),
                   LabeledData(test.features.flatten(1), test.labels, 10), lr=1e-2)
    small = accuracy(bind_task(TaskRef(name="resnet-small", cid=SOME_CID), resnet.ResNetSmall()), train, test, lr=3e-3)
    assert mlp > 0.9 and small > mlp - 0.03, (small, mlp)
